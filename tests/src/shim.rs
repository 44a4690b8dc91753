//! The native shim, `dist/sluice serve`, on a free loopback port, pointed at
//! a Redis. Ready once `GET /healthz` answers 200.

use std::process::Command;
use std::time::Duration;

use crate::paths::{dist, free_port};
use crate::probe::http_get;
use crate::process::{retry_port_clash, scratch_dir, Proc};

const STARTUP: Duration = Duration::from_secs(15);

pub struct Shim {
    pub port: u16,
    proc: Proc,
}

impl Shim {
    /// Starts `sluice serve --listen 127.0.0.1:PORT --redis URL` and waits for `/healthz`.
    pub fn start(redis_url: &str) -> anyhow::Result<Shim> {
        retry_port_clash(|| Shim::start_once(redis_url))
    }

    fn start_once(redis_url: &str) -> anyhow::Result<Shim> {
        let bin = dist("sluice")?;
        let port = free_port()?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve").arg("--listen").arg(format!("127.0.0.1:{port}"));
        cmd.arg("--redis").arg(redis_url);
        let mut proc = Proc::spawn("sluice-shim", cmd, scratch_dir("shim")?)?;
        proc.wait_ready(STARTUP, || matches!(http_get(port, "/healthz"), Some((200, _))))?;
        Ok(Shim { port, proc })
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
            Ok(Shim { port, proc })
        })
    }
}
