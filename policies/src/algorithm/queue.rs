//! `queue`: the fleet-wide FCFS queue of requests waiting for a concurrency
//! slot, and the hand-over that gives freed slots straight to them. Twin of
//! `lua/lib/queue.lua` and of the scripts built on it: `acquire`, `release`,
//! `leave`, `reclaim`.
//!
//! Beside the lease set `key`, Redis keeps the waiters (`key:q` by arrival,
//! `key:d` by deadline, `key:w` their shims' channels; here one list) and
//! the tombstones `key:t` of ids released before their check arrived. A
//! waiter is served by giving it the lease under its own id and publishing
//! the id on its shim's channel, in the same atomic call as the release or
//! reclaim that freed the slot.
//!
//! A mixed waiter (time limits too, `key:l` in Redis) is served only if its
//! time limits admit it now: they are charged and it gets the lease.
//! Otherwise the slot passes on to the next waiter, and the waiter leaves the
//! queue with its time slot `t'` reserved if `t'` lies before its deadline
//! (its shim comes back at `t'`: `take`), or refused. A concurrency slot is
//! never held while its request waits for a time slot.

use super::cancel::{cancel, Reserved};
use super::reserve::{reserve, Waiting};
use super::{RedisTwin, State};

/// One request waiting for a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    /// Its place in arrival order (strictly increasing).
    pub seq: u64,
    pub id: String,
    /// When it stops waiting, µs.
    pub deadline: u64,
    /// Where its shim listens for the hand-over.
    pub channel: String,
    /// A mixed waiter's time limits, re-checked at the hand-over.
    pub time: Vec<Waiting>,
}

fn waiters<'a>(store: &'a mut RedisTwin, key: &str) -> &'a mut Vec<Waiter> {
    let entry = store.keys.entry(format!("{key}:q")).or_insert_with(|| State::Queue(Vec::new()));
    if !matches!(entry, State::Queue(_)) {
        *entry = State::Queue(Vec::new());
    }
    match entry {
        State::Queue(list) => list,
        _ => unreachable!("just made a queue"),
    }
}

fn set<'a>(store: &'a mut RedisTwin, key: &str) -> &'a mut Vec<(u64, String)> {
    let entry = store.keys.entry(key.to_string()).or_insert_with(|| State::Set(Vec::new()));
    if !matches!(entry, State::Set(_)) {
        *entry = State::Set(Vec::new());
    }
    match entry {
        State::Set(list) => {
            list.sort();
            list
        }
        _ => unreachable!("just made a set"),
    }
}

pub fn tombstoned(store: &RedisTwin, key: &str, now: u64, id: &str) -> bool {
    match store.keys.get(&format!("{key}:t")) {
        Some(State::Set(entries)) => entries.iter().any(|(until, m)| m == id && *until > now),
        _ => false,
    }
}

/// Gives the free slots of `key` to the oldest live waiters; a waiter past
/// its deadline, or tombstoned, is dropped from the queue instead. Expired
/// leases must have been reclaimed first. Returns the (channel, message)
/// published: `<id>` served, `<id> <t'> <delay>` time slot reserved at `t'`,
/// `<id> -1` refused.
pub fn hand_over(
    store: &mut RedisTwin,
    key: &str,
    now: u64,
    limit: u64,
    lease: u64,
) -> Vec<(String, String)> {
    let mut published = Vec::new();
    while (set(store, key).len() as u64) < limit {
        let queue = waiters(store, key);
        queue.sort_by_key(|w| w.seq);
        if queue.is_empty() {
            break;
        }
        let head = queue.remove(0);
        if head.deadline <= now || tombstoned(store, key, now, &head.id) {
            continue;
        }
        let slot = if head.time.is_empty() {
            None
        } else {
            reserve(store, now, &head.id, head.deadline - now, &head.time)
        };
        match slot {
            Some(r) if !r.reply.allowed => published.push((head.channel, format!("{} -1", head.id))),
            Some(r) if r.at != Some(now) => {
                let at = r.at.unwrap_or(now);
                published.push((head.channel, format!("{} {} {}", head.id, at, at - now)));
            }
            _ => {
                set(store, key).push((now + lease, head.id.clone()));
                published.push((head.channel, head.id));
            }
        }
    }
    published
}

/// Leases that expired go back: to waiters first. Returns how many expired.
pub fn reclaim(store: &mut RedisTwin, key: &str, now: u64, limit: u64, lease: u64) -> u64 {
    let leases = set(store, key);
    let before = leases.len();
    leases.retain(|(x, _)| *x > now);
    let reclaimed = (before - leases.len()) as u64;
    if reclaimed > 0 {
        hand_over(store, key, now, limit, lease);
    }
    reclaimed
}

/// Takes `id` out of the queue; true if it was there.
fn dequeue(store: &mut RedisTwin, key: &str, id: &str) -> bool {
    let queue = waiters(store, key);
    let before = queue.len();
    queue.retain(|w| w.id != id);
    queue.len() < before
}

/// The time until the soonest live lease expires, `None` without leases or
/// without waiters: when a waiting shim should reclaim.
pub fn soonest_expiry(store: &mut RedisTwin, key: &str, now: u64) -> Option<u64> {
    if waiters(store, key).is_empty() {
        return None;
    }
    set(store, key).first().map(|(x, _)| x.saturating_sub(now))
}

/// What `acquire` did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// It holds the lease.
    Leased,
    /// It waits in the queue; a lease expires in `soonest` µs.
    Queued { soonest: Option<u64> },
    /// Released before it arrived: it never takes a lease.
    Refused,
}

