//! `fixed_window`: one counter per window aligned to the epoch. Twin of
//! `lua/lib/fixed_window.lua`.
//!
//! The window of `now` is `now / window`; it ends at `(index + 1) * window`.
//! A request of `cost` passes while the window's count plus `cost` is at
//! most `limit`.
//!
//! The state holds one window and never goes back to an older one. A stored
//! window newer than now's means now's window is full (a reservation moves on
//! to a later window only when the current one is full) or the clock stepped
//! back; either way nothing is admitted before the stored window, which keeps
//! its count.

use super::slot::{Committed, Slot};
pub use super::Grant;
use super::{counter, Found, State, View};

/// A request of `cost` (1, or an RLS call's `hits_addend`) in now's window
/// ([`counter`]).
pub fn check(state: Option<&State>, now: u64, limit: u64, window: u64, cost: u64) -> Found {
    let index = now / window;
    if let Some(&State::Counter { window: stored, count }) = state {
        if stored > index {
            let wait = stored * window - now + if count + cost > limit { window } else { 0 };
            let view = View { remaining: 0, reset_us: wait };
            return Found {
                allowed: false,
                now: view,
                after: view,
                retry_us: Some(wait),
                reclaimed: 0,
                held_until: None,
                pruned: None,
                commit: None,
            };
        }
    }
    let count = match state {
        Some(&State::Counter { window: w, count }) if w == index => count,
        _ => 0,
    };
    counter::check(index, count, limit, cost, (index + 1) * window - now)
}

/// Waiting (`reserve`): the earliest time at or after `now` at which a window
/// has room. The stored window, if not older than now's, is where counting
/// goes on; past a full one the next window is empty. A slot in a later
/// window than now's moves on by `margin`, and so does one in a window that
/// already holds requests (arrival order). Any later time is admissible too:
/// the request counts in the window of the time it is committed at.
pub fn reserve(state: Option<&State>, now: u64, limit: u64, window: u64, margin: u64) -> Slot {
    let current = now / window;
    let (stored, count) = match state {
        Some(&State::Counter { window, count }) => (Some(window), count),
        _ => (None, 0),
    };
    let (mut index, n) = match stored {
        Some(w) if w >= current => (w, count),
        _ => (current, 0),
    };
    let remaining_now = if index == current { limit.saturating_sub(n) } else { 0 };
    if n >= limit {
        index += 1;
    }
    // Reservations keep arrival order: a window already holding requests may
    // hold some reserved at its start + margin, so nobody goes before that.
    let at = if index > current {
        index * window + margin
    } else if Some(index) == stored {
        now.max(index * window + margin)
    } else {
        now
    };
    Slot {
        at: Some(at),
        remaining_now,
        pruned: None,
        commit: Box::new(move |t| {
            let slot = t / window;
            let held = if Some(slot) == stored { count } else { 0 };
            let stop = (slot + 1) * window;
            Committed {
                state: State::Counter { window: slot, count: held + 1 },
                view: View { remaining: limit.saturating_sub(held + 1), reset_us: stop - t },
                held_until: None,
                extra: Vec::new(),
            }
        }),
    }
}

/// At its slot (`confirm`): a held request sent in the window its slot was
/// counted in is counted; one that woke past that window's end is counted
/// again in now's window if it has room (a past window's count stays: it
/// can admit nothing more), else it waits for the next window with room.
/// The due time and the state to store once sent.
pub fn confirm(
    state: Option<&State>,
    now: u64,
    at: u64,
    limit: u64,
    window: u64,
    margin: u64,
) -> (u64, Option<State>) {
    let (slot, current) = (at / window, now / window);
    if now < at {
        return (at, None);
    }
    if current == slot {
        return (now, None);
    }
    let (stored, count) = match state {
        Some(&State::Counter { window, count }) => (Some(window), count),
        _ => (None, 0),
    };
    match stored {
        Some(w) if w > current => (w * window + margin, None),
        Some(w) if w == current && count >= limit => ((current + 1) * window + margin, None),
        Some(w) if w == current => (now, Some(State::Counter { window: current, count: count + 1 })),
        _ => (now, Some(State::Counter { window: current, count: 1 })),
    }
}

/// Cancellation (`cancel`): gives back a held reservation's count while its
/// window is still the stored one; it was never sent.
pub fn cancel(state: Option<&mut State>, at: u64, window: u64) {
    let slot = at / window;
    if let Some(State::Counter { window: stored, count }) = state {
        if *stored == slot && *count > 0 {
            *count -= 1;
        }
    }
}

/// Leased mode: takes back `tokens` a gateway never spent, only into the
/// window `window` they were granted from and only while it is the stored
/// one. The count never goes below 0. A window that has ended keeps its
/// count: the next window starts at 0 whatever it says.
pub fn give_back(state: Option<&mut State>, window: u64, tokens: u64) {
    if let Some(State::Counter { window: stored, count }) = state {
        if *stored == window {
            *count = count.saturating_sub(tokens);
        }
    }
}

/// Leased mode: up to `want` tokens of now's window, charged at once (the
/// count goes up by the grant), fewer when it has fewer left. A stored
/// window newer than now's (the clock stepped back) grants nothing. The
/// state to store, if any.
pub fn grant(state: Option<&State>, now: u64, limit: u64, window: u64, want: u64) -> (Grant, Option<State>) {
    let index = now / window;
    let expires_in_us = (index + 1) * window - now;
    let count = match state {
        Some(&State::Counter { window: stored, .. }) if stored > index => {
            return (Grant { granted: 0, window: index, expires_in_us, remaining: 0 }, None);
        }
        Some(&State::Counter { window: w, count }) if w == index => count,
        _ => 0,
    };
    let granted = want.min(limit.saturating_sub(count));
    let commit = (granted > 0).then_some(State::Counter { window: index, count: count + granted });
    let remaining = limit.saturating_sub(count + granted);
    (Grant { granted, window: index, expires_in_us, remaining }, commit)
}
