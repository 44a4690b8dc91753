//! `gcra`: the generic cell rate algorithm, for token buckets, leaky buckets,
//! intervals and points. Twin of `lua/lib/gcra.lua`.
//!
//! The state is one time, the theoretical arrival time `tat`: when the bucket
//! would be full again. One unit refills every `interval`; the bucket holds
//! `burst` units, which take `tau = interval * burst` to refill. A request of
//! `cost` units moves `tat` on by `cost * interval`, and passes if then
//! `tat - now <= tau`. Over any interval `t`, at most `burst + t / interval`
//! units pass.

use super::slot::{Committed, Slot};
use super::{Correction, Found, Grant, RedisTwin, State, View};

pub fn check(state: Option<&State>, now: u64, interval: u64, burst: u64, cost: u64) -> Found {
    let tau = interval * burst;
    let stored = match state {
        Some(&State::Tat(tat)) => tat,
        _ => now,
    };
    let tat = stored.max(now);
    let new_tat = tat.saturating_add(cost.saturating_mul(interval));
    let allowed = new_tat - now <= tau;
    // A cost beyond the whole bucket never passes: its wait is unknown.
    let retry = if allowed {
        Some(0)
    } else if cost.saturating_mul(interval) > tau {
        None
    } else {
        Some(new_tat - tau - now)
    };
    Found {
        allowed,
        // A charge after the fact can leave tat beyond now + tau: nothing remains.
        now: View { remaining: (now + tau).saturating_sub(tat) / interval, reset_us: tat - now },
        after: View { remaining: (now + tau).saturating_sub(new_tat) / interval, reset_us: new_tat - now },
        retry_us: retry,
        reclaimed: 0,
        held_until: Some(new_tat),
        pruned: None,
        commit: Some(State::Tat(new_tat)),
    }
}

/// `lua/scripts/adjust.lua`: charges `c.delta` more units (or refunds, when
/// negative) once the true cost is known. Returns the new `tat`, the
/// microseconds refunded, which the bucket's `refunded` counter adds up,
/// and where the refunded charge ended before (for the refund log).
///
/// The request's charge held the bucket until `c.held_until_us` when it was
/// made; the refunds since of charges made before it moved it earlier
/// (`settle::charge_end`, from the refund `log` and the counter at its
/// check, `c.refunded_us`). A refund returns at most the part of the charge
/// still after `now`: what the bucket has refilled since was never the
/// request's to give back. A refund never fills the bucket beyond full.
pub fn adjust(
    state: Option<&State>,
    refunded: u64,
    log: &[(u64, u64, u64)],
    now: u64,
    c: &Correction,
) -> (u64, u64, u64) {
    let stored = match state {
        Some(&State::Tat(tat)) => tat,
        _ => now,
    };
    let tat = stored.max(now);
    let change = c.delta.unsigned_abs().saturating_mul(c.interval_us);
    if c.delta >= 0 {
        return (tat.saturating_add(change), 0, 0);
    }
    // A counter below the one the check saw went with an idle bucket (its
    // key expired): nothing of the charge is left.
    if refunded < c.refunded_us {
        return (tat, 0, 0);
    }
    let end = super::settle::charge_end(log, c.held_until_us, c.refunded_us, refunded);
    let new_tat = tat.saturating_sub(change.min(end.saturating_sub(now))).max(now);
    (new_tat, tat - new_tat, end)
}

/// Waiting (`reserve`, `confirm`, `cancel`). Beside `tat`, a bucket that
/// requests wait on keeps what is held, so that a late send shifts the
/// waiters behind it instead of reordering them, and give-backs in any
/// order leave no phantom slot: the held reservations ([`State::Held`],
/// Redis `key:held` and `key:need`) and the real sends' `tat` with `tat` as
/// waiting left it ([`State::Sent`], Redis `key:sent`). `tat` is then the
/// chain ([`walk`]): from the sends' `tat`, each held reservation in slot
/// order, at no earlier than its slot nor than the one before allows with
/// its margin. A `tat` moved by anyone else (a check decided at once, a
/// refund) is taken into the sends' `tat`, bounded by the new `tat`
/// ([`load`]). A held reservation past its deadline and [`HELD_GRACE`] was
/// never sent: it drops out of the chain. So does one that a late send
/// pushes past its deadline ([`confirm`]): it is refused then, not at its
/// slot.
pub const HELD_GRACE: u64 = 1_000_000;

