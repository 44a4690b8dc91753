//! The native shim, `dist/sluice serve`, on a free loopback port, pointed at
//! a Redis or a Redis Cluster. Ready once `GET /healthz` answers 200.
//!
//! For fault injection it can crash ([`Shim::kill`]) and come back on the
//! same port with the same arguments ([`Shim::start_again`]).

use std::process::Command;
use std::time::Duration;

use sluice_envoy_config::ShimAddress;

use crate::paths::{dist, free_port};
use crate::probe::http_get;
use crate::process::{retry_port_clash, scratch_dir, Proc};

const STARTUP: Duration = Duration::from_secs(15);

pub struct Shim {
    pub port: u16,
    /// Where the limits live (`--redis URL`, `--redis-cluster URL,URL,...`,
    /// `--redis-sentinel ... --sentinel-master NAME`) and any other arguments.
    store: Vec<String>,
    /// Its Unix socket, when started with [`Shim::start_unix`].
    socket: Option<std::path::PathBuf>,
    proc: Proc,
}

impl Shim {
    /// Starts `sluice serve --listen 127.0.0.1:PORT --redis URL` and waits for `/healthz`.
    pub fn start(redis_url: &str) -> anyhow::Result<Shim> {
        Shim::start_with(vec!["--redis".into(), redis_url.into()])
    }

    /// Starts `sluice serve --redis-cluster URL,...` (the seed nodes) and waits for `/healthz`.
    pub fn start_cluster(seed_urls: &[String]) -> anyhow::Result<Shim> {
        Shim::start_with(vec!["--redis-cluster".into(), seed_urls.join(",")])
    }

    /// Starts `sluice serve` with `args` (where the limits live, and any
    /// other option) and waits for `/healthz`; [`Shim::start_again`] and
    /// [`Shim::restart`] use the same arguments.
    pub fn start_args(args: &[&str]) -> anyhow::Result<Shim> {
        Shim::start_with(args.iter().map(|a| a.to_string()).collect())
    }

    fn start_with(store: Vec<String>) -> anyhow::Result<Shim> {
        retry_port_clash(|| {
            let port = free_port()?;
            let proc = spawn(port, &store)?;
            Ok(Shim { port, socket: None, store: store.clone(), proc })
        })
    }

    /// Fault injection: SIGKILL, as a crash; the port refuses connections until
    /// [`Shim::start_again`].
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Starts the shim again on the same port with the same store (after
    /// [`Shim::kill`]) and waits for `/healthz`.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        self.proc.kill();
        self.proc = spawn(self.port, &self.store)?;
        Ok(())
    }

    /// SIGTERM, as an orchestrator stops it: the shim drains and exits by
    /// itself. Its exit status, or an error if it still runs after `within`
    /// (then it is killed).
    pub fn terminate(&mut self, within: Duration) -> anyhow::Result<std::process::ExitStatus> {
        match self.proc.terminate(within)? {
            Some(status) => Ok(status),
            None => {
                self.proc.kill();
                anyhow::bail!("the shim did not exit within {within:?} of SIGTERM\n{}", self.proc.log_tail())
            }
        }
    }

    /// Starts the shim again on the same port with the same arguments after
    /// it exited ([`Shim::terminate`]), and waits for `/healthz`.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.start_again()
    }

    /// Starts `sluice serve --listen unix:/PATH --redis URL` (a Unix socket
    /// in its scratch dir, as for an Envoy beside it) and waits for
    /// `/healthz` on the socket. Its `port` is 0; [`Shim::address`] names it.
    pub fn start_unix(redis_url: &str) -> anyhow::Result<Shim> {
        let dir = scratch_dir("shim")?;
        let path = dir.join("shim.sock");
        let mut cmd = Command::new(dist("sluice")?);
        cmd.arg("serve").arg("--listen").arg(ShimAddress::Unix(path.clone()).to_string());
        cmd.arg("--redis").arg(redis_url);
        let mut proc = Proc::spawn("sluice-shim", cmd, dir)?;
        proc.wait_ready(STARTUP, || {
            matches!(crate::probe::unix_http_get(&path, "/healthz"), Some((200, _)))
        })?;
        Ok(Shim { port: 0, socket: Some(path), store: vec!["--redis".into(), redis_url.into()], proc })
    }

    /// Where Envoy reaches this shim: its Unix socket, or `127.0.0.1:port`.
    pub fn address(&self) -> ShimAddress {
        match &self.socket {
            Some(path) => ShimAddress::Unix(path.clone()),
            None => ShimAddress::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], self.port))),
        }
    }

    /// The shim's `GET /metrics` page.
    pub fn metrics(&self) -> anyhow::Result<String> {
        match http_get(self.port, "/metrics") {
            Some((200, page)) => Ok(page),
            other => anyhow::bail!("GET /metrics: {other:?}"),
        }
    }

    /// The shim's process id, e.g. to read its memory and open files in `/proc`.
    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// The shim's log (its stderr) so far.
    pub fn log(&self) -> String {
        self.proc.log()
    }

    /// Starts `sluice serve --redis URL` with `args` added (e.g. `--tls-cert
    /// ...`). A shim with TLS is ready once it listens: the probe speaks
    /// cleartext.
    pub fn start_with_args(redis_url: &str, args: &[&std::ffi::OsStr]) -> anyhow::Result<Shim> {
        retry_port_clash(|| {
            let port = free_port()?;
            let mut cmd = Command::new(dist("sluice")?);
            cmd.arg("serve").arg("--listen").arg(format!("127.0.0.1:{port}"));
            cmd.arg("--redis").arg(redis_url).args(args);
            let tls = args.iter().any(|a| *a == "--tls-cert");
            let mut proc = Proc::spawn("sluice-shim", cmd, scratch_dir("shim")?)?;
            proc.wait_ready(STARTUP, || {
                if tls {
                    crate::probe::listening(port)
                } else {
                    matches!(http_get(port, "/healthz"), Some((200, _)))
                }
            })?;
            // `start_again` restarts it without `args`.
            Ok(Shim { port, socket: None, store: vec!["--redis".into(), redis_url.into()], proc })
        })
    }
}

