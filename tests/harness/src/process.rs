//! A child process guard: its own scratch dir holding its log (stdout and
//! stderr together), bounded waits, and a kill on drop (SIGTERM, a short grace,
//! then SIGKILL, then reap) so nothing outlives the test that started it.
//!
//! The scratch dir is removed on drop, except while the thread is panicking
//! or `SLUICE_KEEP_LOGS` is set: then it is kept, so the logs can be read.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// How long a stopped child gets between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(50);
/// How much of a log an error message carries.
const TAIL_LINES: usize = 30;

pub(crate) struct Proc {
    name: &'static str,
    child: Child,
    dir: PathBuf,
    log: PathBuf,
}

/// A fresh, process- and call-unique scratch directory.
pub fn scratch_dir(name: &str) -> anyhow::Result<PathBuf> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("sluice-{name}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

impl Proc {
    /// Spawns `cmd` with stdin closed and stdout/stderr going to `<dir>/<name>.log`.
    /// The guard owns `dir`.
    pub(crate) fn spawn(name: &'static str, mut cmd: Command, dir: PathBuf) -> anyhow::Result<Proc> {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd.spawn().with_context(|| format!("starting {name}: {cmd:?}"))?;
        Ok(Proc { name, child, dir, log })
    }

    /// The child's process id (for reading `/proc/<pid>`).
    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    /// Fault injection: SIGSTOP (`stop`) or SIGCONT: a process that hangs
    /// without closing its connections, then goes on.
    pub(crate) fn signal_stop(&self, stop: bool) {
        let signal = if stop { libc::SIGSTOP } else { libc::SIGCONT };
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) with the pid of our own child, not yet reaped.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// The whole log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of the log, for error messages.
    pub(crate) fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let start = lines.len().saturating_sub(TAIL_LINES);
        format!("--- last lines of {} ---\n{}", self.log.display(), lines[start..].join("\n"))
    }

    /// Polls `ready` until it holds. Fails if the child exits first or the
    /// deadline passes; the error carries the log tail.
    pub(crate) fn wait_ready(
        &mut self,
        within: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited during startup ({status})\n{}", self.name, self.log_tail());
            }
            if ready() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("{} not ready within {within:?}\n{}", self.name, self.log_tail());
            }
            sleep(POLL);
        }
    }

    /// Waits for the child to exit on its own; `None` if it is still running
    /// at the deadline.
    pub(crate) fn wait_exit(&mut self, within: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            sleep(POLL);
        }
    }

    /// SIGTERM, then up to `within` for the child to exit on its own: its
    /// status, or `None` if it still runs (it is left running).
    pub(crate) fn terminate(&mut self, within: Duration) -> anyhow::Result<Option<ExitStatus>> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(Some(status));
        }
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own, not yet reaped child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        self.wait_exit(within)
    }

    /// Fault injection: SIGKILL at once, no grace (a crash), and reap.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, up to [`GRACE`] to exit, then SIGKILL; always reaps.
    fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
                // SAFETY: kill(2) on our own, not yet reaped child.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            if let Ok(None) = self.wait_exit(GRACE) {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() || std::env::var_os("SLUICE_KEEP_LOGS").is_some() {
            eprintln!("{}: logs kept in {}", self.name, self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Runs `start` again (up to 3 tries) when it failed because its port was
/// taken: a port from [`crate::free_port`] can be claimed by someone else
/// before our child binds it.
pub(crate) fn retry_port_clash<T>(mut start: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let mut tries = 1;
    loop {
        match start() {
            Err(err) if tries < 3 && format!("{err:#}").contains("Address already in use") => tries += 1,
            outcome => return outcome,
        }
    }
}