/// One held reservation: its request, slot, charge, margin, deadline, the
/// bucket's tolerance when it was made, and whether it is a mixed
/// request's (recorded as sent at its take, whatever is due: never pushed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub id: String,
    pub slot: u64,
    pub need: u64,
    pub margin: u64,
    pub deadline: u64,
    pub tau: u64,
    pub mixed: bool,
}

pub fn held_key(key: &str) -> String {
    format!("{key}:held")
}

pub fn sent_key(key: &str) -> String {
    format!("{key}:sent")
}

/// The held reservations of `key`, in slot order (Redis's: by score, then member).
pub fn held(store: &RedisTwin, key: &str) -> Vec<Hold> {
    let mut held = match store.keys.get(&held_key(key)) {
        Some(State::Held(h)) => h.clone(),
        _ => Vec::new(),
    };
    held.sort_by(|a, b| (a.slot, &a.id).cmp(&(b.slot, &b.id)));
    held
}

/// `tat`, and the real sends' `tat`, taking in a move by anyone else;
/// whether it moved.
fn load(store: &RedisTwin, key: &str, now: u64) -> (u64, u64, bool) {
    let stored = match store.keys.get(key) {
        Some(&State::Tat(t)) => Some(t),
        _ => None,
    };
    let sent = match store.keys.get(&sent_key(key)) {
        Some(&State::Sent { base, end }) => Some((base, end)),
        _ => None,
    };
    let tat = stored.or(sent.map(|(_, e)| e)).unwrap_or(now);
    match sent {
        None => (tat, tat, false),
        Some((base, e)) if tat == e => (tat, base, false),
        Some((base, e)) if tat > e => (tat, (base.max(now) + (tat - e)).min(tat), true),
        // Moved earlier (a refund, a lease given back): the real sends take the
        // whole move, never below now unless they already were.
        Some((base, e)) => (tat, base.saturating_sub(e - tat).max(base.min(now)), true),
    }
}

/// A held request a send pushed past its deadline, and its place then.
pub type Pushed = (String, u64);

/// The chain walked from the real sends' `tat`.
#[derive(Debug, Default)]
pub struct Chain {
    /// Its end: the bucket's `tat`.
    pub end: u64,
    /// The held ids that dropped out.
    pub gone: Vec<String>,
    /// The time held request `who` (if any, and still in the chain) may be
    /// sent at: its place, shifted by whatever was late before it.
    pub due: Option<u64>,
    /// If `refuse` (after a send): those it pushes past their deadlines,
    /// each with its place; they are among `gone`.
    pub pushed: Vec<Pushed>,
}

/// The chain from `base` over `held` ([`Chain`]).
pub fn walk(held: &[Hold], now: u64, base: u64, who: Option<&str>, refuse: bool) -> Chain {
    let mut chain = Chain { end: base, ..Chain::default() };
    for h in held {
        if h.deadline + HELD_GRACE < now {
            chain.gone.push(h.id.clone());
            continue;
        }
        let place = h.slot.max((chain.end + h.need + h.margin).saturating_sub(h.tau));
        if refuse && !h.mixed && place > h.deadline {
            chain.gone.push(h.id.clone());
            chain.pushed.push((h.id.clone(), place));
            continue;
        }
        if who == Some(h.id.as_str()) {
            chain.due = Some(place);
        }
        // Still held, so not sent yet: it goes at `now` at the earliest, and
        // whatever it is late by shifts those behind it; one behind a late
        // one never goes first.
        chain.end = chain.end.max(place).max(now) + h.need;
    }
    chain
}

/// What waiting stores: `tat`, the sends' `tat`, and the held reservations.
fn save(tat: u64, base: u64, held: Vec<Hold>) -> Vec<(String, State)> {
    vec![
        (String::new(), State::Tat(tat)),
        (sent_key(""), State::Sent { base, end: tat }),
        (held_key(""), State::Held(held)),
    ]
}