/// A shim that also serves the gRPC faces: `sluice serve --grpc-listen`.
pub struct GrpcShim {
    pub shim: Shim,
    /// The gRPC listener (`--grpc-listen`).
    pub grpc_port: u16,
    /// The policy document it reads (`--policy`).
    policy: std::path::PathBuf,
    redis_url: String,
}

impl GrpcShim {
    /// Starts `sluice serve --grpc-listen 127.0.0.1:PORT --policy FILE` with
    /// `policy_json` written to FILE, and waits for `/healthz` and the gRPC port.
    pub fn start(redis_url: &str, policy_json: &str) -> anyhow::Result<GrpcShim> {
        let dir = scratch_dir("grpc-shim")?;
        let policy = dir.join("policy.json");
        std::fs::write(&policy, policy_json)?;
        retry_port_clash(|| {
            let grpc_port = free_port()?;
            let grpc = format!("127.0.0.1:{grpc_port}");
            let args = ["--grpc-listen".as_ref(), grpc.as_ref(), "--policy".as_ref(), policy.as_os_str()];
            let shim = Shim::start_with_args(redis_url, &args)?;
            let deadline = std::time::Instant::now() + STARTUP;
            while !crate::probe::listening(grpc_port) {
                if std::time::Instant::now() > deadline {
                    anyhow::bail!("the shim's gRPC listener did not open\n{}", shim.log());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(GrpcShim { shim, grpc_port, policy: policy.clone(), redis_url: redis_url.to_string() })
        })
    }

    /// The shim's `GET /metrics` page.
    pub fn metrics(&self) -> anyhow::Result<String> {
        self.shim.metrics()
    }

    /// Writes `policy_json` over its document and sends SIGHUP: the shim
    /// reads it again.
    pub fn reload(&self, policy_json: &str) -> anyhow::Result<()> {
        std::fs::write(&self.policy, policy_json)?;
        let pid = libc::pid_t::try_from(self.shim.pid())?;
        // SAFETY: kill(2) with a pid this harness spawned and owns.
        if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
            anyhow::bail!("SIGHUP to the shim failed: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Starts the shim again on the same ports and document, after
    /// [`Shim::kill`] (of `self.shim`).
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        let grpc = format!("127.0.0.1:{}", self.grpc_port);
        let args = ["--grpc-listen".as_ref(), grpc.as_ref(), "--policy".as_ref(), self.policy.as_os_str()];
        let port = self.shim.port;
        let mut cmd = Command::new(dist("sluice")?);
        cmd.arg("serve").arg("--listen").arg(format!("127.0.0.1:{port}"));
        cmd.arg("--redis").arg(&self.redis_url).args(args);
        let mut proc = Proc::spawn("sluice-shim", cmd, scratch_dir("shim")?)?;
        proc.wait_ready(STARTUP, || matches!(http_get(port, "/healthz"), Some((200, _))))?;
        self.shim = Shim { port, socket: None, store: vec!["--redis".into(), self.redis_url.clone()], proc };
        Ok(())
    }
}

fn spawn(port: u16, store: &[String]) -> anyhow::Result<Proc> {
    let bin = dist("sluice")?;
    let mut cmd = Command::new(bin);
    cmd.arg("serve").arg("--listen").arg(format!("127.0.0.1:{port}"));
    cmd.args(store);
    let mut proc = Proc::spawn("sluice-shim", cmd, scratch_dir("shim")?)?;
    proc.wait_ready(STARTUP, || matches!(http_get(port, "/healthz"), Some((200, _))))?;
    Ok(proc)
}
