//! The outage breaker: after `failure_threshold` consecutive failed checks a
//! worker stops asking the shim for `cooldown_ms` and applies the failure
//! mode at once, so an outage does not cost every request a timeout. After
//! the cooldown the next requests probe the shim again: one success closes
//! the breaker, one failure opens it for another cooldown.
//!
//! A failure is judged by when its call was *sent*: a call sent before a
//! newer call that the shim answered is old news (it was stuck in the outage
//! the shim has since come out of), and its late failure counts nothing. Else
//! the calls stuck in an outage, timing out one by one after the shim has
//! recovered, would open the breaker again on a healthy shim.
//!
//! One breaker per VM (per Envoy worker). Shared data would let one worker's
//! failures open every worker's breaker, but each worker then still learns of
//! the recovery on its own, and the state would need a cross-worker protocol;
//! per worker it is one small struct, and at most `failure_threshold` failed
//! calls per worker per outage is the whole cost.
//!
//! Plain Rust over an injected clock (milliseconds), tested natively.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Calls go to the shim; `failures` consecutive ones have failed.
    Closed { failures: u32 },
    /// Decide locally until `until_ms`.
    Open { until_ms: u64 },
    /// The cooldown is over: calls go to the shim, and the first answer decides.
    Probing,
}

/// A state change, to be logged once and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Opened,
    Probing,
    Closed,
}

#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cooldown_ms: u64,
    state: State,
    /// When the newest call the shim answered was sent.
    answered_sent_ms: Option<u64>,
}

impl Breaker {
    /// A `threshold` of 0 never opens.
    pub fn new(threshold: u32, cooldown_ms: u64) -> Breaker {
        Breaker { threshold, cooldown_ms, state: State::Closed { failures: 0 }, answered_sent_ms: None }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// Whether a request may call the shim at `now_ms`; a cooldown that has
    /// ended turns into probing.
    pub fn call_allowed(&mut self, now_ms: u64) -> (bool, Option<Change>) {
        match self.state {
            State::Open { until_ms } if now_ms < until_ms => (false, None),
            State::Open { .. } => {
                self.state = State::Probing;
                (true, Some(Change::Probing))
            }
            _ => (true, None),
        }
    }

    /// The shim answered. A late answer to a call sent before the breaker
    /// opened does not close it: the probe after the cooldown decides.
    pub fn success(&mut self, sent_ms: u64) -> Option<Change> {
        self.answered_sent_ms = Some(self.answered_sent_ms.map_or(sent_ms, |at| at.max(sent_ms)));
        match self.state {
            State::Open { .. } => None,
            State::Probing => {
                self.state = State::Closed { failures: 0 };
                Some(Change::Closed)
            }
            State::Closed { .. } => {
                self.state = State::Closed { failures: 0 };
                None
            }
        }
    }

    /// A call sent at `sent_ms` failed at `now_ms`. Nothing changes if the
    /// shim has answered a call sent after it.
    pub fn failure(&mut self, sent_ms: u64, now_ms: u64) -> Option<Change> {
        if self.answered_sent_ms.is_some_and(|answered| sent_ms < answered) {
            return None;
        }
        let open = State::Open { until_ms: now_ms.saturating_add(self.cooldown_ms) };
        match self.state {
            State::Closed { failures } => {
                let failures = failures.saturating_add(1);
                if self.threshold > 0 && failures >= self.threshold {
                    self.state = open;
                    Some(Change::Opened)
                } else {
                    self.state = State::Closed { failures };
                    None
                }
            }
            State::Probing => {
                self.state = open;
                Some(Change::Opened)
            }
            // A call sent before the breaker opened, failing late.
            State::Open { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_the_threshold_and_decides_locally_for_the_cooldown() {
        let mut b = Breaker::new(3, 2000);
        assert_eq!(b.failure(0, 0), None);
        assert_eq!(b.failure(1, 1), None);
        assert_eq!(b.failure(2, 2), Some(Change::Opened));
        assert_eq!(b.call_allowed(3), (false, None));
        assert_eq!(b.call_allowed(2001), (false, None));
        assert_eq!(b.call_allowed(2002), (true, Some(Change::Probing)));
        assert_eq!(b.call_allowed(2003), (true, None));
    }

    #[test]
    fn a_success_resets_the_count_and_closes_a_probe() {
        let mut b = Breaker::new(2, 100);
        assert_eq!(b.failure(0, 0), None);
        assert_eq!(b.success(0), None);
        assert_eq!(b.failure(1, 1), None);
        assert_eq!(b.failure(2, 2), Some(Change::Opened));
        assert_eq!(b.success(2), None, "a late answer does not close it");
        assert_eq!(b.call_allowed(101), (false, None));
        assert_eq!(b.call_allowed(102), (true, Some(Change::Probing)));
        assert_eq!(b.success(102), Some(Change::Closed));
        assert_eq!(b.state(), State::Closed { failures: 0 });
    }

    #[test]
    fn a_failed_probe_opens_again_and_late_failures_change_nothing() {
        let mut b = Breaker::new(1, 100);
        assert_eq!(b.failure(0, 0), Some(Change::Opened));
        assert_eq!(b.failure(5, 5), None);
        assert_eq!(b.state(), State::Open { until_ms: 100 });
        assert_eq!(b.call_allowed(100), (true, Some(Change::Probing)));
        assert_eq!(b.failure(150, 150), Some(Change::Opened));
        assert_eq!(b.state(), State::Open { until_ms: 250 });
    }

    #[test]
    fn a_zero_threshold_never_opens() {
        let mut b = Breaker::new(0, 100);
        for t in 0..100 {
            assert_eq!(b.failure(t, t), None);
        }
        assert_eq!(b.call_allowed(100), (true, None));
    }

    /// The flake this rule mends: calls stuck in an outage time out one by
    /// one after the shim has recovered. Their failures, sent before a call
    /// the shim has since answered, must not open the breaker again.
    #[test]
    fn late_failures_of_calls_sent_before_an_answered_one_count_nothing() {
        let mut b = Breaker::new(3, 500);
        assert_eq!(b.success(1_000), None, "a call sent at 1000 is answered");
        for sent in [400, 500, 600] {
            assert_eq!(b.failure(sent, 1_400), None, "sent at {sent}, before 1000");
        }
        assert_eq!(b.state(), State::Closed { failures: 0 });
        assert_eq!(b.failure(1_001, 1_500), None);
        assert_eq!(b.failure(1_002, 1_500), None);
        assert_eq!(b.failure(1_003, 1_500), Some(Change::Opened), "fresh failures still open it");
    }
}
