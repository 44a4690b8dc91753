//! `sliding_approx`: the sliding window in O(1) memory. Twin of
//! `lua/lib/sliding_approx.lua`.
//!
//! It keeps the count of the current aligned window and of the previous one.
//! The estimate of the last `window` is the previous count weighted by the
//! share of it that still overlaps, plus the current count. A request passes
//! if the estimate, with it, stays within `limit`:
//!
//! `previous * (window - elapsed) + (current + 1) * window <= limit * window`
//!
//! The arithmetic is in f64, in the same order as the script, so that both
//! round alike when the products are beyond 2^53.

use super::{Found, State, View};

pub fn check(state: Option<&State>, now: u64, limit: u64, window: u64) -> Found {
    let mut index = now / window;
    // The state never goes back to an older window: after the clock steps
    // back, the stored newer window stays the current one, seen from its start.
    if let Some(&State::Approx { window: w, .. }) = state {
        index = index.max(w);
    }
    let elapsed = now.saturating_sub(index * window);
    let ahead = (index * window).saturating_sub(now);
    let (current, previous) = match state {
        Some(&State::Approx { window: w, current, previous }) if w == index => (current, previous),
        Some(&State::Approx { window: w, current, .. }) if w + 1 == index => (0, current),
        _ => (0, 0),
    };
    let (w, e, l) = (window as f64, elapsed as f64, limit as f64);
    let (c, p) = (current as f64, previous as f64);
    let weighted = p * (w - e);
    let allowed = weighted + (c + 1.0) * w <= l * w;
    let remaining = |charged: f64| ((l * w - (weighted + charged * w)) / w).floor().max(0.0) as u64;
    let retry = if allowed { 0 } else { wait(current, previous, limit, window, elapsed) + ahead };
    let reset = window - elapsed + ahead;
    Found {
        allowed,
        now: View { remaining: remaining(c), reset_us: reset },
        after: View { remaining: remaining(c + 1.0), reset_us: reset },
        retry_us: Some(retry),
        reclaimed: 0,
        held_until: None,
        pruned: None,
        commit: Some(State::Approx { window: index, current: current + 1, previous }),
    }
}

/// Microseconds until a denied request would pass, with no other traffic.
fn wait(current: u64, previous: u64, limit: u64, window: u64, elapsed: u64) -> u64 {
    let (w, l) = (window as f64, limit as f64);
    if current < limit && previous > 0 {
        // Later in this window: previous * (window - e) <= (limit - current - 1) * window.
        let room = ((l - current as f64 - 1.0) * w / previous as f64).floor() as u64;
        let at = window - room.min(window);
        if at < window {
            // At least 1: rounding in f64 must not turn a denial into "now".
            return at.saturating_sub(elapsed).max(1);
        }
    }
    // In the next window the current count is the previous one.
    let at =
        if current == 0 { 0 } else { window - (((l - 1.0) * w / current as f64).floor() as u64).min(window) };
    window - elapsed + at
}
