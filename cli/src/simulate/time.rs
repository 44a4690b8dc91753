//! A log line's time: RFC 3339 (`%START_TIME%`), as every shape writes it.

use std::time::UNIX_EPOCH;

use super::unreadable::Unreadable;

/// An RFC 3339 time (`%START_TIME%`) in microseconds since the epoch.
pub(crate) fn rfc3339_us(time: &str) -> Result<u64, Unreadable> {
    let at =
        humantime::parse_rfc3339_weak(time).map_err(|e| Unreadable::new(format!("time {time:?}: {e}")))?;
    let since = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| Unreadable::new(format!("time {time:?} is before 1970")))?;
    u64::try_from(since.as_micros()).map_err(|_| Unreadable::new(format!("time {time:?} is out of range")))
}
