//! The reference model of every limit type: the Lua scripts in `lua/`, line
//! by line, over an in-memory store and an explicit clock. Each module here
//! has a Lua twin of the same name; the differential tests run both on the
//! same requests and require the same decisions, remaining counts and waits.
//!
//! A check is all or nothing: phase 1 asks every limit, changing nothing but
//! expired state; only if all allow does phase 2 charge every one of them
//! (or whatever they said, when refusals are counted: [`Refusals`]).
//!
//! Times are integer microseconds. Results are in milliseconds, rounded up.

pub mod calendar;
pub mod cancel;
pub mod concurrency;
pub mod confirm;
pub mod counter;
pub mod first_hit;
pub mod fixed_window;
pub mod gcra;
pub mod pause;
pub mod queue;
pub mod rate;
pub mod refund;
pub mod reserve;
pub mod settle;
pub mod sliding_approx;
pub mod sliding_window;
pub mod slot;

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::feedback::Slowdown;
use crate::limit::WireLimit;
use crate::units::{is_zero, per_unit, Micros, Millis};

/// A limit as its algorithm takes it, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// A request costs `cost` (1, or an RLS call's `hits_addend`).
    FixedWindow {
        limit: u64,
        window_us: Micros,
        cost: u64,
    },
    SlidingWindow {
        limit: u64,
        window_us: Micros,
    },
    SlidingApprox {
        limit: u64,
        window_us: Micros,
    },
    /// One unit every `interval_us`, at most `burst` saved up; a request costs `cost` units.
    Gcra {
        interval_us: Micros,
        burst: u64,
        cost: u64,
    },
    Concurrency {
        limit: u64,
        lease_us: Micros,
    },
    /// A counter per calendar window (`calendar`): `fixed_window` (cost 1)
    /// and `points` on a calendar; `points` tells them apart in the state key.
    Calendar {
        limit: u64,
        cost: u64,
        calendar: crate::calendar::Calendar,
        points: bool,
    },
    /// `fixed_window` with `start: first_hit`: a window of `window_us` from
    /// the first request a key counts once its last window ended; a request
    /// costs `cost`.
    FirstHit {
        limit: u64,
        window_us: Micros,
        cost: u64,
    },
    /// The partner's pause (upstream feedback): one more limit on the checks
    /// of a policy that reads it. Never from the policy's own limits.
    Pause,
    /// The rate the partner's refusals taught us (upstream feedback): it
    /// scales the other limits of its check (`rate`). Never from the
    /// policy's own limits.
    Rate,
}

impl Algorithm {
    /// The token, leaky and interval buckets and points are all GCRA. The
    /// time per unit is rounded up to a whole microsecond, so a bucket never
    /// refills faster than asked.
    pub fn of(limit: &WireLimit) -> Algorithm {
        match *limit {
            WireLimit::FixedWindow { limit, window_ms, cost } => Algorithm::FixedWindow {
                limit: limit.into(),
                window_us: window_ms.as_micros(),
                cost: cost.into(),
            },
            WireLimit::SlidingWindow { limit, window_ms, approximate: false } => {
                Algorithm::SlidingWindow { limit: limit.into(), window_us: window_ms.as_micros() }
            }
            WireLimit::SlidingWindow { limit, window_ms, approximate: true } => {
                Algorithm::SlidingApprox { limit: limit.into(), window_us: window_ms.as_micros() }
            }
            WireLimit::TokenBucket { rate, per_ms, burst } => {
                Algorithm::Gcra { interval_us: per_unit(per_ms, rate), burst: burst.into(), cost: 1 }
            }
            WireLimit::LeakyBucket { capacity, drain_ms } => {
                Algorithm::Gcra { interval_us: per_unit(drain_ms, capacity), burst: capacity.into(), cost: 1 }
            }
            WireLimit::Interval { every_ms } => {
                Algorithm::Gcra { interval_us: every_ms.as_micros(), burst: 1, cost: 1 }
            }
            WireLimit::Concurrency { limit, lease_ms } => {
                Algorithm::Concurrency { limit: limit.into(), lease_us: lease_ms.as_micros() }
            }
            WireLimit::Points { capacity, refill_ms, cost } => Algorithm::Gcra {
                interval_us: per_unit(refill_ms, capacity),
                burst: capacity.into(),
                cost: cost.into(),
            },
            WireLimit::CalendarWindow { limit, calendar, cost } => {
                Algorithm::Calendar { limit: limit.into(), cost: cost.into(), calendar, points: false }
            }
            WireLimit::CalendarPoints { capacity, cost, calendar } => {
                Algorithm::Calendar { limit: capacity.into(), cost: cost.into(), calendar, points: true }
            }
            WireLimit::FirstHitWindow { limit, window_ms, cost } => Algorithm::FirstHit {
                limit: limit.into(),
                window_us: window_ms.as_micros(),
                cost: cost.into(),
            },
        }
    }

