//! `fixed_window`: one counter per window aligned to the epoch. Twin of
//! `lua/fixed_window.lua`.
//!
//! The window of `now` is `now / window`; it ends at `(index + 1) * window`.
//! A request passes while the window's count is below `limit`.

use super::{Found, State, View};

pub fn check(state: Option<&State>, now: u64, limit: u64, window: u64) -> Found {
    let index = now / window;
    let end = (index + 1) * window;
    let count = match state {
        Some(&State::Counter { window: w, count }) if w == index => count,
        _ => 0,
    };
    let reset = end - now;
    let allowed = count < limit;
    Found {
        allowed,
        now: View { remaining: limit.saturating_sub(count), reset_us: reset },
        after: View { remaining: limit.saturating_sub(count + 1), reset_us: reset },
        retry_us: Some(if allowed { 0 } else { reset }),
        reclaimed: 0,
        held_until: None,
        pruned: None,
        commit: Some(State::Counter { window: index, count: count + 1 }),
    }
}