/// `lua/scripts/acquire.lua`: a free slot with nobody waiting is taken at once;
/// otherwise the request joins the queue behind everyone already in it.
#[allow(clippy::too_many_arguments)]
pub fn acquire(
    store: &mut RedisTwin,
    key: &str,
    now: u64,
    id: &str,
    limit: u64,
    lease: u64,
    wait: u64,
    channel: &str,
) -> (AcquireReply, u64) {
    let reclaimed = reclaim(store, key, now, limit, lease);
    hand_over(store, key, now, limit, lease);
    if tombstoned(store, key, now, id) {
        return (AcquireReply::Refused, reclaimed);
    }
    if (set(store, key).len() as u64) < limit && waiters(store, key).is_empty() {
        set(store, key).push((now + lease, id.to_string()));
        return (AcquireReply::Leased, reclaimed);
    }
    enqueue(store, key, now, id, wait, channel, Vec::new());
    (AcquireReply::Queued { soonest: soonest_expiry(store, key, now) }, reclaimed)
}

/// Puts `id` at the back of the queue until `now + wait`.
fn enqueue(
    store: &mut RedisTwin,
    key: &str,
    now: u64,
    id: &str,
    wait: u64,
    channel: &str,
    time: Vec<Waiting>,
) {
    let queue = waiters(store, key);
    let seq = queue.iter().map(|w| w.seq).max().map_or(now, |last| if last >= now { last + 1 } else { now });
    queue.push(Waiter { seq, id: id.to_string(), deadline: now + wait, channel: channel.to_string(), time });
}

/// `lua/scripts/take.lua`: a mixed waiting request at its time slot `at`, its time
/// limits reserved there (`held`: unused). It takes the concurrency slot if
/// one is free and nobody waits, and its time reservation is recorded as
/// sent; otherwise it gives its time reservation back (`cancel`) and queues
/// with its time limits, which the hand-over re-checks.
#[allow(clippy::too_many_arguments)]
pub fn take(
    store: &mut RedisTwin,
    key: &str,
    now: u64,
    id: &str,
    (limit, lease, wait): (u64, u64, u64),
    channel: &str,
    at: u64,
    time: &[Waiting],
    held: &[u64],
) -> (AcquireReply, u64) {
    let reclaimed = reclaim(store, key, now, limit, lease);
    hand_over(store, key, now, limit, lease);
    let reserved: Vec<Reserved> =
        time.iter().zip(held).map(|((k, alg, _), &h)| (k.clone(), *alg, (h > 0).then_some(h))).collect();
    if tombstoned(store, key, now, id) {
        cancel(store, now, id, at, &reserved);
        return (AcquireReply::Refused, reclaimed);
    }
    if (set(store, key).len() as u64) < limit && waiters(store, key).is_empty() {
        // A time reservation dropped (past its deadline) would make the send
        // go uncounted: refused.
        if !super::confirm::record(store, now, id, at, time) {
            cancel(store, now, id, at, &reserved);
            return (AcquireReply::Refused, reclaimed);
        }
        set(store, key).push((now + lease, id.to_string()));
        return (AcquireReply::Leased, reclaimed);
    }
    cancel(store, now, id, at, &reserved);
    enqueue(store, key, now, id, wait, channel, time.to_vec());
    (AcquireReply::Queued { soonest: soonest_expiry(store, key, now) }, reclaimed)
}

/// `lua/scripts/release.lua` on one lease set: ends lease `id` (true if it was
/// live), takes `id` out of the queue, tombstones it for one lease length,
/// and hands the freed slot over.
pub fn release(store: &mut RedisTwin, key: &str, now: u64, id: &str, limit: u64, lease: u64) -> bool {
    let leases = set(store, key);
    let before = leases.len();
    leases.retain(|(_, m)| m != id);
    let released = leases.len() < before;
    dequeue(store, key, id);
    let tombs = set(store, &format!("{key}:t"));
    tombs.retain(|(until, m)| *until > now && m != id);
    tombs.push((now + lease, id.to_string()));
    reclaim(store, key, now, limit, lease);
    hand_over(store, key, now, limit, lease);
    released
}

/// `lua/scripts/renew.lua`: lease `id`, while live, lasts another `lease` from
/// `now`. A lease already gone or expired is not taken again: renewing
/// never admits.
pub fn renew(store: &mut RedisTwin, key: &str, now: u64, id: &str, lease: u64) -> bool {
    let leases = set(store, key);
    match leases.iter_mut().find(|(expiry, m)| m == id && *expiry > now) {
        Some(entry) => {
            entry.0 = now + lease;
            true
        }
        None => false,
    }
}

/// `lua/scripts/leave.lua`: a waiter whose wait ran out, or whose client went away,
/// leaves the queue; a slot it was handed meanwhile passes on. 1: it was
/// queued, 2: it passed a slot on, 0: neither.
pub fn leave(store: &mut RedisTwin, key: &str, now: u64, id: &str, limit: u64, lease: u64) -> u8 {
    if dequeue(store, key, id) {
        return 1;
    }
    let leases = set(store, key);
    let before = leases.len();
    leases.retain(|(_, m)| m != id);
    if leases.len() < before {
        reclaim(store, key, now, limit, lease);
        hand_over(store, key, now, limit, lease);
        return 2;
    }
    0
}

/// `lua/scripts/reclaim.lua`: expired leases back to the waiters; then when the
/// next timer should fire.
pub fn reclaim_timer(
    store: &mut RedisTwin,
    key: &str,
    now: u64,
    limit: u64,
    lease: u64,
) -> (u64, Option<u64>) {
    let reclaimed = reclaim(store, key, now, limit, lease);
    // A slot may also be free without an expiry (a refund on a cluster).
    hand_over(store, key, now, limit, lease);
    (reclaimed, soonest_expiry(store, key, now))
}