    /// Whether it is a window's counter (`fixed_window`: aligned to the
    /// epoch, from the first hit, or on a calendar): the kinds that can
    /// count a refused cost ([`Refusals::Counted`]).
    pub fn is_window(&self) -> bool {
        matches!(
            self,
            Algorithm::FixedWindow { .. }
                | Algorithm::FirstHit { .. }
                | Algorithm::Calendar { points: false, .. }
        )
    }

    /// Its state's key name under `prefix` (a check's hash tag, or a
    /// level's key within it: `wire::Check::state_prefix`):
    /// `<prefix>:<suffix>`, the one place the name is put together.
    pub fn state_key(&self, prefix: &str) -> String {
        format!("{prefix}:{}", self.state_suffix())
    }

    /// The end of its state's key name. Two limits with the same suffix in
    /// one policy would share state, so a policy may not have them.
    pub fn state_suffix(&self) -> String {
        match *self {
            Algorithm::FixedWindow { window_us, .. } => format!("fw:{}", window_us.get() / 1000),
            Algorithm::SlidingWindow { window_us, .. } => format!("sw:{}", window_us.get() / 1000),
            Algorithm::SlidingApprox { window_us, .. } => format!("sa:{}", window_us.get() / 1000),
            Algorithm::Gcra { interval_us, .. } => format!("gcra:{}", interval_us.get()),
            Algorithm::Concurrency { lease_us, .. } => format!("cc:{}", lease_us.get() / 1000),
            Algorithm::Calendar { calendar, points: false, .. } => format!("cw:{}", calendar.state_name()),
            Algorithm::Calendar { calendar, points: true, .. } => format!("cp:{}", calendar.state_name()),
            Algorithm::FirstHit { window_us, .. } => format!("fh:{}", window_us.get() / 1000),
            Algorithm::Pause => "pause".to_string(),
            Algorithm::Rate => "rate".to_string(),
        }
    }

    /// The script's name for it and its four numbers, as `lua/scripts/check.lua`
    /// reads them, for a call made at `now_us` on the caller's clock (a
    /// calendar's two window ends are placed around it).
    pub fn script_args(&self, now_us: u64) -> (&'static str, [u64; 4]) {
        match *self {
            Algorithm::FixedWindow { limit, window_us, cost } => {
                ("fixed_window", [limit, window_us.get(), cost, 0])
            }
            Algorithm::SlidingWindow { limit, window_us } => {
                ("sliding_window", [limit, window_us.get(), 0, 0])
            }
            Algorithm::SlidingApprox { limit, window_us } => {
                ("sliding_approx", [limit, window_us.get(), 0, 0])
            }
            Algorithm::Gcra { interval_us, burst, cost } => ("gcra", [interval_us.get(), burst, cost, 0]),
            Algorithm::Concurrency { limit, lease_us } => ("concurrency", [limit, lease_us.get(), 0, 0]),
            Algorithm::Calendar { limit, cost, calendar, .. } => {
                let (e1, e2) = calendar.ends_near(now_us).unwrap_or((0, 0));
                ("calendar", [limit, cost, e1, e2])
            }
            Algorithm::FirstHit { limit, window_us, cost } => {
                ("first_hit", [limit, window_us.get(), cost, 0])
            }
            Algorithm::Pause => ("pause", [0, 0, 0, 0]),
            Algorithm::Rate => ("rate", [0, 0, 0, 0]),
        }
    }
}

