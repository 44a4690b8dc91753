//! Progress on stderr while a long log is read: lines read and lines per
//! second, rewritten in place about twice a second, only when stderr is a
//! terminal (never into a file or a pipe a tool reads).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub(crate) struct Progress {
    on: bool,
    started: Instant,
    shown: Instant,
}

/// Lines between looks at the clock.
const EVERY: usize = 1 << 14;
const INTERVAL: Duration = Duration::from_millis(500);

impl Progress {
    pub(crate) fn new() -> Progress {
        let now = Instant::now();
        Progress { on: std::io::stderr().is_terminal(), started: now, shown: now }
    }

    /// After each line, with how many have been read.
    pub(crate) fn line(&mut self, lines: usize) {
        if !self.on || !lines.is_multiple_of(EVERY) {
            return;
        }
        let now = Instant::now();
        if now.duration_since(self.shown) >= INTERVAL {
            self.shown = now;
            let rate = lines as f64 / now.duration_since(self.started).as_secs_f64().max(1e-3);
            let _ = write!(std::io::stderr(), "\r{lines} lines read, {rate:.0} lines/s ");
        }
    }

    /// Clears the progress line, if one was shown.
    pub(crate) fn finish(&self) {
        if self.on && self.shown != self.started {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}
