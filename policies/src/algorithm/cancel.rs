//! `cancel`: gives back what a held reservation took, once its client is
//! gone. Twin of `lua/scripts/cancel.lua`.
//!
//! Only what is provably safe goes back: the request's own log entries still
//! in the future, its fixed-window count while that window is still ahead
//! and still stored, and its GCRA charge while `tat` is still exactly what
//! this reservation set. Anything later requests may already build on stays.

use super::{fixed_window, gcra, sliding_window, Algorithm, RedisTwin};

/// A reserved limit as cancellation takes it: its key, its algorithm, and the
/// `tat` the reservation set (gcra's `held_until`).
pub type Reserved = (String, Algorithm, Option<u64>);

/// `lua/scripts/cancel.lua`: the reservation of request `id` at slot `at`.
pub fn cancel(store: &mut RedisTwin, now: u64, id: &str, at: u64, limits: &[Reserved]) {
    for (key, alg, held) in limits {
        let state = store.keys.get_mut(key);
        match *alg {
            Algorithm::SlidingWindow { .. } => sliding_window::cancel(state, now, id),
            Algorithm::FixedWindow { window_us, .. } => fixed_window::cancel(state, now, at, window_us.get()),
            Algorithm::Gcra { interval_us, cost, .. } => {
                gcra::cancel(state, held.unwrap_or(0), interval_us.get(), cost)
            }
            Algorithm::SlidingApprox { .. }
            | Algorithm::Concurrency { .. }
            | Algorithm::Calendar { .. }
            | Algorithm::Pause
            | Algorithm::Rate => {}
        }
    }
}
