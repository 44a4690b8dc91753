//! `sluice`: parses its arguments and runs the subcommand from `sluice_shim`
//! (serving) or `sluice_cli` (the offline tools).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use sluice_envoy_config::ShimAddress;

#[derive(Parser)]
#[command(name = "sluice", version, about = "Sluice: rate limits for API gateways")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the shim that the filter asks for every decision.
    Serve(ServeArgs),
    /// Check policy documents; prints `FILE: ok` or the error, exits 1 on any error.
    Validate {
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
    /// Print the JSON Schema of the policy document.
    Schema,
    /// Print a complete envoy.yaml that loads the filter with this policy.
    EnvoyConfig(sluice_cli::envoy_config::Args),
    /// Convert an envoyproxy/ratelimit configuration or a Limitador limits
    /// file (YAML) into a policy document for the RLS face, on stdout. What
    /// it cannot carry exactly is listed on stderr, line by line, and no
    /// document is printed (exit 1) unless `--accept-losses`.
    Import {
        file: PathBuf,
        /// The file's format; detected if not given (a map is
        /// envoyproxy/ratelimit's, a list Limitador's).
        #[arg(long, value_enum)]
        from: Option<sluice_cli::import::Format>,
        /// Print the document even though it does not carry the listed
        /// constructs exactly.
        #[arg(long)]
        accept_losses: bool,
        /// Limitador's server setting of the same name (not in its limits
        /// file): with `DRAFT_VERSION_03`, every answer carries draft 03's
        /// `X-RateLimit-*` headers, as Limitador's would.
        #[arg(long, value_enum, default_value = "NONE")]
        rate_limit_headers: sluice_cli::import::RateLimitHeaders,
    },
    /// Replay an access log through a policy: what would it have done?
    Simulate(sluice_cli::simulate::Args),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Where to listen, for HTTP/1.1 and HTTP/2 alike: `HOST:PORT`, or
    /// `unix:/PATH` for a Unix socket (an Envoy on the same host: give
    /// `sluice envoy-config --shim` the same value). The socket file is made
    /// anew at start; who may connect is its directory's permissions.
    #[arg(long, default_value = "127.0.0.1:8181")]
    listen: ShimAddress,
    /// Also serve Envoy's own rate-limit protocols over gRPC on this
    /// address, behind the same TLS options: RLS (`ShouldRateLimit`, for the
    /// native `envoy.filters.http.ratelimit` filter) and RLQS
    /// (`StreamRateLimitQuotas`, for `envoy.filters.http.rate_limit_quota`).
    /// Needs --policy: the shim decides.
    #[arg(long, requires = "policy")]
    grpc_listen: Option<std::net::SocketAddr>,
    /// The Redis to keep the limits in.
    #[arg(long, default_value = "redis://127.0.0.1:6379", conflicts_with = "redis_cluster")]
    redis: String,
    /// A Redis Cluster to keep the limits in instead: seed node URLs, comma-separated.
    #[arg(long, value_delimiter = ',', conflicts_with = "redis_sentinel")]
    redis_cluster: Vec<String>,
    /// Redis behind Sentinel instead: the sentinels, `host:port` or
    /// `redis://host:port`, comma-separated. Needs --sentinel-master.
    #[arg(long, value_delimiter = ',', requires = "sentinel_master", conflicts_with = "redis")]
    redis_sentinel: Vec<String>,
    /// The name of the master the sentinels watch (`sentinel monitor NAME ...`).
    #[arg(long, requires = "redis_sentinel")]
    sentinel_master: Option<String>,
    /// How long one Redis connect or command may take before the check fails.
    #[arg(long, default_value_t = 1000)]
    redis_timeout_ms: u64,
    /// Threads that serve requests (default: one per core). On a host the
    /// shim shares with Envoy and Redis, `1` spends less CPU per decision
    /// (no wake-ups across threads) and serves at most one core's worth.
    #[arg(long)]
    threads: Option<std::num::NonZeroUsize>,
    /// How the threads take connections: `shared`, one listener and one
    /// Redis connection for a runtime whose threads hand work to each other;
    /// `per-thread`, a listener on `--listen` (`SO_REUSEPORT`), a runtime and
    /// a Redis connection for each of `--threads` threads, fewer system calls
    /// and less CPU per decision (a TCP `--listen` only).
    #[arg(long, value_enum, default_value = "shared")]
    listeners: Listeners,
    /// PEM file of the CA certificates that sign Redis's TLS certificate, for
    /// `rediss://` URLs; without it, the system's roots.
    #[arg(long)]
    redis_ca: Option<PathBuf>,
    /// Test mode: honour the explicit `now_us` time in check requests, so tests
    /// can be deterministic. Never use it in production.
    #[arg(long)]
    test_time: bool,
    /// Mutual TLS: the shim's certificate chain (PEM). Needs --tls-key and --client-ca.
    #[arg(long, requires_all = ["tls_key", "client_ca"])]
    tls_cert: Option<PathBuf>,
    /// Mutual TLS: the shim's private key (PEM).
    #[arg(long, requires_all = ["tls_cert", "client_ca"])]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: the CA certificates (PEM) that sign the clients' (Envoy's)
    /// certificates; a client without one is refused.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    client_ca: Option<PathBuf>,
    /// The most connections served at once; more wait until one closes.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_connections: u32,
    /// How long a new connection may take for its first bytes or TLS handshake,
    /// and an HTTP/1.1 request for its headers.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    header_read_timeout_ms: u64,
    /// The policy document, so the dashboard at `/` shows every policy and
    /// its limits before traffic arrives; refused if it does not parse.
    /// SIGHUP reads it again (a document that does not parse is logged and
    /// the loaded one kept).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// On SIGTERM, how long to keep accepting and serving while `/healthz`
    /// answers 503 `draining`, so health checks (Envoy's, a Kubernetes
    /// readiness probe) take the shim out of rotation first.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    drain_delay_ms: u64,
    /// Then, the longest the drain takes: the calls in flight are answered, a
    /// waiting request is served if its slot comes in time, else refused with
    /// a retry-after and its reservation given back.
    #[arg(long, default_value_t = sluice_shim::server::DRAIN_TIMEOUT.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    drain_timeout_ms: u64,
    /// Serve the dashboard (`/`, `/dashboard.json`, `/playground/`) and
    /// `/metrics` only on this address, not on `--listen`.
    #[arg(long)]
    admin_listen: Option<std::net::SocketAddr>,
    /// Require `Authorization: Bearer <token>` on the dashboard and
    /// `/metrics`, the token being this file's content (trimmed).
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// How long a request may take to send its body once its headers came;
    /// a slower client gets 408 and its connection closed.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    body_read_timeout_ms: u64,
    /// The playground's built files, served at `/playground/`.
    /// [default: `playground/` beside this binary, e.g. `dist/playground`]
    #[arg(long)]
    playground: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Listeners {
    Shared,
    PerThread,
}

/// mimalloc rather than the system allocator: a decision allocates a few
/// dozen small blocks (HTTP, JSON, the Redis reply), and glibc's malloc and
/// free were a fifth of the shim's instructions per decision
/// (docs/performance.md, "Levers measured").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Validate { files } => sluice_cli::validate::run(&files),
        Command::Schema => {
            print!("{}", sluice_policies::schema::document_schema());
            ExitCode::SUCCESS
        }
        Command::EnvoyConfig(args) => print_or_fail(sluice_cli::envoy_config::run(&args)),
        Command::Simulate(args) => simulate(&args),
        Command::Import { file, from, accept_losses, rate_limit_headers } => {
            import(&file, from, accept_losses, rate_limit_headers)
        }
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let per_thread = args.listeners == Listeners::PerThread;
    let threads =
        args.threads.map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()), |n| n.get());
    // Per thread, this runtime is the first listener's thread.
    let mut runtime = if per_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut runtime = tokio::runtime::Builder::new_multi_thread();
        runtime.worker_threads(threads);
        runtime
    };
    let runtime = match runtime.enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("sluice: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let timeout = std::time::Duration::from_millis(args.redis_timeout_ms);
        let target = match (&args.sentinel_master, args.redis_cluster.is_empty()) {
            (Some(master), _) => sluice_shim::store::Target::Sentinel {
                sentinels: args.redis_sentinel.clone(),
                master: master.clone(),
            },
            (None, true) => sluice_shim::store::Target::Single(args.redis.clone()),
            (None, false) => sluice_shim::store::Target::Cluster(args.redis_cluster.clone()),
        };
        let ca = match &args.redis_ca {
            Some(path) => Some(
                std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read --redis-ca {}: {e}", path.display()))?,
            ),
            None => None,
        };
        let how = sluice_shim::store::Connect { target: &target, timeout, ca };
        let limiter = sluice_shim::limiter::Limiter::connect(&how, args.test_time)?;
        let tls = match (&args.tls_cert, &args.tls_key, &args.client_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(sluice_shim::tls::server_config(cert, key, ca)?),
            _ => None,
        };
        let document = args.policy.as_deref().map(sluice_cli::validate::read).transpose()?.map(Arc::new);
        let policies: sluice_shim::dashboard::Policies = document.clone().into();
        let reloaded = policies.clone();
        if let Some(path) = &args.policy {
            tokio::spawn(reload_on_sighup(path.clone(), policies.clone()));
        }
        let dashboard = sluice_shim::dashboard::Options {
            policies,
            playground: args.playground.clone().or_else(sluice_shim::dashboard::playground::beside_binary),
        };
        let admin = sluice_shim::admin::Options {
            listener: match args.admin_listen {
                Some(addr) => Some(Arc::new(
                    std::net::TcpListener::bind(addr)
                        .map_err(|e| anyhow::anyhow!("cannot listen on --admin-listen {addr}: {e}"))?,
                )),
                None => None,
            },
            token: args.admin_token_file.as_deref().map(sluice_shim::admin::Token::read).transpose()?,
        };
        if let Some(addr) = args.admin_listen {
            tracing::info!(admin_listen = %addr, token = admin.token.is_some(), "dashboard and /metrics served only here");
        }
        let options = sluice_shim::server::Options {
            dashboard,
            admin,
            body_read_timeout: std::time::Duration::from_millis(args.body_read_timeout_ms),
            tls,
            max_connections: args.max_connections as usize,
            header_read_timeout: std::time::Duration::from_millis(args.header_read_timeout_ms),
            drain_delay: std::time::Duration::from_millis(args.drain_delay_ms),
            drain_timeout: std::time::Duration::from_millis(args.drain_timeout_ms),
            give_back_time: timeout,
        };
        let (listener, more) = match (per_thread, &args.listen) {
            (false, listen) => (bind(listen).await?, Vec::new()),
            (true, ShimAddress::Tcp(addr)) => {
                let mut listeners = sluice_shim::threads::bind(*addr, threads)
                    .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
                let first = tokio::net::TcpListener::from_std(listeners.remove(0))?;
                (first.into(), listeners)
            }
            (true, ShimAddress::Unix(_)) => anyhow::bail!("--listeners per-thread needs a TCP --listen"),
        };
        let auth = if options.tls.is_some() { "mtls" } else { "none" };
        tracing::info!(listen = %args.listen, redis = %target, auth, test_time = args.test_time, listeners = more.len() + 1, "sluice shim serving");
        if let ShimAddress::Tcp(addr) = args.listen {
            if options.tls.is_none() && !addr.ip().is_loopback() {
                tracing::warn!(
                    listen = %args.listen,
                    "listening without authentication on a non-loopback address: anyone who reaches this port can refill buckets and release leases; use --tls-cert, --tls-key and --client-ca"
                );
            }
        }
        let limiter = std::sync::Arc::new(limiter);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = stop.send(true);
        });
        let until_stopped = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            }
        };
        let grpc = match (args.grpc_listen, document) {
            (Some(addr), Some(document)) => {
                let grpc_listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot listen on --grpc-listen {addr}: {e}"))?;
                let faces = sluice_shim::grpc::Faces::reloading(limiter.clone(), reloaded.clone(), document);
                tracing::info!(grpc_listen = %addr, auth, "sluice gRPC faces serving (RLS and RLQS)");
                let app = sluice_shim::grpc::router(faces);
                let options = options.clone();
                let until = until_stopped();
                let drain = limiter.drain().clone();
                Some(tokio::spawn(sluice_shim::server::serve(grpc_listener, app, options, until, drain, None)))
            }
            _ => None,
        };
        let redis = sluice_shim::threads::Redis { target: target.clone(), timeout, ca: how.ca.clone() };
        let more = sluice_shim::threads::spawn(more, &limiter, &redis, &options, until_stopped.clone())?;
        // On an error here the process exits, and the other listeners' threads with it.
        sluice_shim::server::run_shared(listener, limiter, options, until_stopped()).await?;
        tokio::task::spawn_blocking(move || sluice_shim::threads::join(more))
            .await
            .map_err(|e| anyhow::anyhow!("a listener's thread: {e}"))??;
        match grpc {
            Some(task) => task.await.map_err(|e| anyhow::anyhow!("the gRPC listener stopped: {e}"))?,
            None => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sluice: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Listens on `--listen`. A Unix socket's file left by a shim that stopped
/// is removed first (only a socket: any other file there is an error).
async fn bind(listen: &ShimAddress) -> anyhow::Result<sluice_shim::server::Listener> {
    let cannot = |e: std::io::Error| anyhow::anyhow!("cannot listen on {listen}: {e}");
    match listen {
        ShimAddress::Tcp(addr) => Ok(tokio::net::TcpListener::bind(addr).await.map_err(cannot)?.into()),
        ShimAddress::Unix(path) => {
            use std::os::unix::fs::FileTypeExt;
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                std::fs::remove_file(path).map_err(cannot)?;
            }
            Ok(tokio::net::UnixListener::bind(path).map_err(cannot)?.into())
        }
    }
}

