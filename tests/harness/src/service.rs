//! Any server binary as a guarded child process on a free loopback port, for
//! helpers that are not part of Sluice (the bench's responder). Ready once the
//! port accepts connections.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::paths::free_port;
use crate::probe::listening;
use crate::process::{retry_port_clash, scratch_dir, Proc};

const STARTUP: Duration = Duration::from_secs(15);

pub struct Service {
    pub port: u16,
    proc: Proc,
}

impl Service {
    /// Starts `bin` with the arguments `args(port)` for a free `port`, and
    /// waits until something listens there.
    pub fn start(
        name: &'static str,
        bin: &Path,
        args: impl Fn(u16) -> Vec<String>,
    ) -> anyhow::Result<Service> {
        retry_port_clash(|| {
            let port = free_port()?;
            let mut cmd = Command::new(bin);
            cmd.args(args(port));
            let mut proc = Proc::spawn(name, cmd, scratch_dir(name)?)?;
            proc.wait_ready(STARTUP, || listening(port))?;
            Ok(Service { port, proc })
        })
    }

    /// The process id, e.g. to read its CPU time in `/proc`.
    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// The process's output so far.
    pub fn log(&self) -> String {
        self.proc.log()
    }
}