/// The state one key holds, as the script keeps it in Redis.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// fixed_window: the window index and its count (a hash `w`, `n`).
    Counter { window: u64, count: u64 },
    /// sliding_window and concurrency: (score, member) pairs (a sorted set).
    Set(Vec<(u64, String)>),
    /// sliding_approx: the window index, its count and the previous one's (a hash `w`, `c`, `p`).
    Approx { window: u64, current: u64, previous: u64 },
    /// gcra: the theoretical arrival time (a string).
    Tat(u64),
    /// concurrency: the requests waiting for a slot (Redis: `:q`, `:d`, `:w`).
    Queue(Vec<queue::Waiter>),
    /// pause: until when the partner asked us to stop (a string).
    Pause(u64),
    /// rate: the factor in parts per million set at `at`, climbing back
    /// over `recover_us` (a hash `f`, `t`, `r`).
    Rate { factor: u64, at: u64, recover_us: u64 },
    /// gcra, beside the `tat` (Redis: `:r`): the microseconds refunds have
    /// given back so far, which tells a later refund which refunds came
    /// after its charge (`adjust`, `settle`).
    Refunded(u64),
    /// gcra, beside the `tat` (Redis: `:g`): the refund log, (the counter
    /// before, the end of the charge refunded, the µs given back) per
    /// refund, oldest first (`settle`).
    Given(Vec<(u64, u64, u64)>),
    /// A points limit's key (Redis: `:s`): the ids of the settlements
    /// applied to it, with when (`settle`).
    Settled(BTreeMap<String, u64>),
    /// lease: each gateway's last lease call, by its id: (its sequence
    /// number, the window index it ran in, the tokens it granted) (a hash
    /// of "seq window granted" strings, `lease_calls_key`).
    Calls(BTreeMap<String, (u64, u64, u64)>),
    /// lease_bucket: the latest end of a lease period a lease was charged
    /// at (Redis: `:h`, beside the bucket's `tat`; `gcra::lease_give_back`).
    Horizon(u64),
    /// gcra, waiting: the held reservations (Redis: `:held`, ids by slot,
    /// and `:need`, each one's charge, margin, deadline and tolerance).
    Held(Vec<gcra::Hold>),
    /// gcra, waiting: the real sends' `tat`, and `tat` as waiting last
    /// stored it (Redis: `:sent`, a hash `s`, `e`).
    Sent { base: u64, end: u64 },
}

/// The key of a bucket's refund counter ([`State::Refunded`]).
pub fn refunded_key(key: &str) -> String {
    format!("{key}:r")
}

/// A bucket's refund counter, 0 before its first refund.
pub fn refunded(store: &RedisTwin, key: &str) -> u64 {
    match store.keys.get(&refunded_key(key)) {
        Some(&State::Refunded(us)) => us,
        _ => 0,
    }
}

/// A points correction, as `lua/scripts/adjust.lua` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Correction {
    pub key: String,
    /// The settlement's id: applied once per key (`settle`).
    pub id: Option<String>,
    /// A bucket's time per unit; 0 for a calendar window's counter, which
    /// takes the correction into the window `held_until_us` names.
    pub interval_us: u64,
    /// Units to charge (positive) or refund (negative).
    pub delta: i64,
    /// The admitted check's `held_until_us`; 0 when unknown, which lets a
    /// refund return nothing.
    pub held_until_us: u64,
    /// The admitted check's `refunded_us`.
    pub refunded_us: u64,
}

/// The model's Redis, the in-memory twin every script's state lives in
/// here: state by key. Expiry is not modelled: every key's TTL
/// outlives the state that still matters, so a key Redis has dropped reads
/// the same as one the model keeps.
#[derive(Debug, Clone, Default)]
pub struct RedisTwin {
    pub keys: HashMap<String, State>,
}

/// What phase 1 found for one limit.
pub struct Found {
    pub allowed: bool,
    /// The view without this request: what the reply shows if it is denied.
    pub now: View,
    /// The view after charging this request: what the reply shows if admitted.
    pub after: View,
    /// Microseconds until the request fits; `None` when unknown (concurrency).
    pub retry_us: Option<u64>,
    pub reclaimed: u64,
    /// gcra: the time the request's charge holds the bucket until, if admitted.
    pub held_until: Option<u64>,
    /// The state with its expired entries removed, stored whatever the decision.
    pub pruned: Option<State>,
    /// The state to store if every limit allows.
    pub commit: Option<State>,
}

