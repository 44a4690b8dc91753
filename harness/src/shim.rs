//! The native shim, `dist/sluice serve`, on a free loopback port, pointed at
//! a Redis or a Redis Cluster. Ready once `GET /healthz` answers 200.
//!
//! For fault injection it can crash ([`Shim::kill`]) and come back on the
//! same port with the same arguments ([`Shim::start_again`]).

use std::process::Command;
use std::time::Duration;

use crate::paths::{dist, free_port};
use crate::probe::http_get;
use crate::process::{retry_port_clash, scratch_dir, Proc};

const STARTUP: Duration = Duration::from_secs(15);

pub struct Shim {
    pub port: u16,
    /// Where the limits live: `--redis URL` or `--redis-cluster URL,URL,...`.
    store: [String; 2],
    proc: Proc,
}

impl Shim {
    /// Starts `sluice serve --listen 127.0.0.1:PORT --redis URL` and waits for `/healthz`.
    pub fn start(redis_url: &str) -> anyhow::Result<Shim> {
        Shim::start_with(["--redis".into(), redis_url.into()])
    }

    /// Starts `sluice serve --redis-cluster URL,...` (the seed nodes) and waits for `/healthz`.
    pub fn start_cluster(seed_urls: &[String]) -> anyhow::Result<Shim> {
        Shim::start_with(["--redis-cluster".into(), seed_urls.join(",")])
    }

    fn start_with(store: [String; 2]) -> anyhow::Result<Shim> {
        retry_port_clash(|| {
            let port = free_port()?;
            let proc = spawn(port, &store)?;
            Ok(Shim { port, store: store.clone(), proc })
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
            Ok(Shim { port, store: ["--redis".into(), redis_url.into()], proc })
        })
    }
}

fn spawn(port: u16, store: &[String; 2]) -> anyhow::Result<Proc> {
    let bin = dist("sluice")?;
    let mut cmd = Command::new(bin);
    cmd.arg("serve").arg("--listen").arg(format!("127.0.0.1:{port}"));
    cmd.args(store);
    let mut proc = Proc::spawn("sluice-shim", cmd, scratch_dir("shim")?)?;
    proc.wait_ready(STARTUP, || matches!(http_get(port, "/healthz"), Some((200, _))))?;
    Ok(proc)
}
