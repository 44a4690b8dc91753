//! A log line that an outage cannot turn into a flood: at most one line per
//! period, and the next line that gets through says how many were suppressed.
//!
//! Plain Rust over an injected clock (milliseconds), tested natively.

#[derive(Debug)]
pub struct LogThrottle {
    period_ms: u64,
    next_ms: u64,
    suppressed: u64,
}

impl LogThrottle {
    pub const fn new(period_ms: u64) -> LogThrottle {
        LogThrottle { period_ms, next_ms: 0, suppressed: 0 }
    }

    /// `Some(suppressed since the last line)` if a line may be written at `now_ms`.
    pub fn admit(&mut self, now_ms: u64) -> Option<u64> {
        if now_ms < self.next_ms {
            self.suppressed += 1;
            return None;
        }
        self.next_ms = now_ms.saturating_add(self.period_ms);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_then_the_count_of_the_rest() {
        let mut t = LogThrottle::new(10_000);
        assert_eq!(t.admit(5), Some(0));
        assert_eq!(t.admit(6), None);
        assert_eq!(t.admit(10_004), None);
        assert_eq!(t.admit(10_005), Some(2));
        assert_eq!(t.admit(20_005), Some(0));
    }
}
