//! `confirm`: a held request at its slot, before the shim lets it go. Twin
//! of `lua/scripts/confirm.lua` (and `confirm_slots` in `lua/lib/slots.lua`).
//!
//! Its send is checked against what was really sent on each key meanwhile:
//! if every limit lets it go now, the send is recorded at `now`; if one that
//! woke late is in its way, nothing changes and the answer says how long to
//! wait (the shim sleeps that long and confirms again). A late send thus
//! shifts those behind it by its lateness, in order, and the gap between
//! two sends is never under the interval. A send that pushes held requests
//! past their deadlines drops them from the chain and names them, each with
//! the wait it would have had, so that they are refused at once, not at
//! their slots: the script PUBLISHes each on [`PUSHED_CHANNEL`], which
//! every shim listens on, so the shim that holds it refuses it whichever
//! shim made the send ([`Confirmed::published`]). A request no longer held
//! (given back, or dropped past its deadline) has the rest of its
//! reservation given back.

use super::cancel::{cancel, Reserved};
use super::reserve::Waiting;
use super::{fixed_window, gcra, rate, sliding_window, Algorithm, RedisTwin, State};

/// What a held request at its slot may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmed {
    /// Sent now, and recorded; `pushed`: the held requests this send pushed
    /// past their deadlines, each with the wait (µs) it would have had.
    Sent { pushed: Vec<(String, u64)> },
    /// Not yet: wait this many µs more and confirm again.
    Wait(u64),
    /// No longer held: refused.
    Gone,
}

/// The channel a send PUBLISHes the held requests it pushed past their
/// deadlines on; every shim listens on it (one fleet-wide channel: pushes
/// are rare, and a held request's record does not name its shim).
pub const PUSHED_CHANNEL: &str = "sluice:pushed";

impl Confirmed {
    /// The messages the send PUBLISHed on [`PUSHED_CHANNEL`], in order:
    /// `<id> <wait_us>` for each request it pushed out; none unless sent.
    pub fn published(&self) -> Vec<String> {
        match self {
            Confirmed::Sent { pushed } => pushed.iter().map(|(id, us)| format!("{id} {us}")).collect(),
            _ => Vec::new(),
        }
    }

    /// A message [`Confirmed::published`] made, read back: the request and
    /// its wait in µs.
    pub fn parse_pushed(message: &str) -> Option<(&str, u64)> {
        let (id, us) = message.split_once(' ')?;
        Some((id, us.parse().ok()?))
    }
}

/// What `confirm_slots` finds: whether a limit no longer holds the request,
/// the due time, what to store once sent (for the limits that hold it), and
/// whom that send pushes out.
struct Found {
    gone: bool,
    due: u64,
    writes: Vec<(String, State)>,
    pushed: Vec<gcra::Pushed>,
}

fn found(store: &RedisTwin, now: u64, id: &str, at: u64, limits: &[Waiting]) -> Found {
    let keyed: Vec<(String, Algorithm)> = limits.iter().map(|(key, alg, _)| (key.clone(), *alg)).collect();
    let scaled = rate::apply(|k| store.keys.get(k).cloned(), now, &keyed);
    let mut out = Found { gone: false, due: now, writes: Vec::new(), pushed: Vec::new() };
    for ((key, _, margin), alg) in limits.iter().zip(&scaled) {
        let state = store.keys.get(key);
        type Write = Vec<(String, State)>;
        let f: Option<(u64, Write, Vec<gcra::Pushed>)> = match *alg {
            Algorithm::FixedWindow { limit, window_us, .. } => {
                let (d, s) = fixed_window::confirm(state, now, at, limit, window_us.get(), *margin);
                Some((d, s.map(|s| (key.clone(), s)).into_iter().collect(), Vec::new()))
            }
            Algorithm::SlidingWindow { limit, window_us } => {
                sliding_window::confirm(state, now, id, limit, window_us.get(), *margin)
                    .map(|(d, s)| (d, s.map(|s| (key.clone(), s)).into_iter().collect(), Vec::new()))
            }
            Algorithm::Gcra { .. } => gcra::confirm(store, key, now, id).map(|c| {
                let saved = c.saved.into_iter().map(|(suffix, s)| (format!("{key}{suffix}"), s)).collect();
                (c.due, saved, c.pushed)
            }),
            _ => continue,
        };
        match f {
            Some((d, w, p)) => {
                out.due = out.due.max(d);
                out.writes.extend(w);
                out.pushed.extend(p);
            }
            None => out.gone = true,
        }
    }
    out
}

fn write(store: &mut RedisTwin, writes: Vec<(String, State)>) {
    for (key, state) in writes {
        store.keys.insert(key, state);
    }
}

/// `lua/scripts/confirm.lua`: request `id`, reserved at `at`, at its slot.
pub fn confirm(store: &mut RedisTwin, now: u64, id: &str, at: u64, limits: &[Waiting]) -> Confirmed {
    match found(store, now, id, at, limits) {
        Found { gone: true, .. } => {
            let reserved: Vec<Reserved> = limits.iter().map(|(k, alg, _)| (k.clone(), *alg, None)).collect();
            cancel(store, now, id, at, &reserved);
            Confirmed::Gone
        }
        Found { due, .. } if due > now => Confirmed::Wait(due - now),
        Found { writes, pushed, .. } => {
            write(store, writes);
            Confirmed::Sent {
                pushed: pushed.into_iter().map(|(id, place)| (id, place.saturating_sub(now))).collect(),
            }
        }
    }
}

/// A mixed waiter that takes its concurrency slot (`take`): its time
/// reservation is recorded as sent now, whatever is due. False, recording
/// nothing, if a limit no longer holds it (dropped past its deadline).
pub fn record(store: &mut RedisTwin, now: u64, id: &str, at: u64, limits: &[Waiting]) -> bool {
    let f = found(store, now, id, at, limits);
    if !f.gone {
        write(store, f.writes);
    }
    !f.gone
}
