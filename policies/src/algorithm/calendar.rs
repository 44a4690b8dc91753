//! `calendar`: one counter per calendar window, for `fixed_window` (cost 1)
//! and `points` (the request's cost) on a calendar. Twin of
//! `lua/lib/calendar.lua`.
//!
//! Redis has no zone rules, so the script is given the ends of two
//! consecutive windows, `e1 < e2` ([`crate::calendar::Calendar::ends_near`]),
//! and a window is named by its end: the window of `now` is `e1` if `now <
//! e1`, else `e2` if `now < e2`. The shim picks the two around its own clock,
//! so Redis's clock may differ from it by up to half a window and both still
//! name every window alike. Beyond both ends (the clocks differ by more) the
//! limit denies, its wait unknown.
//!
//! A request of `cost` passes while the window's count plus `cost` is at
//! most `limit`. The state holds one window (a hash `w`, its end, and `n`,
//! its count) and never goes back to an older one: a stored window newer
//! than now's (Redis's clock stepped back) admits nothing until now's ends.

use super::{counter, Correction, Found, State, View};

/// The end of the window of `now` among the two given; `None` beyond both.
pub fn window_of(now: u64, (e1, e2): (u64, u64)) -> Option<u64> {
    if now < e1 {
        Some(e1)
    } else if now < e2 {
        Some(e2)
    } else {
        None
    }
}

pub fn check(state: Option<&State>, now: u64, limit: u64, cost: u64, ends: (u64, u64)) -> Found {
    let denied = |wait: Option<u64>| {
        let view = View { remaining: 0, reset_us: wait.unwrap_or(0) };
        Found {
            allowed: false,
            now: view,
            after: view,
            retry_us: wait,
            reclaimed: 0,
            held_until: None,
            pruned: None,
            commit: None,
        }
    };
    let Some(end) = window_of(now, ends) else { return denied(None) };
    let reset = end - now;
    let count = match state {
        Some(&State::Counter { window: stored, .. }) if stored > end => return denied(Some(reset)),
        Some(&State::Counter { window: stored, count }) if stored == end => count,
        _ => 0,
    };
    // A correction (adjust) goes to the window the request was charged in.
    Found { held_until: Some(end), ..counter::check(end, count, limit, cost, reset) }
}

/// `lua/scripts/refund.lua`: takes back a charge of `cost` made at
/// `charged`, while its window is still the stored one.
pub fn refund(state: Option<&mut State>, charged: u64, cost: u64, ends: (u64, u64)) {
    let Some(end) = window_of(charged, ends) else { return };
    if let Some(State::Counter { window, count }) = state {
        if *window == end {
            *count = count.saturating_sub(cost);
        }
    }
}

/// `lua/scripts/adjust.lua`: charges `c.delta` more (or refunds, when
/// negative) into the window the request was charged in (its
/// `held_until_us`), while that window is still the stored one and has not
/// ended. A correction that comes after its window is dropped: the next
/// window's budget is not the request's. The count never goes below 0.
/// Returns the units it moved.
pub fn adjust(state: Option<&mut State>, now: u64, c: &Correction) -> i64 {
    if let Some(State::Counter { window, count }) = state {
        if *window == c.held_until_us && now < c.held_until_us {
            let before = *count;
            *count = count.saturating_add_signed(c.delta);
            return i64::try_from(*count).unwrap_or(i64::MAX) - i64::try_from(before).unwrap_or(i64::MAX);
        }
    }
    0
}
