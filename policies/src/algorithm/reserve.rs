//! `reserve`: the waiting path of `check`, for a request that may be held up
//! to `wait` microseconds. Twin of `lua/lib/reserve.lua`.
//!
//! A reservation at `now` is sent at once; a later one is held until its
//! request confirms the send at its slot (`confirm`) or gives it back
//! (`cancel`).
//!
//! Each limit names the earliest time at or after `now` at which it admits
//! the request; past that time it keeps admitting it (reservations on a key
//! keep arrival order, so nothing recorded lies beyond a later slot). The
//! request's slot `t` is the latest of these. If `t - now <= wait`, every
//! limit is charged at `t` and the shim holds its answer until `t`;
//! otherwise nothing changes but expired entries, and the reply says how far
//! away `t` is (`None`: never).
//!
//! Per limit: `allowed` is whether its own slot lies within the wait;
//! `remaining` is what it still admits (after the request at `t`, or at
//! `now` if denied); `reset_ms` is, when admitted, the time from `t` until it
//! frees capacity, and when denied its own wait, as is `retry_after_ms`.

use super::{
    ceil_ms, fixed_window, gcra, pause, rate, sliding_window, Algorithm, CheckReply, LimitOutcome, RedisTwin,
};
use crate::units::{Micros, Millis};

/// The answer to a waiting request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub reply: CheckReply,
    /// The slot it is admitted at, in µs; `None` when denied.
    pub at: Option<u64>,
}

/// A limit as the waiting path takes it: its key, its algorithm, its margin in µs.
pub type Waiting = (String, Algorithm, u64);

/// `lua/lib/reserve.lua`. Concurrency, approximate and calendar windows cannot wait: the
/// shim refuses them before they get here, and so does this (`None`).
pub fn reserve(
    store: &mut RedisTwin,
    now: u64,
    id: &str,
    wait: u64,
    limits: &[Waiting],
) -> Option<Reservation> {
    reserve_slots(store, now, id, wait, limits, false)
}

/// [`reserve`] with a slot at `now` held too (`hold`): a mixed request,
/// which must still take its concurrency slot before it is sent.
pub fn reserve_slots(
    store: &mut RedisTwin,
    now: u64,
    id: &str,
    wait: u64,
    limits: &[Waiting],
    hold: bool,
) -> Option<Reservation> {
    let mut slots = Vec::with_capacity(limits.len());
    // The partner's refusals scale the limits of their check first.
    let keyed: Vec<(String, Algorithm)> = limits.iter().map(|(key, alg, _)| (key.clone(), *alg)).collect();
    let scaled = rate::apply(|k| store.keys.get(k).cloned(), now, &keyed);
    for ((key, _, margin), alg) in limits.iter().zip(&scaled) {
        let state = store.keys.get(key);
        let deadline = now + wait;
        let slot = match *alg {
            Algorithm::FixedWindow { limit, window_us, .. } => {
                fixed_window::reserve(state, now, limit, window_us.get(), *margin)
            }
            Algorithm::SlidingWindow { limit, window_us } => {
                sliding_window::reserve(state, now, id, limit, window_us.get(), *margin)
            }
            Algorithm::Gcra { interval_us, burst, cost } => gcra::reserve(
                store,
                key,
                now,
                id,
                (interval_us.get(), burst, cost),
                *margin,
                (deadline, hold),
            ),
            Algorithm::Pause => pause::reserve(state, now),
            Algorithm::Rate => rate::reserve(state, now),
            Algorithm::SlidingApprox { .. }
            | Algorithm::Concurrency { .. }
            | Algorithm::Calendar { .. }
            | Algorithm::FirstHit { .. } => return None,
        };
        slots.push(slot);
    }
    for ((key, _, _), slot) in limits.iter().zip(&slots) {
        if let Some(state) = &slot.pruned {
            store.keys.insert(key.clone(), state.clone());
        }
    }
    let at = slots.iter().try_fold(now, |t, s| s.at.map(|a| t.max(a)));
    let allowed = at.is_some_and(|t| t - now <= wait);
    let mut outcomes = Vec::with_capacity(slots.len());
    for ((key, _, _), slot) in limits.iter().zip(&slots) {
        let own = slot.at.map(|a| ceil_ms(a - now));
        outcomes.push(match at.filter(|_| allowed) {
            Some(t) => {
                let c = (slot.commit)(t);
                store.keys.insert(key.clone(), c.state);
                for (suffix, state) in c.extra {
                    store.keys.insert(format!("{key}{suffix}"), state);
                }
                LimitOutcome {
                    allowed: true,
                    remaining: c.view.remaining,
                    reset_ms: ceil_ms(c.view.reset_us),
                    retry_after_ms: Some(Millis(0)),
                    reclaimed: 0,
                    held_until_us: c.held_until.map(Micros),
                    refunded_us: Micros(if c.held_until.is_some() { super::refunded(store, key) } else { 0 }),
                }
            }
            None => LimitOutcome {
                allowed: slot.at.is_some_and(|a| a - now <= wait),
                remaining: slot.remaining_now,
                reset_ms: own.unwrap_or(Millis(0)),
                retry_after_ms: own,
                reclaimed: 0,
                held_until_us: None,
                refunded_us: Micros(0),
            },
        });
    }
    let retry_after_ms = match at {
        _ if allowed => Some(Millis(0)),
        Some(t) => Some(ceil_ms(t - now)),
        None => None,
    };
    Some(Reservation {
        reply: CheckReply { allowed, retry_after_ms, limits: outcomes },
        at: at.filter(|_| allowed),
    })
}