/// Writes [`save`]'s states under `key`.
pub fn store_saved(store: &mut RedisTwin, key: &str, saved: Vec<(String, State)>) {
    for (suffix, state) in saved {
        store.keys.insert(format!("{key}{suffix}"), state);
    }
}

/// Waiting (`reserve`): the earliest `t` at or after `now` (and at or after
/// every held slot: arrival order) at which the bucket takes the request
/// with `margin` to spare: `cost * interval <= tau` and `tat - t <= tau -
/// cost * interval - margin` (for margin 0, `check`'s rule). The partner's
/// own bucket may see our requests up to `margin` late; its tolerance is
/// then `margin` smaller. Committed at `t = now` it is sent at once (unless
/// `hold`); else it is held until `deadline`, and `tat` moves on from
/// `max(tat, t)`. A
/// cost beyond the whole bucket never passes (`at: None`).
#[allow(clippy::too_many_arguments)]
pub fn reserve(
    store: &RedisTwin,
    key: &str,
    now: u64,
    id: &str,
    (interval, burst, cost): (u64, u64, u64),
    margin: u64,
    (deadline, hold): (u64, bool),
) -> Slot {
    let tau = interval * burst;
    let held = held(store, key);
    let (stored, base, moved) = load(store, key, now);
    let tat = if moved { walk(&held, now, base, None, false).end } else { stored };
    let last = held.last().map_or(now, |h| h.slot);
    let need = cost.saturating_mul(interval);
    let at = (need <= tau).then(|| now.max(last).max((tat + need + margin).saturating_sub(tau)));
    let id = id.to_string();
    Slot {
        at,
        remaining_now: (now + tau).saturating_sub(tat.max(now)) / interval,
        pruned: None,
        commit: Box::new(move |t| {
            let mut held = held.clone();
            let (new_tat, base) = if t <= now && !hold {
                let base = base.max(now) + need;
                (walk(&held, now, base, None, false).end, base)
            } else {
                held.retain(|h| h.id != id);
                held.push(Hold { id: id.clone(), slot: t, need, margin, deadline, tau, mixed: hold });
                (tat.max(t) + need, base)
            };
            let mut saved = save(new_tat, base, held);
            let (_, state) = saved.remove(0);
            Committed {
                state,
                view: View { remaining: (t + tau).saturating_sub(new_tat) / interval, reset_us: new_tat - t },
                held_until: Some(new_tat),
                extra: saved,
            }
        }),
    }
}

/// At its slot (`confirm`): the held request `id` may be sent at its place
/// in the chain walked from the real sends: `due = max(slot, end of those
/// before it + need + margin - tau)`, so it never goes before those ahead of
/// it nor closer than its margin allows to the last real send. Sent, `s`
/// moves on from `max(s, now)` and the chain is walked again, so a late send
/// shifts those behind it; those it pushes past their deadlines drop out,
/// named for their shims to refuse at once. `None` when `id` is not held
/// (given back, or dropped past its deadline). The due time, what to store
/// once sent, and whom that send pushes out.
pub fn confirm(store: &RedisTwin, key: &str, now: u64, id: &str) -> Option<Confirm> {
    let mut held = held(store, key);
    let (_, base, _) = load(store, key, now);
    let due = walk(&held, now, base, Some(id), false).due?;
    let me = held.iter().position(|h| h.id == id)?;
    let r = held.remove(me);
    let base = base.max(now) + r.need;
    let chain = walk(&held, now, base, None, true);
    held.retain(|h| !chain.gone.contains(&h.id));
    Some(Confirm { due, saved: save(chain.end, base, held), pushed: chain.pushed })
}

/// A held request at its slot ([`confirm`]).
pub struct Confirm {
    /// When it may be sent.
    pub due: u64,
    /// What to store once sent.
    pub saved: Vec<(String, State)>,
    /// Those that send pushes past their deadlines.
    pub pushed: Vec<Pushed>,
}

