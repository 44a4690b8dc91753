//! `pause`: the partner's own "slow down", fleet-wide. Twin of `lua/lib/pause.lua`.
//!
//! One key per policy and key (`<tag>:pause`) holds the time until which the
//! partner asked us to stop (upstream feedback). A check of a policy that
//! reads upstream feedback carries it as one more limit: decided at once, it
//! refuses until then; waiting, its slot is the pause's end, so a reservation
//! never falls inside a pause. It charges nothing.
//!
//! A pause only ever moves later: [`record`] keeps the later of the stored
//! end and the new one, so a stale or shorter answer never shortens it.

use super::slot::{Committed, Slot};
use super::{Found, State, View};

fn until(state: Option<&State>) -> u64 {
    match state {
        Some(&State::Pause(until)) => until,
        _ => 0,
    }
}

pub fn check(state: Option<&State>, now: u64) -> Found {
    let until = until(state);
    let allowed = now >= until;
    let view = View { remaining: u64::from(allowed), reset_us: until.saturating_sub(now) };
    Found::uncharged(allowed, view, until.saturating_sub(now))
}

/// The waiting path: the slot is the pause's end; nothing is charged.
pub fn reserve(state: Option<&State>, now: u64) -> Slot {
    let stored = state.cloned();
    let until = until(state);
    Slot {
        at: Some(until.max(now)),
        remaining_now: u64::from(now >= until),
        pruned: None,
        commit: Box::new(move |_t| Committed {
            state: stored.clone().unwrap_or(State::Pause(0)),
            view: View { remaining: 1, reset_us: 0 },
            held_until: None,
            extra: Vec::new(),
        }),
    }
}

/// `lua/scripts/upstream.lua`: pauses the key until `now + pause_us`, unless it is
/// already paused longer. The end now stored, and whether it moved.
pub fn record(state: Option<&State>, now: u64, pause_us: u64) -> (u64, bool) {
    let stored = until(state);
    let wanted = now.saturating_add(pause_us);
    if wanted > stored {
        (wanted, true)
    } else {
        (stored, false)
    }
}
