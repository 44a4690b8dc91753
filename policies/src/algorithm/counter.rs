//! The answer of one window's counter, for `fixed_window`, `first_hit` and
//! `calendar`. Twin of `lua/lib/counter.lua`.
//!
//! The window, named `name` (its index, start or end, as its kind names
//! it), has counted `count` of `limit` and ends `reset` µs from now. A
//! request of `cost` passes while `count + cost` is at most `limit` (a cost
//! above the limit never passes); refused, it waits for the window's end.
//! Admitted, the count goes up by its cost; refused, too, when the check
//! counts refusals (`Refusals::Counted`): the count then passes the limit,
//! and the window refuses every cost until its end.

use super::{Found, State, View};

pub fn check(name: u64, count: u64, limit: u64, cost: u64, reset: u64) -> Found {
    let allowed = count + cost <= limit;
    Found {
        allowed,
        now: View { remaining: limit.saturating_sub(count), reset_us: reset },
        after: View { remaining: limit.saturating_sub(count + cost), reset_us: reset },
        retry_us: Some(if allowed { 0 } else { reset }),
        reclaimed: 0,
        held_until: None,
        pruned: None,
        commit: Some(State::Counter { window: name, count: count + cost }),
    }
}