fn print_or_fail(result: anyhow::Result<String>) -> ExitCode {
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("sluice: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Prints the document, and each loss on stderr; with losses, exits 1
/// without the document unless they are accepted.
fn import(
    file: &std::path::Path,
    from: Option<sluice_cli::import::Format>,
    accept_losses: bool,
    headers: sluice_cli::import::RateLimitHeaders,
) -> ExitCode {
    match sluice_cli::import::run(file, from).and_then(|imported| imported.with_rate_limit_headers(headers)) {
        Ok(imported) => {
            for loss in &imported.losses {
                eprintln!("sluice import: {}: {loss}", file.display());
            }
            if !imported.losses.is_empty() && !accept_losses {
                eprintln!(
                    "sluice import: {}: {} construct(s) not carried exactly: no document printed; pass --accept-losses to print it anyway",
                    file.display(),
                    imported.losses.len()
                );
                return ExitCode::FAILURE;
            }
            match serde_json::to_string_pretty(&imported.document) {
                Ok(text) => {
                    println!("{text}");
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("sluice: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(err) => {
            eprintln!("sluice: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Prints the report; exits 2 when it had to skip bad lines (the report
/// stands for the lines read), 1 when nothing could be replayed.
fn simulate(args: &sluice_cli::simulate::Args) -> ExitCode {
    match sluice_cli::simulate::run(args, &mut std::io::stderr()) {
        Ok(simulated) => {
            print!("{}", simulated.report);
            if simulated.bad_lines > 0 {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(err) => {
            eprintln!("sluice: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// On each SIGHUP, reads the `--policy` document again: the dashboard lists
/// the new one. One that does not read or parse is refused (logged) and the
/// one loaded stays. Decisions never depend on it: each check carries its
/// limits from the filter.
async fn reload_on_sighup(path: PathBuf, policies: sluice_shim::dashboard::Policies) {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hup) => hup,
        Err(err) => {
            tracing::warn!(%err, "cannot watch SIGHUP; the policy document is not reloaded");
            return;
        }
    };
    while hup.recv().await.is_some() {
        match sluice_cli::validate::read(&path) {
            Ok(document) => {
                let count = document.policies.len();
                policies.set(document);
                tracing::info!(path = %path.display(), policies = count, "policy document reloaded");
            }
            Err(err) => {
                tracing::error!(%err, "policy document not reloaded; keeping the one loaded");
            }
        }
    }
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(err) => {
            tracing::warn!(%err, "cannot watch SIGTERM; only SIGINT stops the shim");
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