impl Found {
    /// A limit that charges nothing and stores nothing (the partner's pause
    /// and rate): the same view with or without the request.
    pub fn uncharged(allowed: bool, view: View, retry_us: u64) -> Found {
        Found {
            allowed,
            now: view,
            after: view,
            retry_us: Some(retry_us),
            reclaimed: 0,
            held_until: None,
            pruned: None,
            commit: None,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct View {
    pub remaining: u64,
    pub reset_us: u64,
}

/// One limit's answer in a check's reply, as the shim sends it on.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, borsh::BorshSerialize, borsh::BorshDeserialize,
)]
#[serde(deny_unknown_fields)]
pub struct LimitOutcome {
    pub allowed: bool,
    /// Requests this limit would still admit after this one.
    pub remaining: u64,
    /// Until this limit next frees capacity.
    pub reset_ms: Millis,
    /// Until this limit would admit the request; 0 if it did; `None` when
    /// unknown.
    pub retry_after_ms: Option<Millis>,
    /// Expired leases this check reclaimed: their holders died without releasing.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reclaimed: u64,
    /// An admitted `points` limit: the time, in microseconds on the shim's
    /// clock, until which this request's charge holds in the bucket. A later
    /// refund can give back at most what is left of it: what the bucket has
    /// refilled since was never the request's to return.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_until_us: Option<Micros>,
    /// With `held_until_us`: what the bucket's refunds had given back so
    /// far, in microseconds, when this charge was made. Refunds since then
    /// of earlier charges moved this one earlier; the counter tells a later
    /// refund by how much at most.
    #[serde(default, skip_serializing_if = "Micros::is_zero")]
    pub refunded_us: Micros,
}

/// Microseconds to milliseconds, rounded up ([`Micros::ceil_millis`]), as
/// `ceil_ms` in `lua/lib/common.lua` rounds them.
pub fn ceil_ms(us: u64) -> Millis {
    Micros(us).ceil_millis()
}

/// Leased mode (`lease`, `lease_bucket`): what a grant gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub granted: u64,
    /// The index of the window (a bucket's: the lease period) the tokens
    /// belong to.
    pub window: u64,
    /// Microseconds from now to its end.
    pub expires_in_us: u64,
    /// What the window (the bucket) has left after the grant.
    pub remaining: u64,
}

/// The decision on one request: the reply of `lua/scripts/check.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReply {
    pub allowed: bool,
    /// `None` when admitted, or when some denying limit cannot say.
    pub retry_after_ms: Option<Millis>,
    pub limits: Vec<LimitOutcome>,
}

/// What a refused request is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Refusals {
    /// Nothing: a check is all or nothing.
    #[default]
    Uncharged,
    /// Its cost, in every limit, as an admitted one's: each window counts
    /// it, past its limit (the RLS face's `charge: every_hit`). Windows
    /// only: the shim refuses it beside any other kind of limit.
    Counted,
}

/// `lua/scripts/check.lua`: decides every limit at once, all or nothing.
pub fn check(store: &mut RedisTwin, now: u64, id: &str, limits: &[(String, Algorithm)]) -> CheckReply {
    check_viewing(store, now, id, limits, true, Refusals::Uncharged)
}

