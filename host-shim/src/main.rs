//! `sluice`: parses its arguments and runs the subcommand from `sluice_shim`.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    EnvoyConfig(sluice_shim::envoy_config::Args),
    /// Replay an access log through a policy: what would it have done?
    Simulate(sluice_shim::simulate::Args),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Where to listen, for HTTP/1.1 and HTTP/2 cleartext alike.
    #[arg(long, default_value = "127.0.0.1:8181")]
    listen: SocketAddr,
    /// The Redis to keep the limits in.
    #[arg(long, default_value = "redis://127.0.0.1:6379", conflicts_with = "redis_cluster")]
    redis: String,
    /// A Redis Cluster to keep the limits in instead: seed node URLs, comma-separated.
    #[arg(long, value_delimiter = ',')]
    redis_cluster: Vec<String>,
    /// How long one Redis connect or command may take before the check fails.
    #[arg(long, default_value_t = 1000)]
    redis_timeout_ms: u64,
    /// Test mode: honour the explicit `now_us` time in check requests, so tests
    /// can be deterministic. Never use it in production.
    #[arg(long)]
    test_time: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Validate { files } => sluice_shim::validate::run(&files),
        Command::Schema => {
            print!("{}", sluice_policies::schema::document_schema());
            ExitCode::SUCCESS
        }
        Command::EnvoyConfig(args) => print_or_fail(sluice_shim::envoy_config::run(&args)),
        Command::Simulate(args) => print_or_fail(sluice_shim::simulate::run(&args)),
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
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("sluice: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let timeout = std::time::Duration::from_millis(args.redis_timeout_ms);
        let target = if args.redis_cluster.is_empty() {
            sluice_shim::store::Target::Single(args.redis.clone())
        } else {
            sluice_shim::store::Target::Cluster(args.redis_cluster.clone())
        };
        let limiter = sluice_shim::limiter::Limiter::new(&target, timeout, args.test_time)?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
        tracing::info!(listen = %args.listen, redis = ?target, test_time = args.test_time, "sluice shim serving");
        sluice_shim::server::run(listener, limiter, shutdown_signal()).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sluice: {err:#}");
            ExitCode::FAILURE
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
