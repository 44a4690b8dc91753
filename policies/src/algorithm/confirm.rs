//! `confirm`: a held request at its slot, before the shim lets it go. Twin
//! of `lua/scripts/confirm.lua` (and `confirm_slots` in `lua/lib/slots.lua`).
//!
//! Its send is checked against what was really sent on each key meanwhile:
//! if every limit lets it go now, the send is recorded at `now`; if one that
//! woke late is in its way, nothing changes and the answer says how long to
//! wait (the shim sleeps that long and confirms again). A late send thus
//! shifts those behind it by its lateness, in order, and the gap between
//! two sends is never under the interval. A request no longer held (given
//! back, or dropped past its deadline) has the rest of its reservation
//! given back.

use super::cancel::{cancel, Reserved};
use super::reserve::Waiting;
use super::{fixed_window, gcra, rate, sliding_window, Algorithm, RedisTwin, State};

/// What a held request at its slot may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmed {
    /// Sent now, and recorded.
    Sent,
    /// Not yet: wait this many µs more and confirm again.
    Wait(u64),
    /// No longer held: refused.
    Gone,
}

/// Whether a limit no longer holds the request, the due time, and what to
/// store once sent (for the limits that hold it): `confirm_slots`.
fn found(
    store: &RedisTwin,
    now: u64,
    id: &str,
    at: u64,
    limits: &[Waiting],
) -> (bool, u64, Vec<(String, State)>) {
    let keyed: Vec<(String, Algorithm)> = limits.iter().map(|(key, alg, _)| (key.clone(), *alg)).collect();
    let scaled = rate::apply(|k| store.keys.get(k).cloned(), now, &keyed);
    let (mut gone, mut due, mut writes) = (false, now, Vec::new());
    for ((key, _, margin), alg) in limits.iter().zip(&scaled) {
        let state = store.keys.get(key);
        let f: Option<(u64, Vec<(String, State)>)> = match *alg {
            Algorithm::FixedWindow { limit, window_us } => {
                let (d, s) = fixed_window::confirm(state, now, at, limit, window_us.get(), *margin);
                Some((d, s.map(|s| (key.clone(), s)).into_iter().collect()))
            }
            Algorithm::SlidingWindow { limit, window_us } => {
                sliding_window::confirm(state, now, id, limit, window_us.get(), *margin)
                    .map(|(d, s)| (d, s.map(|s| (key.clone(), s)).into_iter().collect()))
            }
            Algorithm::Gcra { .. } => gcra::confirm(store, key, now, id).map(|(d, saved)| {
                (d, saved.into_iter().map(|(suffix, s)| (format!("{key}{suffix}"), s)).collect())
            }),
            _ => continue,
        };
        match f {
            Some((d, w)) => {
                due = due.max(d);
                writes.extend(w);
            }
            None => gone = true,
        }
    }
    (gone, due, writes)
}

fn write(store: &mut RedisTwin, writes: Vec<(String, State)>) {
    for (key, state) in writes {
        store.keys.insert(key, state);
    }
}

/// `lua/scripts/confirm.lua`: request `id`, reserved at `at`, at its slot.
pub fn confirm(store: &mut RedisTwin, now: u64, id: &str, at: u64, limits: &[Waiting]) -> Confirmed {
    match found(store, now, id, at, limits) {
        (true, _, _) => {
            let reserved: Vec<Reserved> = limits.iter().map(|(k, alg, _)| (k.clone(), *alg, None)).collect();
            cancel(store, now, id, at, &reserved);
            Confirmed::Gone
        }
        (false, due, _) if due > now => Confirmed::Wait(due - now),
        (false, _, writes) => {
            write(store, writes);
            Confirmed::Sent
        }
    }
}

/// A mixed waiter that took its concurrency slot (`take`): its time
/// reservation is recorded as sent now, whatever is due.
pub fn record(store: &mut RedisTwin, now: u64, id: &str, at: u64, limits: &[Waiting]) {
    let (_, _, writes) = found(store, now, id, at, limits);
    write(store, writes);
}