/// [`check`], with the views the caller reads (`wire::Views`): without
/// `reset_when_admitted`, an admitted request's limits carry `reset_ms` 0;
/// and what a refusal is charged (`wire::COUNT_REFUSED`).
pub fn check_viewing(
    store: &mut RedisTwin,
    now: u64,
    id: &str,
    limits: &[(String, Algorithm)],
    reset_when_admitted: bool,
    refusals: Refusals,
) -> CheckReply {
    // Phase 1: check. Expired leases go back, to waiters first (queue.lua).
    let reclaimed: Vec<(u64, bool)> = limits
        .iter()
        .map(|(key, alg)| match *alg {
            Algorithm::Concurrency { limit, lease_us } => {
                let reclaimed = queue::reclaim(store, key, now, limit, lease_us.get());
                (reclaimed, queue::tombstoned(store, key, now, id))
            }
            _ => (0, false),
        })
        .collect();
    // The partner's refusals scale the limits of their check first.
    let scaled = rate::apply(|k| store.keys.get(k).cloned(), now, limits);
    let found: Vec<Found> = limits
        .iter()
        .zip(&scaled)
        .zip(&reclaimed)
        .map(|(((key, _), alg), &(reclaimed, tombstoned))| {
            let state = store.keys.get(key);
            match *alg {
                Algorithm::FixedWindow { limit, window_us, cost } => {
                    fixed_window::check(state, now, limit, window_us.get(), cost)
                }
                Algorithm::SlidingWindow { limit, window_us } => {
                    sliding_window::check(state, now, id, limit, window_us.get())
                }
                Algorithm::SlidingApprox { limit, window_us } => {
                    sliding_approx::check(state, now, limit, window_us.get())
                }
                Algorithm::Gcra { interval_us, burst, cost } => {
                    gcra::check(state, now, interval_us.get(), burst, cost)
                }
                Algorithm::Concurrency { limit, lease_us } => {
                    concurrency::check(state, now, id, limit, lease_us.get(), reclaimed, tombstoned)
                }
                Algorithm::Calendar { limit, cost, calendar, .. } => {
                    calendar::check(state, now, limit, cost, calendar.ends_near(now).unwrap_or((0, 0)))
                }
                Algorithm::FirstHit { limit, window_us, cost } => {
                    first_hit::check(state, now, limit, window_us.get(), cost)
                }
                Algorithm::Pause => pause::check(state, now),
                Algorithm::Rate => rate::check(state, now),
            }
        })
        .collect();
    let allowed = found.iter().all(|f| f.allowed);
    for ((key, _), f) in limits.iter().zip(&found) {
        if let Some(state) = &f.pruned {
            store.keys.insert(key.clone(), state.clone());
        }
    }
    // Phase 2: commit, only if every limit allowed, or whatever they said
    // when refusals are counted.
    let charged = allowed || refusals == Refusals::Counted;
    if charged {
        for ((key, _), f) in limits.iter().zip(&found) {
            if let Some(state) = &f.commit {
                store.keys.insert(key.clone(), state.clone());
            }
        }
    }
    let mut retry_after_ms = Some(Millis(0));
    for f in found.iter().filter(|f| !f.allowed) {
        retry_after_ms = match (retry_after_ms, f.retry_us) {
            (Some(a), Some(b)) => Some(a.max(ceil_ms(b))),
            _ => None,
        };
    }
    let outcomes = found
        .iter()
        .zip(limits)
        .map(|(f, (key, _))| {
            let view = if charged { f.after } else { f.now };
            let held_until_us = if allowed { f.held_until.map(Micros) } else { None };
            LimitOutcome {
                allowed: f.allowed,
                remaining: view.remaining,
                reset_ms: if allowed && !reset_when_admitted { Millis(0) } else { ceil_ms(view.reset_us) },
                retry_after_ms: if f.allowed { Some(Millis(0)) } else { f.retry_us.map(ceil_ms) },
                reclaimed: f.reclaimed,
                held_until_us,
                refunded_us: Micros(if held_until_us.is_some() { refunded(store, key) } else { 0 }),
            }
        })
        .collect();
    CheckReply {
        allowed,
        retry_after_ms: if allowed { Some(Millis(0)) } else { retry_after_ms },
        limits: outcomes,
    }
}

/// `lua/scripts/release.lua`: ends lease `id` on each (key, limit, lease); how many
/// were there. Freed slots go to waiters (`queue`).
pub fn release(store: &mut RedisTwin, now: u64, keys: &[(String, u64, u64)], id: &str) -> u64 {
    keys.iter().filter(|(key, limit, lease)| queue::release(store, key, now, id, *limit, *lease)).count()
        as u64
}

/// `lua/scripts/renew.lua`: lease `id`, where live, lasts another lease length on
/// each (key, limit, lease), as `release` takes them; how many it renewed.
pub fn renew(store: &mut RedisTwin, now: u64, keys: &[(String, u64, u64)], id: &str) -> u64 {
    keys.iter().filter(|(key, _, lease)| queue::renew(store, key, now, id, *lease)).count() as u64
}

