//! `rate`: the rate the partner's refusals taught us, fleet-wide. Twin of
//! `lua/lib/rate.lua`.
//!
//! A pause is not a rate: when it ends, a policy that overstates the
//! partner's limits sends too much again. So one key per policy and key
//! (`<tag>:rate`) holds a factor on the rate of its time limits: `factor`
//! parts per million of the policy's own, set at `at` by a refusal, climbing
//! back linearly from then by the whole rate every `recover_us`. The first
//! refusal after a key ran freely multiplies it by the policy's `decrease`
//! ([`slow`]); answers to calls already in flight then find the key paused
//! and lower nothing more.
//!
//! A check of a policy that reads upstream feedback carries the key as one
//! more limit ([`super::Algorithm::Rate`]), which scales every limit of its
//! check ([`scaled`]) before they decide, and charges nothing. Concurrency
//! limits keep their size.

use super::slot::{Committed, Slot};
use super::{Algorithm, Found, State, View};
use crate::feedback::Slowdown;
use crate::units::Micros;

/// A factor of one: the policy's own rate.
pub use crate::units::PPM;

/// The factor at `now`, in parts per million of the policy's rate.
pub fn factor(state: Option<&State>, now: u64) -> u64 {
    let Some(&State::Rate { factor, at, recover_us }) = state else { return PPM };
    if recover_us == 0 {
        return PPM;
    }
    // As the script computes it, in doubles.
    let climbed = (now.saturating_sub(at) as f64 * PPM as f64 / recover_us as f64).floor() as u64;
    factor.saturating_add(climbed).min(PPM)
}

/// `limit` at factor `f`: a window admits `floor(limit * f)`, at least 1;
/// a bucket refills `f` times as fast and holds `f` times its burst, at
/// least the request's cost. Other limits are unchanged.
pub fn scaled(limit: Algorithm, f: u64) -> Algorithm {
    if f >= PPM {
        return limit;
    }
    let fewer = |n: u64| ((n as f64 * f as f64 / PPM as f64).floor() as u64).max(1);
    match limit {
        Algorithm::FixedWindow { limit, window_us, cost } => {
            Algorithm::FixedWindow { limit: fewer(limit), window_us, cost }
        }
        Algorithm::FirstHit { limit, window_us, cost } => {
            Algorithm::FirstHit { limit: fewer(limit), window_us, cost }
        }
        Algorithm::SlidingWindow { limit, window_us } => {
            Algorithm::SlidingWindow { limit: fewer(limit), window_us }
        }
        Algorithm::SlidingApprox { limit, window_us } => {
            Algorithm::SlidingApprox { limit: fewer(limit), window_us }
        }
        Algorithm::Gcra { interval_us, burst, cost } => Algorithm::Gcra {
            interval_us: Micros((interval_us.get() as f64 * PPM as f64 / f as f64).ceil() as u64),
            burst: fewer(burst).max(cost),
            cost,
        },
        other => other,
    }
}

/// The tag a rate key scales: every key that starts with it belongs to the
/// same check (`sluice:{<policy>:<key>}:`; a tag holds no braces inside).
fn tag(rate_key: &str) -> &str {
    rate_key.strip_suffix("rate").unwrap_or(rate_key)
}

/// `limits` as they decide now: each scaled by the factor of its check's
/// rate key, if the check has one.
pub fn apply(
    state: impl Fn(&str) -> Option<State>,
    now: u64,
    limits: &[(String, Algorithm)],
) -> Vec<Algorithm> {
    let mut out: Vec<Algorithm> = limits.iter().map(|(_, alg)| *alg).collect();
    for (rate_key, _) in limits.iter().filter(|(_, alg)| matches!(alg, Algorithm::Rate)) {
        let f = factor(state(rate_key).as_ref(), now);
        let tag = tag(rate_key);
        for ((key, _), alg) in limits.iter().zip(out.iter_mut()) {
            if !matches!(alg, Algorithm::Rate) && key.starts_with(tag) {
                *alg = scaled(*alg, f);
            }
        }
    }
    out
}

/// As a limit of its check: always allows; its remaining is the factor.
pub fn check(state: Option<&State>, now: u64) -> Found {
    Found::uncharged(true, View { remaining: factor(state, now), reset_us: 0 }, 0)
}

/// The waiting path: admits at once; its remaining is the factor.
pub fn reserve(state: Option<&State>, now: u64) -> Slot {
    let stored = state.cloned();
    let f = factor(state, now);
    Slot {
        at: Some(now),
        remaining_now: f,
        pruned: None,
        commit: Box::new(move |_t| Committed {
            state: stored.clone().unwrap_or(State::Rate { factor: PPM, at: 0, recover_us: 0 }),
            view: View { remaining: f, reset_us: 0 },
            held_until: None,
            extra: Vec::new(),
        }),
    }
}

/// `lua/scripts/upstream.lua`: a refusal that finds the key running freely (not
/// paused until after `now`: `paused_until` is the pause's end before this
/// answer) lowers its rate to `decrease` of what it is now, not below `min`.
/// The state to store, if it changes.
pub fn slow(state: Option<&State>, now: u64, paused_until: u64, slow: &Slowdown) -> Option<State> {
    if now < paused_until {
        return None;
    }
    let lowered = (factor(state, now) as f64 * slow.decrease_ppm as f64 / PPM as f64).floor() as u64;
    Some(State::Rate {
        factor: lowered.max(slow.min_ppm),
        at: now,
        recover_us: slow.recover_ms.as_micros().get(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::Millis;

    const SLOW: Slowdown = Slowdown { decrease_ppm: 500_000, recover_ms: Millis(10_000), min_ppm: 100_000 };

    #[test]
    fn a_refusal_halves_the_rate_which_climbs_back() {
        let lowered = slow(None, 1_000, 0, &SLOW);
        assert_eq!(lowered, Some(State::Rate { factor: 500_000, at: 1_000, recover_us: 10_000_000 }));
        assert_eq!(factor(lowered.as_ref(), 1_000), 500_000);
        assert_eq!(factor(lowered.as_ref(), 1_000 + 2_000_000), 700_000);
        assert_eq!(factor(lowered.as_ref(), 1_000 + 60_000_000), PPM);
    }

    #[test]
    fn an_answer_inside_a_pause_lowers_nothing_and_the_rate_has_a_floor() {
        assert_eq!(slow(None, 1_000, 5_000, &SLOW), None);
        let mut state = None;
        for _ in 0..10 {
            state = slow(state.as_ref(), 0, 0, &SLOW);
        }
        assert_eq!(factor(state.as_ref(), 0), 100_000);
    }

    #[test]
    fn scaling_keeps_at_least_one_call_and_a_whole_request() {
        let window = Algorithm::SlidingWindow { limit: 24, window_us: Micros(5_000_000) };
        assert_eq!(
            scaled(window, 500_000),
            Algorithm::SlidingWindow { limit: 12, window_us: Micros(5_000_000) }
        );
        assert_eq!(
            scaled(window, 1_000),
            Algorithm::SlidingWindow { limit: 1, window_us: Micros(5_000_000) }
        );
        let points = Algorithm::Gcra { interval_us: Micros(100), burst: 10, cost: 8 };
        assert_eq!(scaled(points, 500_000), Algorithm::Gcra { interval_us: Micros(200), burst: 8, cost: 8 });
        let pool = Algorithm::Concurrency { limit: 10, lease_us: Micros(1) };
        assert_eq!(scaled(pool, 500_000), pool);
    }
}
