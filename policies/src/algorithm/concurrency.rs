//! `concurrency`: leases. Twin of `lua/lib/concurrency.lua`.
//!
//! One entry per request in flight, scored by when its lease expires. A
//! request passes while fewer than `limit` leases are live. The stream's end
//! releases its lease; a lease whose holder died expires after `lease` and is
//! reclaimed by the next check, which counts it; a slot reclaimed goes to the
//! oldest waiter first (`queue`, which `check` runs before this). An id
//! released before its check arrived (tombstoned) never takes a lease.

use super::{Found, State, View};

/// `state` has had its expired leases reclaimed (`reclaimed` of them).
pub fn check(
    state: Option<&State>,
    now: u64,
    id: &str,
    limit: u64,
    lease: u64,
    reclaimed: u64,
    tombstoned: bool,
) -> Found {
    let all: Vec<(u64, String)> = match state {
        Some(State::Set(entries)) => entries.clone(),
        _ => Vec::new(),
    };
    // A lease that expires at x is live while now < x.
    let mut live: Vec<(u64, String)> = all.iter().filter(|(x, _)| *x > now).cloned().collect();
    live.sort();
    let count = live.len() as u64;
    let soonest = live.first().map(|(x, _)| *x);
    let allowed = count < limit && !tombstoned;
    let pruned = State::Set(live.clone());
    live.push((now + lease, id.to_string()));
    Found {
        allowed,
        now: View { remaining: limit.saturating_sub(count), reset_us: soonest.map_or(0, |x| x - now) },
        after: View {
            remaining: limit.saturating_sub(count + 1),
            reset_us: soonest.map_or(lease, |x| x - now),
        },
        // Nobody knows when a lease will be released.
        retry_us: if allowed { Some(0) } else { None },
        reclaimed,
        held_until: None,
        pruned: Some(pruned),
        commit: Some(State::Set(live)),
    }
}