/// `lua/scripts/upstream.lua`, for one answer of the partner: pauses `pause_key`
/// for `pause_us` (extend-only) and, if `slow` (a refusal of a policy that
/// adapts), lowers the rate at `rate_key` unless the key was already
/// paused. Whether the pause moved, and whether the rate was lowered.
pub fn upstream(
    store: &mut RedisTwin,
    now: u64,
    (pause_key, rate_key): (&str, &str),
    pause_us: u64,
    slow: Option<&Slowdown>,
) -> (bool, bool) {
    let paused_until = match store.keys.get(pause_key) {
        Some(&State::Pause(until)) => until,
        _ => 0,
    };
    let lowered = slow.and_then(|s| rate::slow(store.keys.get(rate_key), now, paused_until, s));
    let slowed = lowered.is_some();
    if let Some(state) = lowered {
        store.keys.insert(rate_key.to_string(), state);
    }
    let (until, moved) = pause::record(store.keys.get(pause_key), now, pause_us);
    store.keys.insert(pause_key.to_string(), State::Pause(until));
    (moved, slowed)
}

/// `lua/scripts/adjust.lua`: charges or refunds each correction's bucket,
/// or calendar window (`interval_us` 0), once per id. Per correction, the
/// units charged (positive) or given back (negative).
pub fn adjust(store: &mut RedisTwin, now: u64, corrections: &[Correction]) -> Vec<i64> {
    corrections
        .iter()
        .map(|c| {
            if settle::settled_before(store, &c.key, now, c.id.as_deref()) {
                return 0;
            }
            if c.interval_us == 0 {
                return calendar::adjust(store.keys.get_mut(&c.key), now, c);
            }
            let counter = refunded(store, &c.key);
            let log = settle::log(store, &c.key);
            let (tat, refund, end) = gcra::adjust(store.keys.get(&c.key), counter, log, now, c);
            store.keys.insert(c.key.clone(), State::Tat(tat));
            if refund > 0 {
                settle::log_refund(store, &c.key, counter, end, refund);
                store.keys.insert(refunded_key(&c.key), State::Refunded(counter + refund));
            }
            if c.delta >= 0 {
                c.delta
            } else {
                -i64::try_from(refund / c.interval_us).unwrap_or(i64::MAX)
            }
        })
        .collect()
}

/// `lua/scripts/lease.lua`: leased mode on the `fixed_window` at `key`. Gives back
/// `give_back` (window index, tokens) first, then grants up to `want`.
/// A call without an id: [`lease_call`] with none.
pub fn lease(
    store: &mut RedisTwin,
    now: u64,
    key: &str,
    limit: u64,
    window_us: u64,
    want: u64,
    give_back: Option<(u64, u64)>,
) -> Grant {
    lease_call(store, now, key, limit, window_us, want, give_back, None)
}

/// The key of a leased limit's calls' record ([`State::Calls`]).
pub fn lease_calls_key(key: &str) -> String {
    format!("{key}:l")
}

/// The key of a leased bucket's horizon ([`State::Horizon`]).
pub fn lease_horizon_key(key: &str) -> String {
    format!("{key}:h")
}

/// The answer to a gateway's call if the calls' record already has it
/// (`lua/lib/lease.lua`, `answered_call`): nothing when a later call of the
/// gateway was recorded (this one ran late); the answer it had, charged
/// once, when it is the recorded call (sent again after its answer was
/// lost), with the time to its window's end (windows `long` µs) and what
/// is `left` now; else `None` (the call runs).
fn answered_call(
    store: &RedisTwin,
    calls_key: &str,
    (gateway, seq): (&str, u64),
    (index, long, now): (u64, u64, u64),
    left: u64,
) -> Option<Grant> {
    let record = match store.keys.get(calls_key) {
        Some(State::Calls(calls)) => calls.get(gateway).copied(),
        _ => None,
    };
    match record? {
        (s, _, _) if s > seq => {
            Some(Grant { granted: 0, window: index, expires_in_us: (index + 1) * long - now, remaining: 0 })
        }
        (s, window, granted) if s == seq => {
            let expires_in_us = window.saturating_add(1).saturating_mul(long).saturating_sub(now);
            Some(Grant { granted, window, expires_in_us, remaining: left })
        }
        _ => None,
    }
}

/// Records a gateway's call: it ran in window `index` and granted `granted`.
fn record_call(
    store: &mut RedisTwin,
    calls_key: String,
    (gateway, seq): (&str, u64),
    index: u64,
    granted: u64,
) {
    let entry = store.keys.entry(calls_key).or_insert_with(|| State::Calls(BTreeMap::new()));
    if !matches!(entry, State::Calls(_)) {
        *entry = State::Calls(BTreeMap::new());
    }
    if let State::Calls(calls) = entry {
        calls.insert(gateway.to_string(), (seq, index, granted));
    }
}

