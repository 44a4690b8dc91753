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
use super::{Correction, Found, Grant, State, View};

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
/// negative) once the true cost is known. Returns the new `tat` and the
/// microseconds refunded, which the bucket's `refunded` counter adds up.
///
/// The request's charge held the bucket until `c.held_until_us` when it was
/// made. Refunds since then of requests charged before it moved it earlier,
/// by at most what the bucket has refunded since (`refunded`, against the
/// counter at its check, `c.refunded_us`). A refund returns at most the part
/// of the charge still after `now`: what the bucket has refilled since was
/// never the request's to give back. A refund never fills the bucket beyond
/// full.
pub fn adjust(state: Option<&State>, refunded: u64, now: u64, c: &Correction) -> (u64, u64) {
    let stored = match state {
        Some(&State::Tat(tat)) => tat,
        _ => now,
    };
    let tat = stored.max(now);
    let change = c.delta.unsigned_abs().saturating_mul(c.interval_us);
    if c.delta >= 0 {
        return (tat.saturating_add(change), 0);
    }
    // A counter below the one the check saw went with an idle bucket (its
    // key expired): nothing of the charge is left.
    let Some(moved) = refunded.checked_sub(c.refunded_us) else {
        return (tat, 0);
    };
    let held_until = c.held_until_us.saturating_sub(moved);
    let new_tat = tat.saturating_sub(change.min(held_until.saturating_sub(now))).max(now);
    (new_tat, tat - new_tat)
}

/// Waiting (`reserve`): the earliest `t` at or after `now` at which the
/// bucket takes the request with `margin` to spare: `cost * interval <= tau`
/// and `tat - t <= tau - cost * interval - margin`, on the stored `tat` (for
/// margin 0, `check`'s rule). The partner's own bucket may see our requests
/// up to `margin` late; its tolerance is then `margin` smaller. Committed at
/// `t`, `tat` moves on from `max(tat, t)`. A cost beyond the whole bucket
/// never passes (`at: None`).
pub fn reserve(state: Option<&State>, now: u64, interval: u64, burst: u64, cost: u64, margin: u64) -> Slot {
    let tau = interval * burst;
    let tat = match state {
        Some(&State::Tat(tat)) => tat,
        _ => now,
    };
    let need = cost.saturating_mul(interval);
    let at = (need <= tau).then(|| now.max((tat + need + margin).saturating_sub(tau)));
    Slot {
        at,
        remaining_now: (now + tau).saturating_sub(tat.max(now)) / interval,
        pruned: None,
        commit: Box::new(move |t| {
            let new_tat = tat.max(t) + need;
            Committed {
                state: State::Tat(new_tat),
                view: View { remaining: (t + tau).saturating_sub(new_tat) / interval, reset_us: new_tat - t },
                held_until: Some(new_tat),
            }
        }),
    }
}

/// Cancellation (`cancel`): moves `tat` back by the request's charge only
/// while it is still exactly the `tat` this reservation set (the newest).
pub fn cancel(state: Option<&mut State>, held_until: u64, interval: u64, cost: u64) {
    if let Some(State::Tat(tat)) = state {
        if *tat == held_until {
            *tat = held_until - cost * interval;
        }
    }
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
