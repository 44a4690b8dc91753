//! A private `redis-server` on a free loopback port, persistence off, its
//! working dir in its scratch dir. Never touches a system instance.
//!
//! For fault injection it can crash ([`Redis::kill`]) and come back on the
//! same port ([`Redis::start_again`]), empty: persistence is off, so the
//! counters and the script cache are gone.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::paths::{binary, free_port};
use crate::probe::{listening, redis_ping};
use crate::process::{retry_port_clash, scratch_dir, Proc};

const STARTUP: Duration = Duration::from_secs(10);

pub struct Redis {
    pub port: u16,
    proc: Proc,
}

impl Redis {
    /// Starts redis-server and waits until it answers PING.
    pub fn start() -> anyhow::Result<Redis> {
        retry_port_clash(Redis::start_once)
    }

    fn start_once() -> anyhow::Result<Redis> {
        let port = free_port()?;
        Ok(Redis { port, proc: spawn(port)? })
    }

    /// Fault injection: SIGKILL, as a crash; the port refuses connections until
    /// [`Redis::start_again`].
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Fault injection: the server hangs (SIGSTOP), its connections open and
    /// unanswered, as a Redis stalled by a slow command or a busy host,
    /// until [`Redis::resume`].
    pub fn pause(&self) {
        self.proc.signal_stop(true);
    }

    /// Ends a [`Redis::pause`]: the server answers what queued meanwhile.
    pub fn resume(&self) {
        self.proc.signal_stop(false);
    }

    /// Starts a fresh, empty redis-server on the same port (after [`Redis::kill`])
    /// and waits until it answers PING.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        self.proc.kill();
        self.proc = spawn(self.port)?;
        Ok(())
    }

    /// Starts redis-server speaking only TLS (with `cert` and `key`, PEM),
    /// without client certificates, requiring `password` (AUTH). Ready once
    /// its port accepts connections.
    pub fn start_tls(cert: &Path, key: &Path, password: &str) -> anyhow::Result<Redis> {
        retry_port_clash(|| {
            let bin = binary("SLUICE_REDIS_SERVER", "redis-server")?;
            let port = free_port()?;
            let dir = scratch_dir("redis-tls")?;
            let mut cmd = Command::new(bin);
            cmd.args(["--port", "0", "--tls-port", &port.to_string()]);
            cmd.arg("--tls-cert-file").arg(cert).arg("--tls-key-file").arg(key);
            cmd.arg("--tls-ca-cert-file").arg(cert).args(["--tls-auth-clients", "no"]);
            cmd.args(["--requirepass", password]);
            cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
            cmd.arg("--dir").arg(&dir);
            let mut proc = Proc::spawn("redis-server", cmd, dir)?;
            proc.wait_ready(STARTUP, || listening(port))?;
            Ok(Redis { port, proc })
        })
    }

    /// `redis://127.0.0.1:PORT`
    /// redis-server's process id, e.g. to read its CPU time in `/proc`.
    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `unix:///PATH`: the same server on its Unix socket, beside the port.
    pub fn unix_url(&self) -> String {
        format!("unix://{}", unix_socket(self.port).display())
    }

    /// A blocking connection, for tests that inspect the stored state.
    pub fn connection(&self) -> anyhow::Result<redis::Connection> {
        Ok(redis::Client::open(self.url())?.get_connection()?)
    }

    /// Fault injection: the default user may no longer run scripts or
    /// functions (EVAL, EVALSHA, FCALL), so every
    /// check fails at once (the shim answers 503) while Redis stays up.
    pub fn refuse_scripts(&self) -> anyhow::Result<()> {
        self.acl(&["-evalsha", "-eval", "-fcall"])
    }

    /// Undoes [`Redis::refuse_scripts`].
    pub fn allow_scripts(&self) -> anyhow::Result<()> {
        self.acl(&["+@all"])
    }

    fn acl(&self, rules: &[&str]) -> anyhow::Result<()> {
        let mut conn = self.connection()?;
        Ok(redis::cmd("ACL").arg("SETUSER").arg("default").arg(rules).query(&mut conn)?)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.proc.log()
    }
}

fn spawn(port: u16) -> anyhow::Result<Proc> {
    let bin = binary("SLUICE_REDIS_SERVER", "redis-server")?;
    let dir = scratch_dir("redis")?;
    let mut cmd = Command::new(bin);
    cmd.arg("--port").arg(port.to_string());
    cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
    cmd.arg("--dir").arg(&dir);
    cmd.arg("--unixsocket").arg(unix_socket(port)).args(["--unixsocketperm", "700"]);
    let mut proc = Proc::spawn("redis-server", cmd, dir)?;
    proc.wait_ready(STARTUP, || redis_ping(port))?;
    Ok(proc)
}

/// The server's Unix socket: named by its port, which is unique while it runs.
fn unix_socket(port: u16) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("sluice-redis-{port}.sock"))
}