/// `lua/scripts/lease.lua` with a call id (`call`: the gateway's id and the
/// call's sequence number), so an answer that was lost costs nothing: the
/// same call sent again gets the answer it had, charged once (its give-back
/// taken once), and a late run of an older call than the gateway's last
/// recorded one does nothing.
#[allow(clippy::too_many_arguments)]
pub fn lease_call(
    store: &mut RedisTwin,
    now: u64,
    key: &str,
    limit: u64,
    window_us: u64,
    want: u64,
    give_back: Option<(u64, u64)>,
    call: Option<(&str, u64)>,
) -> Grant {
    let calls_key = lease_calls_key(key);
    let index = now / window_us;
    if let Some(call) = call {
        // A call run late, or sent again: answered from the record.
        let left = match store.keys.get(key) {
            Some(&State::Counter { window: stored, count }) if stored == index => limit.saturating_sub(count),
            Some(&State::Counter { window: stored, .. }) if stored > index => 0,
            _ => limit,
        };
        if let Some(answer) = answered_call(store, &calls_key, call, (index, window_us, now), left) {
            return answer;
        }
    }
    if let Some((window, tokens)) = give_back {
        fixed_window::give_back(store.keys.get_mut(key), window, tokens);
    }
    let rolls_over = !matches!(store.keys.get(key), Some(&State::Counter { window, .. }) if window == index);
    let (grant, commit) = fixed_window::grant(store.keys.get(key), now, limit, window_us, want);
    if let Some(state) = commit {
        store.keys.insert(key.to_string(), state);
        if rolls_over {
            store.keys.remove(&calls_key);
        }
    }
    if let Some(call) = call {
        record_call(store, calls_key, call, index, grant.granted);
    }
    grant
}

/// A leased bucket's give-back: the lease period of the leases, the tokens
/// never spent, and the tokens of that period this gateway held charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketGiveBack {
    pub window: u64,
    pub tokens: u64,
    pub charged: u64,
}

/// `lua/scripts/lease_bucket.lua`: leased mode on the bucket (GCRA, one
/// token per request) at `key`, one unit every `interval_us`, `burst` at
/// most, in lease periods of `period_us` (`gcra::lease_grant`). Takes back
/// `give_back` first (`gcra::lease_give_back`), then grants up to `want`.
/// With a call id, as [`lease_call`]: a call sent again gets the answer it
/// had (its give-back taken once), and a late run of an older call does
/// nothing. The record is not cleared by a new period: it lives a period
/// beyond the one its last call ran in, as long as a give-back is taken.
#[allow(clippy::too_many_arguments)]
pub fn lease_bucket_call(
    store: &mut RedisTwin,
    now: u64,
    key: &str,
    (interval_us, burst): (u64, u64),
    period_us: u64,
    want: u64,
    give_back: Option<BucketGiveBack>,
    call: Option<(&str, u64)>,
) -> Grant {
    let calls_key = lease_calls_key(key);
    let horizon_key = lease_horizon_key(key);
    let (index, _) = gcra::lease_period(now, period_us);
    if let Some(call) = call {
        // A call run late, or sent again: answered from the record.
        let tat = match store.keys.get(key) {
            Some(&State::Tat(tat)) => tat.max(now),
            _ => now,
        };
        let left = (now + interval_us * burst).saturating_sub(tat) / interval_us;
        if let Some(answer) = answered_call(store, &calls_key, call, (index, period_us, now), left) {
            return answer;
        }
    }
    let horizon = match store.keys.get(&horizon_key) {
        Some(&State::Horizon(h)) => h,
        _ => 0,
    };
    if let Some(back) = give_back {
        let state = store.keys.get(key);
        let taken = (back.tokens, back.charged);
        if let Some(tat) =
            gcra::lease_give_back(state, horizon, now, (interval_us, period_us), back.window, taken)
        {
            store.keys.insert(key.to_string(), tat);
        }
    }
    let (grant, commit) =
        gcra::lease_grant(store.keys.get(key), horizon, now, (interval_us, burst), period_us, want);
    if let Some((tat, horizon)) = commit {
        store.keys.insert(key.to_string(), tat);
        store.keys.insert(horizon_key, horizon);
    }
    if let Some(call) = call {
        record_call(store, calls_key, call, index, grant.granted);
    }
    grant
}
