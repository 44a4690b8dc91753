//! `cancel`: gives back what a held reservation took, once its client is
//! gone or its shim refuses it. Twin of `lua/scripts/cancel.lua`.
//!
//! A held request was never sent, so all of it goes back: its log entries,
//! its fixed-window count while that window is still stored, and its place
//! in a bucket's chain of held reservations, which the reservations still
//! held keep. Give-backs in any order leave the state as if they had never
//! been made.

use super::{fixed_window, gcra, sliding_window, Algorithm, RedisTwin};

/// A reserved limit as cancellation takes it: its key, its algorithm, and the
/// `tat` the reservation set (gcra's `held_until`; no longer needed).
pub type Reserved = (String, Algorithm, Option<u64>);

/// `lua/scripts/cancel.lua`: the reservation of request `id` at slot `at`.
pub fn cancel(store: &mut RedisTwin, now: u64, id: &str, at: u64, limits: &[Reserved]) {
    for (key, alg, _) in limits {
        match *alg {
            Algorithm::SlidingWindow { .. } => sliding_window::cancel(store.keys.get_mut(key), id),
            Algorithm::FixedWindow { window_us, .. } => {
                fixed_window::cancel(store.keys.get_mut(key), at, window_us.get())
            }
            Algorithm::Gcra { .. } => gcra::cancel(store, key, now, id),
            Algorithm::SlidingApprox { .. }
            | Algorithm::Concurrency { .. }
            | Algorithm::Calendar { .. }
            | Algorithm::FirstHit { .. }
            | Algorithm::Pause
            | Algorithm::Rate => {}
        }
    }
}
