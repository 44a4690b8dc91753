//! The partner's own limits, alone over an injected clock: every decision
//! takes `now` (time since the partner started), so the rules are unit-tested
//! with exact times and the server only supplies its clock.
//!
//! Per key (the account header), all or nothing, like a real partner's:
//! - a sliding window admits a call at `now` while fewer than `limit`
//!   admitted calls arrived in `(now - window, now]`: a call admitted at `s`
//!   counts while `now < s + window` (Sluice's own definition);
//! - an interval admits a call once `every` has passed since the last
//!   admitted one (`now - last >= every`);
//! - a concurrency limit admits while fewer than `max` admitted calls are
//!   still being answered.
//!
//! A refused call counts against nothing.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// One sliding window: at most `limit` calls in any interval `window` long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub limit: u32,
    pub window: Duration,
}

/// What the partner enforces, per key. Build with the chained setters:
/// `Limits::default().window(25, secs(5)).window(300, secs(60))`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub windows: Vec<Window>,
    pub interval: Option<Duration>,
    pub concurrency: Option<u32>,
}

impl Limits {
    pub fn window(mut self, limit: u32, window: Duration) -> Limits {
        self.windows.push(Window { limit, window });
        self
    }

    pub fn interval(mut self, every: Duration) -> Limits {
        self.interval = Some(every);
        self
    }

    pub fn concurrency(mut self, max: u32) -> Limits {
        self.concurrency = Some(max);
        self
    }

    /// When each of `calls` calls would arrive if every one came as early as
    /// the time-based limits allow, the first at 0 (concurrency ignored: it
    /// depends on how long answers take). The last is the least time the
    /// limits allow for the whole run; greedy is optimal for these limits.
    pub fn fastest_schedule(&self, calls: usize) -> Vec<Duration> {
        let limits = Limits { concurrency: None, ..self.clone() };
        let mut rules = Rules::new(limits);
        let mut now = Duration::ZERO;
        let mut times = Vec::with_capacity(calls);
        while times.len() < calls {
            match rules.arrive("", now) {
                Verdict::Admit => {
                    rules.finish("");
                    times.push(now);
                }
                Verdict::Refuse { retry_after: Some(wait), .. } => now += wait,
                Verdict::Refuse { retry_after: None, .. } => {
                    unreachable!("time-based limits know their wait")
                }
            }
        }
        times
    }
}

/// A decision on one arriving call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    /// `limit` names what refused it; `retry_after` is exact for the
    /// time-based limits (the longest of the refusing ones), `None` when
    /// only concurrency refused.
    Refuse {
        limit: String,
        retry_after: Option<Duration>,
    },
}

/// The state of every key.
#[derive(Debug)]
pub struct Rules {
    limits: Limits,
    keys: HashMap<String, KeyState>,
}

#[derive(Debug, Default)]
struct KeyState {
    /// Arrival times of admitted calls, oldest first, within the longest window.
    admitted: VecDeque<Duration>,
    last: Option<Duration>,
    in_flight: u32,
}

impl Rules {
    pub fn new(limits: Limits) -> Rules {
        Rules { limits, keys: HashMap::new() }
    }

    /// Decides a call of `key` arriving at `now` (never earlier than the
    /// previous call's `now`); an admitted call is in flight until [`Rules::finish`].
    pub fn arrive(&mut self, key: &str, now: Duration) -> Verdict {
        let state = self.keys.entry(key.to_string()).or_default();
        let longest = self.limits.windows.iter().map(|w| w.window).max().unwrap_or(Duration::ZERO);
        while state.admitted.front().is_some_and(|&s| s + longest <= now) {
            state.admitted.pop_front();
        }
        let mut refusals = Vec::new();
        let mut wait: Option<Duration> = None;
        for w in &self.limits.windows {
            // Live entries are a suffix: those with s + window > now.
            let live: Vec<Duration> =
                state.admitted.iter().copied().filter(|&s| s + w.window > now).collect();
            if live.len() >= w.limit as usize {
                // It fits once all but limit - 1 have expired.
                let frees = live[live.len() - w.limit as usize] + w.window - now;
                wait = Some(wait.map_or(frees, |other| other.max(frees)));
                refusals.push(format!("window {}/{}ms", w.limit, w.window.as_millis()));
            }
        }
        if let (Some(every), Some(last)) = (self.limits.interval, state.last) {
            if now < last + every {
                let frees = last + every - now;
                wait = Some(wait.map_or(frees, |other| other.max(frees)));
                refusals.push(format!("interval {}ms", every.as_millis()));
            }
        }
        if let Some(max) = self.limits.concurrency {
            if state.in_flight >= max {
                refusals.push(format!("concurrency {max}"));
            }
        }
        if !refusals.is_empty() {
            // A concurrency slot frees at an unknown time: then there is no exact wait.
            let retry_after = if refusals.iter().any(|r| r.starts_with("concurrency")) { None } else { wait };
            return Verdict::Refuse { limit: refusals.join(", "), retry_after };
        }
        state.admitted.push_back(now);
        state.last = Some(now);
        state.in_flight += 1;
        Verdict::Admit
    }

    /// An admitted call of `key` has been answered.
    pub fn finish(&mut self, key: &str) {
        if let Some(state) = self.keys.get_mut(key) {
            state.in_flight = state.in_flight.saturating_sub(1);
        }
    }

