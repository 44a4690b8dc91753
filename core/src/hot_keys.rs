//! Leased mode per key: which keys of a keyed leased policy are hot enough
//! to pay for a lease, learned by each worker from its own requests, with
//! no shim call. A bounded space-saving counter ([`StreamSummary`], O(1)
//! per request): at most `capacity` keys are counted; a new key takes the
//! place of a least counted one and inherits its count as its possible
//! error, so a key's true count is at least `count - error`. Every
//! `period_ms` all counts halve, so a count follows the key's recent rate:
//! a key with `r` requests a period here counts between `r` and `2r` once
//! steady.
//!
//! A key is hot while `count - error` reaches `threshold`. Leased mode sets
//! the period to the lease's `ttl` and the threshold to a lease's tokens:
//! a key is leased once one worker alone sees about a lease's worth of its
//! requests per `ttl` (between half and one), so its lease is spent before
//! it would go back unused. Every other key (the long tail) is checked by
//! the shim exactly, as without `leased`.
//!
//! **The capacity.** A key's error is at most the stream's length over the
//! capacity, so on a long tail only keys well above that noise turn hot:
//! with 64 counters, on the bench's 100,000 Zipf keys, only the top few
//! dozen did (8.9 % of admissions leased, `core/tests/leased_zipf.rs`'s
//! model 10.2 %); with [`CAPACITY`] (1,024) the model gives 28.5 %. Its
//! cost per request does not grow with it (the stream summary), and its
//! memory is a counter and a key per slot, per worker and keyed leased
//! policy.

use crate::stream_summary::StreamSummary;

/// How many keys each worker counts per leased policy.
pub const CAPACITY: usize = 1024;

#[derive(Debug, Clone)]
pub struct HotKeys {
    counts: StreamSummary,
    period_ms: u64,
    threshold: u64,
    next_halving_ms: u64,
}

impl HotKeys {
    pub fn new(capacity: usize, period_ms: u64, threshold: u64) -> HotKeys {
        HotKeys {
            counts: StreamSummary::new(capacity),
            period_ms: period_ms.max(1),
            threshold: threshold.max(1),
            next_halving_ms: 0,
        }
    }

    /// Counts one request for `key` at `now`; whether the key is hot now.
    pub fn observe(&mut self, key: &str, now: u64) -> bool {
        self.age(now);
        let (count, error) = self.counts.observe(key);
        count - error >= self.threshold
    }

    /// Whether `key` is hot, without counting a request.
    pub fn is_hot(&mut self, key: &str, now: u64) -> bool {
        self.age(now);
        self.counts.get(key).is_some_and(|(count, error)| count - error >= self.threshold)
    }

    /// How many keys are counted: at most the capacity.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Halves every count once per period gone by (the clock stepping back
    /// halves nothing); keys counted down to nothing are dropped.
    fn age(&mut self, now: u64) {
        if self.next_halving_ms == 0 {
            self.next_halving_ms = now.saturating_add(self.period_ms);
            return;
        }
        if now < self.next_halving_ms {
            return;
        }
        let periods = (now - self.next_halving_ms) / self.period_ms + 1;
        self.next_halving_ms = self.next_halving_ms.saturating_add(periods.saturating_mul(self.period_ms));
        self.counts.shift_right(u32::try_from(periods.min(64)).unwrap_or(64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key becomes hot at the threshold, and cools as its counts halve.
    #[test]
    fn hot_at_the_threshold_and_cools_with_time() {
        let mut hot = HotKeys::new(4, 1_000, 3);
        assert!(!hot.observe("a", 0));
        assert!(!hot.observe("a", 10));
        assert!(hot.observe("a", 20));
        assert!(hot.is_hot("a", 999));
        assert!(!hot.is_hot("a", 1_000), "3 halves to 1");
        assert!(!hot.is_hot("a", 5_000));
        assert_eq!(hot.len(), 0, "counted down to nothing, dropped");
    }

    /// The long tail never crowds out a hot key nor grows the table: a key
    /// with more requests than `stream / capacity` always stays counted,
    /// and a new key's inherited count is its error, not a heat.
    #[test]
    fn the_tail_stays_bounded_and_cold() {
        let mut hot = HotKeys::new(8, 1_000_000, 50);
        let mut heavy_hot = false;
        for i in 0..10_000u64 {
            if i % 4 == 0 {
                heavy_hot = hot.observe("heavy", i / 100);
            } else {
                assert!(!hot.observe(&format!("tail{i}"), i / 100), "a tail key is never hot");
            }
            assert!(hot.len() <= 8);
        }
        assert!(heavy_hot, "a quarter of the traffic is hot");
    }
}