/// Cancellation (`cancel`): a held reservation given back leaves the chain,
/// which is walked again: any give-backs, in any order, leave the state as
/// if they had never been made, with the reservations still held where
/// they are.
pub fn cancel(store: &mut RedisTwin, key: &str, now: u64, id: &str) {
    let mut held = held(store, key);
    let Some(me) = held.iter().position(|h| h.id == id) else { return };
    held.remove(me);
    let (_, base, _) = load(store, key, now);
    let chain = walk(&held, now, base, None, false);
    held.retain(|h| !chain.gone.contains(&h.id));
    store_saved(store, key, save(chain.end, base, held));
}

/// Leased mode (`lease_bucket`): the lease period of `period` µs (the
/// policy's `leased.ttl`, aligned to the epoch) that holds `now`: its index
/// and its end. A lease belongs to the period it is granted in.
pub fn lease_period(now: u64, period: u64) -> (u64, u64) {
    let index = now / period;
    (index, (index + 1).saturating_mul(period))
}

/// Leased mode: up to `want` of the tokens the bucket holds at `now`, all
/// charged as if spent at the end of now's lease period: `tat` moves to
/// `max(tat, end) + granted × interval`, and the gateway spends none of
/// them from the end on. Exact: a token spent earlier than charged can only
/// lower the bucket's true arrival time below the charged one, and every
/// token was in the bucket at the grant (`core/tests/leased_exact.rs`).
/// Charged at the grant instead, a token spent later would bunch with the
/// requests admitted once the bucket refilled. What it costs: the bucket
/// refills from the period's end, not from the grant (at most `ttl` of
/// refill per period, none while the bucket's charges already reach
/// beyond the end). The grant, and the `tat` and horizon (the latest end a
/// lease was charged at) to store if it granted any.
pub fn lease_grant(
    state: Option<&State>,
    horizon: u64,
    now: u64,
    (interval, burst): (u64, u64),
    period: u64,
    want: u64,
) -> (Grant, Option<(State, State)>) {
    let tau = interval.saturating_mul(burst);
    let (index, end) = lease_period(now, period);
    let tat = match state {
        Some(&State::Tat(tat)) => tat.max(now),
        _ => now,
    };
    let granted = want.min((now + tau).saturating_sub(tat) / interval);
    let new_tat = if granted > 0 { tat.max(end) + granted * interval } else { tat };
    let grant = Grant {
        granted,
        window: index,
        expires_in_us: end - now,
        remaining: (now + tau).saturating_sub(new_tat) / interval,
    };
    (grant, (granted > 0).then_some((State::Tat(new_tat), State::Horizon(horizon.max(end)))))
}

/// Leased mode: takes back `tokens` a gateway never spent of its leases of
/// period `window`, of which it held `charged` (spent or not, at least
/// `tokens`). At most `tokens × interval`, and at most `end + charged ×
/// interval − max(horizon, now)`: those leases were charged at the period's
/// `end`, so they moved the bucket's true arrival time to at least `end +
/// charged × interval`, and every charge since was made at a time no later
/// than `max(horizon, now)` (exact checks at their time, leases at their
/// period's end, the horizon the latest): a give-back of that much reaches
/// through all of them exactly, where more could take back refill the
/// bucket had already given. Only for a period that has begun and ended
/// less than a period ago (the calls' record, which keeps a call sent again
/// from being taken twice, lives that long); never below `now`. The `tat`
/// to store, if it moves.
pub fn lease_give_back(
    state: Option<&State>,
    horizon: u64,
    now: u64,
    (interval, period): (u64, u64),
    window: u64,
    (tokens, charged): (u64, u64),
) -> Option<State> {
    let (current, _) = lease_period(now, period);
    let end = window.saturating_add(1).saturating_mul(period);
    if window > current || now >= end.saturating_add(period) {
        return None;
    }
    let Some(&State::Tat(tat)) = state else { return None };
    let reach =
        end.saturating_add(charged.max(tokens).saturating_mul(interval)).saturating_sub(horizon.max(now));
    let back = tokens.saturating_mul(interval).min(reach);
    (tat > now && back > 0).then(|| State::Tat(tat.saturating_sub(back).max(now)))
}