    /// What the first window has left for `key` at `now`, and how long
    /// until a slot of it frees: the `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` a partner announces.
    pub fn quota(&self, key: &str, now: Duration) -> Option<(u32, Duration)> {
        let w = self.limits.windows.first()?;
        let live: Vec<Duration> = self
            .keys
            .get(key)
            .map(|state| state.admitted.iter().copied().filter(|&s| s + w.window > now).collect())
            .unwrap_or_default();
        let remaining = w.limit.saturating_sub(live.len() as u32);
        let reset = live.first().map_or(Duration::ZERO, |&oldest| oldest + w.window - now);
        Some((remaining, reset))
    }

    /// Admitted calls of `key` still being answered.
    pub fn in_flight(&self, key: &str) -> u32 {
        self.keys.get(key).map_or(0, |state| state.in_flight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn refused_for(verdict: Verdict) -> Option<Duration> {
        match verdict {
            Verdict::Refuse { retry_after, .. } => retry_after,
            Verdict::Admit => panic!("admitted"),
        }
    }

    /// A window of 3 per 1000 ms: the fourth call is refused until the
    /// first one's entry expires at exactly s + window, and the wait says so.
    #[test]
    fn a_sliding_window_is_exact_at_its_boundary() {
        let mut rules = Rules::new(Limits::default().window(3, ms(1000)));
        for t in [0, 10, 20] {
            assert_eq!(rules.arrive("a", ms(t)), Verdict::Admit);
        }
        assert_eq!(refused_for(rules.arrive("a", ms(999))), Some(ms(1)));
        assert_eq!(rules.arrive("a", ms(1000)), Verdict::Admit, "the entry at 0 expired at 1000");
        assert_eq!(refused_for(rules.arrive("a", ms(1009))), Some(ms(1)));
        assert_eq!(rules.arrive("b", ms(1009)), Verdict::Admit, "keys are independent");
    }

    /// Refused calls count against nothing: a stream of refusals does not
    /// push the next admission back.
    #[test]
    fn a_refused_call_is_not_counted() {
        let mut rules = Rules::new(Limits::default().window(1, ms(100)));
        assert_eq!(rules.arrive("a", ms(0)), Verdict::Admit);
        for t in 1..100 {
            assert!(matches!(rules.arrive("a", ms(t)), Verdict::Refuse { .. }));
        }
        assert_eq!(rules.arrive("a", ms(100)), Verdict::Admit);
    }

    /// Two windows (S0's shape): the longer one refuses once it is full even
    /// when the shorter one has room, with the longer wait.
    #[test]
    fn two_windows_both_hold() {
        let mut rules = Rules::new(Limits::default().window(2, ms(100)).window(3, ms(1000)));
        for t in [0, 1, 100] {
            assert_eq!(rules.arrive("a", ms(t)), Verdict::Admit);
        }
        let Verdict::Refuse { limit, retry_after } = rules.arrive("a", ms(200)) else { panic!("admitted") };
        assert_eq!((limit.as_str(), retry_after), ("window 3/1000ms", Some(ms(800))));
        assert_eq!(rules.arrive("a", ms(1000)), Verdict::Admit);
    }

    /// An interval: the gap since the last admitted call must be at least `every`.
    #[test]
    fn an_interval_spaces_calls() {
        let mut rules = Rules::new(Limits::default().interval(ms(100)));
        assert_eq!(rules.arrive("a", ms(0)), Verdict::Admit);
        assert_eq!(refused_for(rules.arrive("a", ms(99))), Some(ms(1)));
        assert_eq!(rules.arrive("a", ms(100)), Verdict::Admit);
        assert_eq!(refused_for(rules.arrive("a", ms(150))), Some(ms(50)));
    }

    /// Concurrency: at most `max` in flight; a finish frees a slot at once;
    /// the refusal has no exact wait.
    #[test]
    fn concurrency_counts_calls_in_flight() {
        let mut rules = Rules::new(Limits::default().concurrency(2));
        assert_eq!(rules.arrive("a", ms(0)), Verdict::Admit);
        assert_eq!(rules.arrive("a", ms(0)), Verdict::Admit);
        assert_eq!(refused_for(rules.arrive("a", ms(1))), None);
        assert_eq!(rules.in_flight("a"), 2);
        rules.finish("a");
        assert_eq!(rules.arrive("a", ms(2)), Verdict::Admit);
        assert_eq!(rules.in_flight("a"), 2);
    }

    /// The least time the limits allow: S0 (25 per 5 s and 300 per minute)
    /// takes 115 s for 600 calls: 12 windows of 25 reach 300 at 55 s, the
    /// minute window holds call 300 until 60 s, then 12 more windows.
    #[test]
    fn the_fastest_schedule_of_s0() {
        let s0 = Limits::default().window(25, ms(5000)).window(300, ms(60_000));
        let times = s0.fastest_schedule(600);
        assert_eq!((times[299], times[300], times[599]), (ms(55_000), ms(60_000), ms(115_000)));
        let scaled = Limits::default().window(5, ms(1000)).window(12, ms(3000));
        // 5 at 0, 5 at 1 s, 2 at 2 s, then the same from 3 s: 40 calls end at 9 s.
        assert_eq!(scaled.fastest_schedule(40).last(), Some(&ms(9000)));
        assert_eq!(Limits::default().interval(ms(100)).fastest_schedule(11).last(), Some(&ms(1000)));
    }
}
