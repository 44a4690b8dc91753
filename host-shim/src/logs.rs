//! Log lines that clients can reach: at most one a period per site, so an
//! outage or a hostile caller cannot flood the log, and client-controlled
//! values written with `?` (Rust's escaping: quotes, `\n`, `\u{1b}`), never
//! raw, so a value cannot forge a line or a terminal escape.

use std::sync::{Mutex, PoisonError};

use sluice_core::log_throttle::LogThrottle;

/// One log site's throttle, as a `static`.
pub struct Throttled(Mutex<LogThrottle>);

impl Throttled {
    /// At most one line a minute.
    pub const fn per_minute() -> Throttled {
        Throttled(Mutex::new(LogThrottle::new(60_000)))
    }

    /// `Some(lines suppressed since the last one)` if a line may be written now.
    pub fn admit(&self) -> Option<u64> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.0.lock().unwrap_or_else(PoisonError::into_inner).admit(now_ms)
    }
}
