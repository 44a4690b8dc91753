//! The Lua scripts against their Rust reference model (`policies::algorithm`),
//! on a real redis-server, decision by decision.
//!
//! Each case is a policy of one to three limits of random types, and a random
//! sequence of checks (at random times, same-instant arrivals included, with
//! random points costs), releases of held leases, and points adjustments. The
//! shim runs in its test mode, so the script and the model see the same time.
//! Every answer must be equal: the decision, and for each limit whether it
//! allowed, what remains, when it resets, when to retry, and what was reclaimed.
//!
//! Alongside, the invariants that make a limiter correct are checked on Redis
//! itself: a denied check changes no limit's state (all-or-nothing), and
//! concurrency never holds more than `limit` live leases.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use redis::Commands;
use sluice_harness::Redis;
use sluice_policies::algorithm::{self, Algorithm, RedisTwin, Refusals};
use sluice_policies::calendar::{Calendar, Period, Weekday, Zone};
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{
    AdjustRequest, Adjustment, Check, CheckRequest, GiveBack, LeaseCall, LeaseRequest, LeaseResponse,
    ReleaseRequest, Views, WireLimit,
};
use sluice_shim::keys::script_limits;
use sluice_shim::limiter::Limiter;
use sluice_shim::store::Target;
use sluice_shim::wait::{self, mixed, queue};

struct World {
    redis: Redis,
    limiter: Limiter,
    runtime: tokio::runtime::Runtime,
}

impl World {
    /// One Redis and one limiter for all the cases of a run; each case has
    /// its own policy name. Dropped, and Redis stopped, when the test ends.
    fn start() -> World {
        let redis = Redis::start().expect("redis");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let limiter = runtime
            .block_on(async { Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true) })
            .expect("limiter");
        World { redis, limiter, runtime }
    }
}

fn limit() -> impl Strategy<Value = WireLimit> {
    let window = prop::sample::select(vec![1u64, 7, 50, 1_000, 60_000]);
    prop_oneof![
        (1u32..20, window.clone()).prop_map(|(limit, window_ms)| WireLimit::FixedWindow {
            limit,
            window_ms: Millis(window_ms),
            cost: 1
        }),
        (1u32..20, window.clone()).prop_map(|(limit, window_ms)| WireLimit::SlidingWindow {
            limit,
            window_ms: Millis(window_ms),
            approximate: false
        }),
        (1u32..20, window).prop_map(|(limit, window_ms)| WireLimit::SlidingWindow {
            limit,
            window_ms: Millis(window_ms),
            approximate: true
        }),
        (1u32..10, prop::sample::select(vec![10u64, 1_000, 3_000]), 1u32..10)
            .prop_map(|(rate, per_ms, burst)| WireLimit::TokenBucket { rate, per_ms: Millis(per_ms), burst }),
        (1u32..10, prop::sample::select(vec![10u64, 700, 3_000]))
            .prop_map(|(capacity, drain_ms)| WireLimit::LeakyBucket { capacity, drain_ms: Millis(drain_ms) }),
        prop::sample::select(vec![1u64, 10, 1_000])
            .prop_map(|every_ms| WireLimit::Interval { every_ms: Millis(every_ms) }),
        (1u32..5, prop::sample::select(vec![5u64, 100, 1_000]))
            .prop_map(|(limit, lease_ms)| WireLimit::Concurrency { limit, lease_ms: Millis(lease_ms) }),
        (5u32..50, prop::sample::select(vec![100u64, 1_000])).prop_map(|(capacity, refill_ms)| {
            WireLimit::Points { capacity, refill_ms: Millis(refill_ms), cost: 1 }
        }),
        calendar_limit(),
        (1u32..20, prop::sample::select(vec![1u64, 7, 50, 1_000, 60_000])).prop_map(|(limit, window_ms)| {
            WireLimit::FirstHitWindow { limit, window_ms: Millis(window_ms), cost: 1 }
        }),
    ]
}

/// A `fixed_window` or `points` limit on a calendar window, in zones with
/// DST, without, and off the hour.
fn calendar_limit() -> impl Strategy<Value = WireLimit> {
    let zone = prop::sample::select(vec![
        "UTC",
        "Europe/Paris",
        "America/New_York",
        "America/Santiago",
        "Asia/Kathmandu",
    ]);
    let period = prop_oneof![
        Just(Period::Day),
        prop::sample::select(vec![Weekday::Monday, Weekday::Sunday])
            .prop_map(|starts| Period::Week { starts }),
        prop::sample::select(vec![1u8, 15, 29, 31]).prop_map(|anchor| Period::Month { anchor }),
    ];
    let calendar = (period, zone)
        .prop_map(|(period, zone)| Calendar { period, zone: Zone::new(zone).expect("a known zone") });
    prop_oneof![
        (1u32..20, calendar.clone()).prop_map(|(limit, calendar)| WireLimit::CalendarWindow {
            limit,
            calendar,
            cost: 1
        }),
        (5u32..50, calendar).prop_map(|(capacity, calendar)| WireLimit::CalendarPoints {
            capacity,
            cost: 1,
            calendar
        }),
    ]
}

/// One to three limits whose states are distinct, as a policy guarantees.
fn limits() -> impl Strategy<Value = Vec<WireLimit>> {
    prop::collection::vec(limit(), 1..=3).prop_filter("limits sharing state", |ls| {
        let mut suffixes: Vec<String> = ls.iter().map(|l| Algorithm::of(l).state_suffix()).collect();
        suffixes.sort();
        suffixes.windows(2).all(|w| w[0] != w[1])
    })
}

/// One to three windows (aligned to the epoch, from the first hit, on a
/// calendar) whose states are distinct: the limits that count a refusal.
fn window_limits() -> impl Strategy<Value = Vec<WireLimit>> {
    let length = prop::sample::select(vec![1u64, 7, 50, 1_000, 60_000]);
    let window = prop_oneof![
        (1u32..20, length.clone()).prop_map(|(limit, ms)| WireLimit::FixedWindow {
            limit,
            window_ms: Millis(ms),
            cost: 1
        }),
        (1u32..20, length).prop_map(|(limit, ms)| WireLimit::FirstHitWindow {
            limit,
            window_ms: Millis(ms),
            cost: 1
        }),
        calendar_limit().prop_filter("a window", |l| matches!(l, WireLimit::CalendarWindow { .. })),
    ];
    prop::collection::vec(window, 1..=3).prop_filter("limits sharing state", |ls| {
        let mut suffixes: Vec<String> = ls.iter().map(|l| Algorithm::of(l).state_suffix()).collect();
        suffixes.sort();
        suffixes.windows(2).all(|w| w[0] != w[1])
    })
}

#[derive(Debug, Clone)]
enum Op {
    /// After `dt` µs, a check costing `cost` points (where points apply),
    /// reading an admitted request's reset or not (`wire::Views`), its
    /// refusal counted or not where every limit is a window (`every_hit`,
    /// `algorithm::Refusals`).
    Check { dt: u64, cost: u32, reset: bool, every_hit: bool },
    /// Release the `n`th lease held (modulo how many are held).
    Release { n: usize },
    /// Renew the `n`th lease held (modulo how many are held).
    Renew { n: usize },
    /// Correct the last admitted check's points to `actual`.
    Adjust { actual: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    // Boundaries are where limiters go wrong: steps of whole windows,
    // intervals and leases, and a microsecond either side, land on them.
    let round =
        prop::sample::select(vec![1u64, 1_000, 5_000, 7_000, 10_000, 50_000, 100_000, 1_000_000, 3_000_000]);
    let near = (round, -1i64..=1).prop_map(|(r, d)| r.saturating_add_signed(d));
    let dt =
        prop_oneof![3 => Just(0u64), 3 => near, 2 => 0u64..2_000, 2 => 0u64..200_000, 1 => 0u64..3_000_000];
    prop_oneof![
        8 => (dt, 0u32..60, any::<bool>(), any::<bool>())
            .prop_map(|(dt, cost, reset, every_hit)| Op::Check { dt, cost, reset, every_hit }),
        1 => any::<usize>().prop_map(|n| Op::Release { n }),
        1 => any::<usize>().prop_map(|n| Op::Renew { n }),
        1 => (0u32..60).prop_map(|actual| Op::Adjust { actual }),
    ]
}

/// A limit's charge as an admitted check reported it: (held_until_us, refunded_us).
type Charge = (Option<Micros>, Micros);

/// The (key, limit, lease) of each concurrency limit of `checks`, as the
/// model's release and renewal take them.
fn lease_keys(checks: &[Check]) -> Vec<(String, u64, u64)> {
    script_limits(checks)
        .expect("valid limits")
        .into_iter()
        .filter_map(|l| match l.algorithm {
            Algorithm::Concurrency { limit, lease_us } => Some((l.key, limit, lease_us.get())),
            _ => None,
        })
        .collect()
}

/// `actual` as the filter sends it: at most the points limit's capacity.
fn clamped(actual: u32, limit: &WireLimit) -> u32 {
    match *limit {
        WireLimit::Points { capacity, .. } | WireLimit::CalendarPoints { capacity, .. } => {
            actual.min(capacity)
        }
        _ => actual,
    }
}

fn with_cost(limits: &[WireLimit], cost: u32) -> Vec<WireLimit> {
    limits
        .iter()
        .map(|l| match *l {
            // The shim refuses a cost above the capacity; the filter clamps to it.
            WireLimit::Points { capacity, refill_ms, .. } => {
                WireLimit::Points { capacity, refill_ms, cost: cost.min(capacity) }
            }
            WireLimit::CalendarPoints { capacity, calendar, .. } => {
                WireLimit::CalendarPoints { capacity, calendar, cost: cost.min(capacity) }
            }
            other => other,
        })
        .collect()
}

/// `limits` with `cost` on its windows too, as the RLS face charges an
/// RLS call's `hits_addend` (a policy's own checks cost a window 1): 1 half
/// the time, else 2 or 3.
fn with_hits(limits: &[WireLimit], cost: u32) -> Vec<WireLimit> {
    let mut limits = with_cost(limits, cost);
    for window in limits.iter_mut().filter(|l| l.points_cost().is_none()) {
        if let Some(c) = window.cost_mut() {
            *c = (cost % 4).max(1);
        }
    }
    limits
}

/// The state of each key as Redis holds it, for the all-or-nothing check:
/// live entries of a set, the fields of a hash, the value of a string.
fn snapshot(conn: &mut redis::Connection, keys: &[String]) -> Vec<String> {
    keys.iter()
        .map(|key| {
            let kind: String = redis::cmd("TYPE").arg(key).query(conn).unwrap_or_default();
            match kind.as_str() {
                "zset" => format!(
                    "{:?}",
                    conn.zrange_withscores::<_, Vec<(String, f64)>>(key, 0, -1).unwrap_or_default()
                ),
                "hash" => format!("{:?}", conn.hgetall::<_, Vec<(String, String)>>(key).unwrap_or_default()),
                "string" => conn.get::<_, String>(key).unwrap_or_default(),
                other => other.to_string(),
            }
        })
        .collect()
}

fn run_case(w: &World, limits: Vec<WireLimit>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    run_case_from(w, 1_700_000_000_000_000, limits, ops)
}

fn run_case_from(w: &World, start: u64, limits: Vec<WireLimit>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    static CASE: AtomicU64 = AtomicU64::new(0);
    let policy = format!("p{}", CASE.fetch_add(1, Ordering::Relaxed));
    let key = "k".to_string();
    let mut conn = w.redis.connection().expect("redis connection");
    let mut model = RedisTwin::default();
    let mut now = start;
    let mut held: Vec<(String, Vec<Check>)> = Vec::new();
    // The last admitted check, with what each of its limits charged until.
    // The last admitted checks, and each limit's (held_until_us, refunded_us).
    let mut last_admitted: Option<(Vec<Check>, Vec<Charge>)> = None;
    let mut id = 0u64;

    for op in ops {
        match op {
            Op::Check { dt, cost, reset, every_hit } => {
                now += dt;
                id += 1;
                let checks = vec![Check {
                    policy: policy.clone(),
                    key: key.clone(),
                    limits: with_hits(&limits, cost),
                    margin_ms: None,
                    upstream: false,
                    levels: Vec::new(),
                }];
                let script = script_limits(&checks).expect("valid limits");
                let model_limits: Vec<(String, Algorithm)> =
                    script.iter().map(|l| (l.key.clone(), l.algorithm)).collect();
                let keys: Vec<String> = script.iter().map(|l| l.key.clone()).collect();
                let before = snapshot(&mut conn, &keys);
                let windows = model_limits.iter().all(|(_, alg)| alg.is_window());
                let refusals = if every_hit && windows { Refusals::Counted } else { Refusals::Uncharged };

                let req = CheckRequest {
                    checks: checks.as_slice().into(),
                    now_us: Some(Micros(now)),
                    id: None,
                    wait_ms: None,
                    views: if reset { Views::All } else { Views::NoResetWhenAdmitted },
                };
                let got = w.runtime.block_on(w.limiter.check_charging(&req, refusals)).expect("check");
                // The model names its entries as the shim does, so a lease is one id in both.
                let model_id = got.lease.clone().unwrap_or_else(|| format!("m{id}"));
                let want =
                    algorithm::check_viewing(&mut model, now, &model_id, &model_limits, reset, refusals);

                prop_assert_eq!(got.allowed, want.allowed, "decision at {}", now);
                prop_assert_eq!(got.retry_after_ms, want.retry_after_ms, "retry after at {}", now);
                prop_assert_eq!(&got.checks[0].limits, &want.limits, "limits at {}", now);

                if got.allowed {
                    let held_until =
                        got.checks[0].limits.iter().map(|l| (l.held_until_us, l.refunded_us)).collect();
                    last_admitted = Some((checks.clone(), held_until));
                    if let Some(lease) = got.lease {
                        held.push((lease, checks));
                    }
                } else if refusals == Refusals::Counted {
                    // Every window counted the refused cost, past its limit,
                    // as the model did (a key Redis let expire holds a past
                    // window the model still keeps).
                    for (key, _) in &model_limits {
                        let counted: Option<u64> = conn.hget(key, "n").expect("HGET");
                        let want = match model.keys.get(key) {
                            Some(algorithm::State::Counter { count, .. }) => Some(*count),
                            _ => None,
                        };
                        if counted.is_some() {
                            prop_assert_eq!(counted, want, "{} after a counted refusal at {}", key, now);
                        }
                    }
                } else {
                    // All or nothing: a denied check charges no limit. It may
                    // only drop expired set entries and leases.
                    let after = snapshot(&mut conn, &keys);
                    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
                        if b != a {
                            prop_assert!(
                                matches!(
                                    model_limits[i].1,
                                    Algorithm::SlidingWindow { .. } | Algorithm::Concurrency { .. }
                                ),
                                "a denied check changed {}: {} -> {}",
                                keys[i],
                                b,
                                a
                            );
                            prop_assert!(
                                a.len() <= b.len(),
                                "a denied check added to {}: {} -> {}",
                                keys[i],
                                b,
                                a
                            );
                        }
                    }
                }
                for (key, alg) in &model_limits {
                    if let Algorithm::Concurrency { limit, .. } = alg {
                        let live: u64 = conn.zcount(key, format!("({now}"), "+inf").expect("ZCOUNT");
                        prop_assert!(live <= *limit, "{} live leases over a limit of {}", live, limit);
                    }
                }
            }
            Op::Release { n } => {
                if held.is_empty() {
                    continue;
                }
                let (lease, checks) = held.remove(n % held.len());
                let want = algorithm::release(&mut model, now, &lease_keys(&checks), &lease);
                let got = w
                    .runtime
                    .block_on(w.limiter.release_at(&ReleaseRequest { lease, checks }, Some(Micros(now))))
                    .expect("release");
                prop_assert_eq!(got.released, want, "released");
            }
            Op::Renew { n } => {
                if held.is_empty() {
                    continue;
                }
                let (lease, checks) = held[n % held.len()].clone();
                let want = algorithm::renew(&mut model, now, &lease_keys(&checks), &lease);
                let got = w
                    .runtime
                    .block_on(w.limiter.renew_at(&ReleaseRequest { lease, checks }, Some(Micros(now))))
                    .expect("renew");
                prop_assert_eq!(got.renewed, want, "renewed");
            }
            Op::Adjust { actual } => {
                let Some((checks, held_until)) = last_admitted.clone() else { continue };
                let adjustments: Vec<Adjustment> = checks[0]
                    .limits
                    .iter()
                    .zip(held_until)
                    .filter(|(l, _)| matches!(l, WireLimit::Points { .. } | WireLimit::CalendarPoints { .. }))
                    .map(|(l, (held_until_us, refunded_us))| Adjustment {
                        policy: policy.clone(),
                        key: key.clone(),
                        id: None,
                        limit: *l,
                        actual: clamped(actual, l),
                        held_until_us,
                        refunded_us,
                        level: None,
                    })
                    .collect();
                if adjustments.is_empty() {
                    continue;
                }
                let script = sluice_shim::keys::script_adjustments(&adjustments).expect("valid adjustments");
                let model_adjust: Vec<_> = script.into_iter().filter(|a| a.delta != 0).collect();
                let req = AdjustRequest { adjustments, now_us: Some(Micros(now)) };
                let got = w.runtime.block_on(w.limiter.adjust(&req)).expect("adjust");
                let want = algorithm::adjust(&mut model, now, &model_adjust);
                let got: Vec<i64> = got.moved.into_iter().filter(|&n| n != 0).collect();
                let want: Vec<i64> = want.into_iter().filter(|&n| n != 0).collect();
                prop_assert_eq!(got, want, "moved at {}", now);
            }
        }
    }
    Ok(())
}

/// The script decides exactly as the model, for every limit type, alone and
/// combined, through checks, releases and adjustments; and where every
/// limit is a window, with refusals counted (`charge: every_hit`) or not,
/// over a second run of windows only.
#[test]
fn scripts_decide_as_the_model() {
    let world = World::start();
    let mut runner = TestRunner::new(ProptestConfig { cases: 500, ..ProptestConfig::default() });
    let cases = (limits(), prop::collection::vec(op(), 1..40));
    if let Err(failure) = runner.run(&cases, |(limits, ops)| run_case(&world, limits, ops)) {
        panic!("{failure}");
    }
    let mut runner = TestRunner::new(ProptestConfig { cases: 200, ..ProptestConfig::default() });
    let cases = (window_limits(), prop::collection::vec(op(), 1..40));
    if let Err(failure) = runner.run(&cases, |(limits, ops)| run_case(&world, limits, ops)) {
        panic!("{failure}");
    }
}

/// One step of a settlement case: a reservation after `dt` µs, or the
/// settlement of the `n`th admitted reservation so far to `actual`, sent
/// `times` times.
#[derive(Debug, Clone)]
enum SettleOp {
    Reserve { dt: u64, cost: u32 },
    Settle { dt: u64, n: usize, actual: u32, times: usize },
}

fn settle_op() -> impl Strategy<Value = SettleOp> {
    let dt = prop_oneof![3 => Just(0u64), 2 => 0u64..2_000, 1 => 0u64..300_000];
    prop_oneof![
        (dt.clone(), 0u32..30).prop_map(|(dt, cost)| SettleOp::Reserve { dt, cost }),
        (dt, any::<usize>(), 0u32..30, 1usize..3).prop_map(|(dt, n, actual, times)| SettleOp::Settle {
            dt,
            n,
            actual,
            times
        }),
    ]
}

/// A points bucket's or a calendar counter's state in Redis, with the
/// bucket's refund counter and log.
fn points_state(conn: &mut redis::Connection, key: &str) -> String {
    let main = snapshot(conn, &[key.to_string()]).join("");
    let counter: Option<String> = conn.get(format!("{key}:r")).unwrap_or_default();
    let log: Vec<String> = conn.lrange(format!("{key}:g"), 0, -1).unwrap_or_default();
    format!("{main} r={counter:?} g={log:?}")
}

/// The model's view of [`points_state`].
fn model_points_state(model: &RedisTwin, key: &str) -> String {
    let main = match model.keys.get(key) {
        Some(algorithm::State::Tat(tat)) => tat.to_string(),
        Some(algorithm::State::Counter { window, count }) => {
            format!("[(\"w\", \"{window}\"), (\"n\", \"{count}\")]")
        }
        _ => String::new(),
    };
    let counter = match model.keys.get(&algorithm::refunded_key(key)) {
        Some(algorithm::State::Refunded(n)) => Some(n.to_string()),
        _ => None,
    };
    let log: Vec<String> =
        algorithm::settle::log(model, key).iter().map(|(c, e, s)| format!("{c} {e} {s}")).collect();
    format!("{main} r={counter:?} g={log:?}")
}

/// Settlements through the script as the model: reservations and their
/// settlements in any order, each sent once or twice with its id, on a
/// points bucket or a calendar window. Every check, what each settlement
/// moved, and the whole state (the bucket, its refund counter and its
/// refund log) are equal.
#[test]
fn settlements_decide_as_the_model() {
    let world = World::start();
    let mut runner = TestRunner::new(ProptestConfig { cases: 300, ..ProptestConfig::default() });
    let limit = prop_oneof![
        (5u32..60, prop::sample::select(vec![100u64, 1_000, 60_000])).prop_map(|(capacity, refill_ms)| {
            WireLimit::Points { capacity, refill_ms: Millis(refill_ms), cost: 1 }
        }),
        calendar_limit().prop_filter("points", |l| matches!(l, WireLimit::CalendarPoints { .. })),
    ];
    let cases = (limit, prop::collection::vec(settle_op(), 1..50));
    let result = runner.run(&cases, |(limit, ops)| {
        static CASE: AtomicU64 = AtomicU64::new(0);
        let policy = format!("s{}", CASE.fetch_add(1, Ordering::Relaxed));
        let mut conn = world.redis.connection().expect("redis connection");
        let mut model = RedisTwin::default();
        let mut now = 1_700_000_000_000_000u64;
        let mut admitted: Vec<(String, WireLimit, Option<Micros>, Micros)> = Vec::new();
        let mut key = String::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                SettleOp::Reserve { dt, cost } => {
                    now += dt;
                    let checks = vec![Check {
                        policy: policy.clone(),
                        key: "k".into(),
                        limits: with_cost(&[limit], cost),
                        margin_ms: None,
                        upstream: false,
                        levels: Vec::new(),
                    }];
                    let script = script_limits(&checks).expect("valid limits");
                    key = script[0].key.clone();
                    let model_limits = [(key.clone(), script[0].algorithm)];
                    let id = format!("r{i}");
                    let req = CheckRequest {
                        checks: checks.as_slice().into(),
                        now_us: Some(Micros(now)),
                        id: Some(id.as_str().into()),
                        wait_ms: None,
                        views: Views::All,
                    };
                    let got = world.runtime.block_on(world.limiter.check(&req)).expect("check");
                    let want = algorithm::check(&mut model, now, &id, &model_limits);
                    prop_assert_eq!(&got.checks[0].limits, &want.limits, "check at {}", now);
                    if got.allowed {
                        let o = got.checks[0].limits[0];
                        admitted.push((id, checks[0].limits[0], o.held_until_us, o.refunded_us));
                    }
                }
                SettleOp::Settle { dt, n, actual, times } => {
                    now += dt;
                    if admitted.is_empty() {
                        continue;
                    }
                    let (id, wire, held_until_us, refunded_us) = admitted[n % admitted.len()].clone();
                    let adjustment = Adjustment {
                        policy: policy.clone(),
                        key: "k".into(),
                        id: Some(id),
                        limit: wire,
                        actual: clamped(actual, &wire),
                        held_until_us,
                        refunded_us,
                        level: None,
                    };
                    for _ in 0..times {
                        let script = sluice_shim::keys::script_adjustments(std::slice::from_ref(&adjustment))
                            .expect("valid");
                        let want = if script[0].delta == 0 {
                            0
                        } else {
                            algorithm::adjust(&mut model, now, &script)[0]
                        };
                        let req = AdjustRequest {
                            adjustments: vec![adjustment.clone()],
                            now_us: Some(Micros(now)),
                        };
                        let got = world.runtime.block_on(world.limiter.adjust(&req)).expect("adjust");
                        prop_assert_eq!(got.moved, vec![want], "moved at {}", now);
                    }
                }
            }
            if !key.is_empty() {
                prop_assert_eq!(
                    points_state(&mut conn, &key),
                    model_points_state(&model, &key),
                    "state after step {}",
                    i
                );
            }
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// A Redis Cluster's charge-then-refund (`refund.lua`, run here on the
/// slot's key as the cluster path runs it) among reservations and
/// settlements of a points bucket: the script and its twin
/// (`algorithm::refund`) leave the same bucket, refund counter and refund
/// log, and every settlement after moves what the model moves. The
/// regression: refund.lua logged nothing, so a settlement of an earlier
/// charge took its refund as one of a charge before its own and could give
/// back nothing of its unused part.
#[test]
fn cluster_refunds_log_as_the_model() {
    let world = World::start();
    let scripts = sluice_shim::scripts::Scripts::new();
    let mut runner = TestRunner::new(ProptestConfig { cases: 200, ..ProptestConfig::default() });
    let limit =
        (5u32..60, prop::sample::select(vec![100u64, 1_000, 60_000])).prop_map(|(capacity, refill_ms)| {
            WireLimit::Points { capacity, refill_ms: Millis(refill_ms), cost: 1 }
        });
    // A refund: an unsettled admitted request's, as another slot denied it.
    let op = prop_oneof![3 => settle_op().prop_map(Some), 1 => Just(None)];
    let cases = (limit, prop::collection::vec((op, any::<usize>()), 1..50));
    let result = runner.run(&cases, |(limit, ops)| {
        static CASE: AtomicU64 = AtomicU64::new(0);
        let policy = format!("cr{}", CASE.fetch_add(1, Ordering::Relaxed));
        let mut conn = world.redis.connection().expect("redis connection");
        let mut model = RedisTwin::default();
        let mut now = 1_700_000_000_000_000u64;
        // Admitted: (id, the limit as charged, its outcome, the check's
        // time, whether it was refunded or settled: a request is one or the other).
        let mut admitted: Vec<(String, WireLimit, Option<Micros>, Micros, u64, bool)> = Vec::new();
        let mut key = String::new();
        for (i, (op, pick)) in ops.into_iter().enumerate() {
            match op {
                Some(SettleOp::Reserve { dt, cost }) => {
                    now += dt;
                    let checks = vec![Check {
                        policy: policy.clone(),
                        key: "k".into(),
                        limits: with_cost(&[limit], cost),
                        margin_ms: None,
                        upstream: false,
                        levels: Vec::new(),
                    }];
                    let script = script_limits(&checks).expect("valid limits");
                    key = script[0].key.clone();
                    let id = format!("r{i}");
                    let req = CheckRequest {
                        checks: checks.as_slice().into(),
                        now_us: Some(Micros(now)),
                        id: Some(id.as_str().into()),
                        wait_ms: None,
                        views: Views::All,
                    };
                    let got = world.runtime.block_on(world.limiter.check(&req)).expect("check");
                    let want = algorithm::check(&mut model, now, &id, &[(key.clone(), script[0].algorithm)]);
                    prop_assert_eq!(&got.checks[0].limits, &want.limits, "check at {}", now);
                    if got.allowed {
                        let o = got.checks[0].limits[0];
                        admitted.push((id, checks[0].limits[0], o.held_until_us, o.refunded_us, now, false));
                    }
                }
                None => {
                    let open: Vec<usize> = (0..admitted.len()).filter(|&j| !admitted[j].5).collect();
                    if open.is_empty() {
                        continue;
                    }
                    let j = open[pick % open.len()];
                    admitted[j].5 = true;
                    let (id, wire, held_until_us, refunded_us, charged, _) = admitted[j].clone();
                    let checks = vec![Check {
                        policy: policy.clone(),
                        key: "k".into(),
                        limits: vec![wire],
                        margin_ms: None,
                        upstream: false,
                        levels: Vec::new(),
                    }];
                    let script = script_limits(&checks).expect("valid limits");
                    let charged_at = charged.to_string();
                    let (name, [a, b, c, d]) = script[0].script_args(&charged_at);
                    let mut call = scripts.refund.prepare_invoke();
                    call.arg(charged).arg(&id).key(&script[0].key).arg(name).arg(a).arg(b).arg(c).arg(d);
                    call.arg(held_until_us.map_or(0, Micros::get)).arg(refunded_us.get());
                    let _: i64 = call.invoke(&mut conn).expect("refund.lua");
                    let Algorithm::Gcra { interval_us, cost, .. } = script[0].algorithm else {
                        panic!("a points bucket")
                    };
                    let charge = algorithm::refund::Charge {
                        key: script[0].key.clone(),
                        interval_us: interval_us.get(),
                        cost,
                        held_until_us: held_until_us.map_or(0, Micros::get),
                        refunded_us: refunded_us.get(),
                    };
                    algorithm::refund::bucket(&mut model, &charge);
                }
                Some(SettleOp::Settle { dt, n, actual, times }) => {
                    now += dt;
                    let open: Vec<usize> = (0..admitted.len()).filter(|&j| !admitted[j].5).collect();
                    if open.is_empty() {
                        continue;
                    }
                    let j = open[n % open.len()];
                    admitted[j].5 = true;
                    let (id, wire, held_until_us, refunded_us, _, _) = admitted[j].clone();
                    let adjustment = Adjustment {
                        policy: policy.clone(),
                        key: "k".into(),
                        id: Some(id),
                        limit: wire,
                        actual: clamped(actual, &wire),
                        held_until_us,
                        refunded_us,
                        level: None,
                    };
                    for _ in 0..times {
                        let script = sluice_shim::keys::script_adjustments(std::slice::from_ref(&adjustment))
                            .expect("valid");
                        let want = if script[0].delta == 0 {
                            0
                        } else {
                            algorithm::adjust(&mut model, now, &script)[0]
                        };
                        let req = AdjustRequest {
                            adjustments: vec![adjustment.clone()],
                            now_us: Some(Micros(now)),
                        };
                        let got = world.runtime.block_on(world.limiter.adjust(&req)).expect("adjust");
                        prop_assert_eq!(got.moved, vec![want], "moved at {}", now);
                    }
                }
            }
            if !key.is_empty() {
                prop_assert_eq!(
                    points_state(&mut conn, &key),
                    model_points_state(&model, &key),
                    "state after step {}",
                    i
                );
            }
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// Instants where calendars go wrong, each a microsecond or an hour away
/// from: DST changes in Paris, New York and Santiago (where midnight itself
/// is skipped), a month's end before a short February and a leap day, and
/// an anchor-31 February.
fn calendar_start() -> impl Strategy<Value = u64> {
    let edges = vec![
        "2026-03-29T00:59:59Z", // Paris: 02:00 CET becomes 03:00 CEST
        "2026-10-24T22:00:00Z", // Paris: midnight before the 25-hour day
        "2026-03-08T04:59:59Z", // New York: the day of the spring change
        "2026-11-01T03:59:59Z", // New York: midnight before the fall change
        "2026-09-06T03:59:59Z", // Santiago: midnight does not exist
        "2026-01-31T23:59:59Z", // the end of January, before a short February
        "2026-02-27T23:59:59Z", // anchor 29 to 31 falls on Feb 28
        "2028-02-28T23:59:59Z", // a leap day
        "2026-12-31T18:14:59Z", // Kathmandu (+05:45): midnight of the new year
    ];
    let at = prop::sample::select(edges).prop_map(|text| {
        let ts: jiff::Timestamp = text.parse().expect("a timestamp");
        u64::try_from(ts.as_microsecond()).expect("after 1970")
    });
    (at, prop::sample::select(vec![0i64, 1, -3_600_000_000, 3_600_000_000]))
        .prop_map(|(at, shift)| at.saturating_add_signed(shift))
}

/// Steps across calendar boundaries: a microsecond, seconds, hours, a day.
fn calendar_op() -> impl Strategy<Value = Op> {
    let dt = prop_oneof![
        2 => Just(0u64),
        2 => Just(1u64),
        2 => 0u64..2_000_000,
        2 => prop::sample::select(vec![3_600_000_000u64, 86_400_000_000, 23 * 3_600_000_000]),
        1 => 0u64..3 * 86_400_000_000,
    ];
    prop_oneof![
        8 => (dt, 0u32..60, any::<bool>(), any::<bool>())
            .prop_map(|(dt, cost, reset, every_hit)| Op::Check { dt, cost, reset, every_hit }),
        2 => (0u32..60).prop_map(|actual| Op::Adjust { actual }),
    ]
}

/// Calendar windows decide as the model across their edges: DST changes,
/// skipped midnights, months of every length and anchor 31 in February,
/// alone and beside other limits, through checks and points corrections.
#[test]
fn calendar_scripts_decide_as_the_model() {
    let world = World::start();
    let mut runner = TestRunner::new(ProptestConfig { cases: 300, ..ProptestConfig::default() });
    let limits = prop::collection::vec(prop_oneof![3 => calendar_limit(), 1 => limit()], 1..=3).prop_filter(
        "limits sharing state",
        |ls| {
            let mut suffixes: Vec<String> = ls.iter().map(|l| Algorithm::of(l).state_suffix()).collect();
            suffixes.sort();
            suffixes.windows(2).all(|w| w[0] != w[1])
        },
    );
    let cases = (calendar_start(), limits, prop::collection::vec(calendar_op(), 1..40));
    if let Err(failure) = runner.run(&cases, |(start, limits, ops)| run_case_from(&world, start, limits, ops))
    {
        panic!("{failure}");
    }
}

/// The time-based limits a request may wait on (no approximate window, no
/// concurrency, no calendar, no first_hit window), with the ops of the waiting path.
fn waiting_limits() -> impl Strategy<Value = Vec<WireLimit>> {
    limits().prop_filter("cannot wait", |ls| {
        ls.iter().all(|l| {
            !matches!(
                l,
                WireLimit::SlidingWindow { approximate: true, .. }
                    | WireLimit::Concurrency { .. }
                    | WireLimit::CalendarWindow { .. }
                    | WireLimit::CalendarPoints { .. }
                    | WireLimit::FirstHitWindow { .. }
            )
        })
    })
}

#[derive(Debug, Clone)]
enum WaitOp {
    /// After `dt` µs, a check that may wait `wait_ms` (0: decided at once).
    Check { dt: u64, cost: u32, wait_ms: u64 },
    /// The client of the `n`th held reservation goes away after `dt` µs.
    Cancel { dt: u64, n: usize },
    /// The `n`th held reservation wakes `late` µs after its slot (or now,
    /// if later) and confirms its send.
    Confirm { late: u64, n: usize },
    /// The clock steps back `dt` µs (a Redis failover to a slower clock).
    Back { dt: u64 },
    /// The last request sent at once settles at `actual` units (a refund
    /// or a charge on its points limits), whatever is held meanwhile.
    Adjust { actual: u32 },
}

fn wait_op() -> impl Strategy<Value = WaitOp> {
    let round = prop::sample::select(vec![1u64, 1_000, 7_000, 10_000, 50_000, 1_000_000, 3_000_000]);
    let near = (round, -1i64..=1).prop_map(|(r, d)| r.saturating_add_signed(d));
    let dt = prop_oneof![3 => Just(0u64), 3 => near, 2 => 0u64..2_000, 2 => 0u64..200_000];
    let wait = prop_oneof![1 => Just(0u64), 3 => prop::sample::select(vec![1u64, 7, 50, 1_000, 5_000])];
    prop_oneof![
        8 => (dt.clone(), 0u32..60, wait).prop_map(|(dt, cost, wait_ms)| WaitOp::Check { dt, cost, wait_ms }),
        2 => (dt.clone(), any::<usize>()).prop_map(|(dt, n)| WaitOp::Cancel { dt, n }),
        4 => (dt, any::<usize>()).prop_map(|(late, n)| WaitOp::Confirm { late, n }),
        1 => (0u64..20_000).prop_map(|dt| WaitOp::Back { dt }),
        2 => (0u32..60).prop_map(|actual| WaitOp::Adjust { actual }),
    ]
}

fn run_waiting_case(
    w: &World,
    limits: Vec<WireLimit>,
    margin_ms: u64,
    ops: Vec<WaitOp>,
) -> Result<(), TestCaseError> {
    static CASE: AtomicU64 = AtomicU64::new(0);
    let policy = format!("w{}", CASE.fetch_add(1, Ordering::Relaxed));
    let mut model = RedisTwin::default();
    let mut now = 1_700_000_000_000_000u64;
    // Held reservations: id, checks, slot, the gcra tat each limit set.
    let mut held: Vec<(String, Vec<Check>, u64, Vec<u64>)> = Vec::new();
    // The last request sent at once: its checks and, per limit, its reply's
    // held_until and refund counter.
    let mut last_sent: Option<(Vec<Check>, Vec<Charge>)> = None;
    // What confirm.lua PUBLISHes for every shim: read after each confirm,
    // up to a marker this test publishes after it (one subscriber gets a
    // channel's messages in the order Redis took them).
    let channel = algorithm::confirm::PUSHED_CHANNEL;
    let mut publisher = w.redis.connection().expect("redis connection");
    let mut listener = w.redis.connection().expect("redis connection");
    let mut pushes = listener.as_pubsub();
    pushes.set_read_timeout(Some(Duration::from_secs(10))).expect("a read timeout");
    pushes.subscribe(channel).expect("SUBSCRIBE");
    for (n, op) in ops.into_iter().enumerate() {
        match op {
            WaitOp::Check { dt, cost, wait_ms } => {
                now += dt;
                let id = format!("r{n}");
                let checks = vec![Check {
                    policy: policy.clone(),
                    key: "k".into(),
                    limits: with_cost(&limits, cost),
                    margin_ms: Some(Millis(margin_ms)),
                    upstream: false,
                    levels: Vec::new(),
                }];
                let script = script_limits(&checks).expect("valid limits");
                let req = CheckRequest {
                    checks: checks.as_slice().into(),
                    now_us: Some(Micros(now)),
                    id: Some(id.clone().into()),
                    wait_ms: Some(Millis(wait_ms)),
                    views: Default::default(),
                };
                if wait_ms == 0 {
                    let model_limits: Vec<(String, Algorithm)> =
                        script.iter().map(|l| (l.key.clone(), l.algorithm)).collect();
                    let got = w.runtime.block_on(w.limiter.check(&req)).expect("check");
                    let want = algorithm::check(&mut model, now, &id, &model_limits);
                    prop_assert_eq!(got.allowed, want.allowed, "decision at {}", now);
                    prop_assert_eq!(got.retry_after_ms, want.retry_after_ms, "retry at {}", now);
                    prop_assert_eq!(&got.checks[0].limits, &want.limits, "limits at {}", now);
                    if got.allowed {
                        let charges = got.checks[0].limits.iter().map(|l| (l.held_until_us, l.refunded_us));
                        last_sent = Some((checks.clone(), charges.collect()));
                    }
                    continue;
                }
                let waiting: Vec<algorithm::reserve::Waiting> =
                    script.iter().map(|l| (l.key.clone(), l.algorithm, margin_ms * 1000)).collect();
                let got =
                    w.runtime.block_on(wait::reserve_request(w.limiter.waiting(), &req)).expect("reserve");
                let want = algorithm::reserve::reserve(&mut model, now, &id, wait_ms * 1000, &waiting)
                    .expect("waits");
                prop_assert_eq!(got.response.allowed, want.reply.allowed, "decision at {}", now);
                prop_assert_eq!(got.response.retry_after_ms, want.reply.retry_after_ms, "retry at {}", now);
                prop_assert_eq!(&got.response.checks[0].limits, &want.reply.limits, "limits at {}", now);
                prop_assert_eq!(got.at, want.at, "slot at {}", now);
                if let Some(at) = got.at {
                    prop_assert!(at >= now && at - now <= wait_ms * 1000, "slot {} beyond the wait", at);
                    let tats = got.response.checks[0]
                        .limits
                        .iter()
                        .map(|l| l.held_until_us.map_or(0, Micros::get))
                        .collect();
                    // A slot at now was sent at once; a later one is held.
                    if at > now {
                        held.push((id, checks, at, tats));
                    } else {
                        let charges =
                            got.response.checks[0].limits.iter().map(|l| (l.held_until_us, l.refunded_us));
                        last_sent = Some((checks, charges.collect()));
                    }
                }
            }
            WaitOp::Cancel { dt, n } => {
                if held.is_empty() {
                    continue;
                }
                now += dt;
                let (id, checks, at, tats) = held.remove(n % held.len());
                let script = script_limits(&checks).expect("valid limits");
                w.runtime
                    .block_on(wait::cancel(w.limiter.waiting(), &script, Some(Micros(now)), &id, at))
                    .expect("cancel");
                let reserved: Vec<algorithm::cancel::Reserved> = script
                    .iter()
                    .zip(&tats)
                    .map(|(l, &t)| (l.key.clone(), l.algorithm, (t > 0).then_some(t)))
                    .collect();
                algorithm::cancel::cancel(&mut model, now, &id, at, &reserved);
            }
            WaitOp::Confirm { late, n } => {
                if held.is_empty() {
                    continue;
                }
                let i = n % held.len();
                let (id, checks, at, _) = held[i].clone();
                now = now.max(at) + late;
                let req = CheckRequest {
                    checks: checks.as_slice().into(),
                    now_us: Some(Micros(now)),
                    id: Some(id.clone().into()),
                    wait_ms: None,
                    views: Default::default(),
                };
                let script = script_limits(&checks).expect("valid limits");
                let got = w
                    .runtime
                    .block_on(wait::confirm_at(w.limiter.waiting(), &req, Some(Micros(now)), at))
                    .expect("confirm");
                let waiting: Vec<algorithm::reserve::Waiting> =
                    script.iter().map(|l| (l.key.clone(), l.algorithm, margin_ms * 1000)).collect();
                let want = algorithm::confirm::confirm(&mut model, now, &id, at, &waiting);
                prop_assert_eq!(format!("{got:?}"), format!("{want:?}"), "confirm of {} at {}", id, now);
                let marker = format!("marker {n}");
                let _: i64 =
                    redis::cmd("PUBLISH").arg(channel).arg(&marker).query(&mut publisher).expect("PUBLISH");
                let mut published = Vec::new();
                loop {
                    let message: String =
                        pushes.get_message().and_then(|m| m.get_payload()).expect("a pushed-out message");
                    if message == marker {
                        break;
                    }
                    published.push(message);
                }
                prop_assert_eq!(published, want.published(), "published by the confirm of {} at {}", id, now);
                if !matches!(want, algorithm::confirm::Confirmed::Wait(_)) {
                    held.remove(i);
                }
                // Those the send pushed past their deadlines are refused and
                // given back at once, as the shim does.
                if let algorithm::confirm::Confirmed::Sent { pushed } = want {
                    for (other, _) in pushed {
                        let Some(j) = held.iter().position(|h| h.0 == other) else { continue };
                        let (id, checks, at, _) = held.remove(j);
                        let script = script_limits(&checks).expect("valid limits");
                        w.runtime
                            .block_on(wait::cancel(w.limiter.waiting(), &script, Some(Micros(now)), &id, at))
                            .expect("cancel");
                        let reserved: Vec<algorithm::cancel::Reserved> =
                            script.iter().map(|l| (l.key.clone(), l.algorithm, None)).collect();
                        algorithm::cancel::cancel(&mut model, now, &id, at, &reserved);
                    }
                }
            }
            WaitOp::Back { dt } => now -= dt,
            WaitOp::Adjust { actual } => {
                let Some((checks, charges)) = last_sent.clone() else { continue };
                let adjustments: Vec<Adjustment> = checks[0]
                    .limits
                    .iter()
                    .zip(charges)
                    .filter(|(l, _)| matches!(l, WireLimit::Points { .. }))
                    .map(|(l, (held_until_us, refunded_us))| Adjustment {
                        policy: policy.clone(),
                        key: "k".into(),
                        id: None,
                        limit: *l,
                        actual: clamped(actual, l),
                        held_until_us,
                        refunded_us,
                        level: None,
                    })
                    .collect();
                if adjustments.is_empty() {
                    continue;
                }
                let script = sluice_shim::keys::script_adjustments(&adjustments).expect("valid adjustments");
                let model_adjust: Vec<_> = script.into_iter().filter(|a| a.delta != 0).collect();
                let req = AdjustRequest { adjustments, now_us: Some(Micros(now)) };
                let got = w.runtime.block_on(w.limiter.adjust(&req)).expect("adjust");
                let want = algorithm::adjust(&mut model, now, &model_adjust);
                let got: Vec<i64> = got.moved.into_iter().filter(|&n| n != 0).collect();
                let want: Vec<i64> = want.into_iter().filter(|&n| n != 0).collect();
                prop_assert_eq!(got, want, "moved at {}", now);
            }
        }
    }
    // The buckets' stored state too: what the real sends hold (`key:sent`)
    // decides later slots even where no reply has shown it yet.
    let mut conn = w.redis.connection().expect("redis connection");
    for (key, state) in &model.keys {
        if let algorithm::State::Sent { base, end } = state {
            let got: (Option<u64>, Option<u64>) =
                redis::cmd("HMGET").arg(key).arg("s").arg("e").query(&mut conn).expect("HMGET");
            prop_assert_eq!(got, (Some(*base), Some(*end)), "{} at the end", key);
        }
    }
    Ok(())
}

/// The waiting path (reserve.lua, confirm.lua, cancel.lua) decides exactly
/// as the model: the same slots, waits and views, through waits, late and
/// early confirmations, cancellations in any order, checks decided at once,
/// and clock steps back.
#[test]
fn waiting_scripts_decide_as_the_model() {
    let world = World::start();
    let mut runner = TestRunner::new(ProptestConfig { cases: 400, ..ProptestConfig::default() });
    let cases = (
        waiting_limits(),
        prop::sample::select(vec![0u64, 0, 1, 30]),
        prop::collection::vec(wait_op(), 1..40),
    );
    if let Err(failure) =
        runner.run(&cases, |(limits, margin, ops)| run_waiting_case(&world, limits, margin, ops))
    {
        panic!("{failure}");
    }
}

#[derive(Debug, Clone)]
enum QueueOp {
    /// After `dt` µs, a request that may wait `wait` µs (0: a plain check).
    Arrive { dt: u64, wait: u64 },
    /// The `n`th request that holds a lease or waits is released.
    Release { n: usize },
    /// The `n`th waiter leaves (its wait ran out or its client went away).
    Leave { n: usize },
    /// After `dt` µs, a waiting shim's reclaim timer fires.
    Reclaim { dt: u64 },
}

fn queue_op() -> impl Strategy<Value = QueueOp> {
    let dt = prop_oneof![2 => Just(0u64), 2 => 0u64..2_000, 1 => 0u64..200_000, 1 => Just(100_000u64)];
    let wait = prop_oneof![1 => Just(0u64), 3 => prop::sample::select(vec![1u64, 1_000, 50_000, 1_000_000])];
    prop_oneof![
        5 => (dt.clone(), wait).prop_map(|(dt, wait)| QueueOp::Arrive { dt, wait }),
        3 => any::<usize>().prop_map(|n| QueueOp::Release { n }),
        2 => any::<usize>().prop_map(|n| QueueOp::Leave { n }),
        1 => dt.prop_map(|dt| QueueOp::Reclaim { dt }),
    ]
}

/// The lease set and the queue as Redis holds them.
fn queue_state(conn: &mut redis::Connection, key: &str) -> (Vec<(String, f64)>, Vec<String>) {
    let leases = conn.zrange_withscores(key, 0, -1).unwrap_or_default();
    let queue = conn.zrange(format!("{key}:q"), 0, -1).unwrap_or_default();
    (leases, queue)
}

fn model_state(model: &RedisTwin, key: &str) -> (Vec<(String, f64)>, Vec<String>) {
    let mut leases: Vec<(u64, String)> = match model.keys.get(key) {
        Some(algorithm::State::Set(entries)) => entries.clone(),
        _ => Vec::new(),
    };
    leases.sort();
    let mut queue: Vec<(u64, String)> = match model.keys.get(&format!("{key}:q")) {
        Some(algorithm::State::Queue(waiters)) => waiters.iter().map(|w| (w.seq, w.id.clone())).collect(),
        _ => Vec::new(),
    };
    queue.sort();
    (leases.into_iter().map(|(x, m)| (m, x as f64)).collect(), queue.into_iter().map(|(_, m)| m).collect())
}

fn run_queue_case(w: &World, limit: u32, lease_ms: u64, ops: Vec<QueueOp>) -> Result<(), TestCaseError> {
    static CASE: AtomicU64 = AtomicU64::new(0);
    let policy = format!("q{}", CASE.fetch_add(1, Ordering::Relaxed));
    let checks = vec![Check {
        policy,
        key: "k".into(),
        limits: vec![WireLimit::Concurrency { limit, lease_ms: Millis(lease_ms) }],
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }];
    let script = script_limits(&checks).expect("valid limits");
    let key = script[0].key.clone();
    let (limit, lease) = (u64::from(limit), lease_ms * 1000);
    let mut conn = w.redis.connection().expect("redis connection");
    let mut model = RedisTwin::default();
    let mut now = 1_700_000_000_000_000u64;
    let mut ids: Vec<String> = Vec::new();
    for (n, op) in ops.into_iter().enumerate() {
        match op {
            QueueOp::Arrive { dt, wait } => {
                now += dt;
                let id = format!("r{n}");
                ids.push(id.clone());
                if wait == 0 {
                    let req = CheckRequest {
                        checks: checks.as_slice().into(),
                        now_us: Some(Micros(now)),
                        id: Some(id.clone().into()),
                        wait_ms: None,
                        views: Default::default(),
                    };
                    let got = w.runtime.block_on(w.limiter.check(&req)).expect("check");
                    let want = algorithm::check(&mut model, now, &id, &[(key.clone(), script[0].algorithm)]);
                    prop_assert_eq!(got.allowed, want.allowed, "check at {}", now);
                    prop_assert_eq!(&got.checks[0].limits, &want.limits, "limits at {}", now);
                } else {
                    let (got, got_reclaimed) = w
                        .runtime
                        .block_on(queue::acquire(
                            w.limiter.waiting(),
                            &script[0],
                            &now.to_string(),
                            &id,
                            wait,
                            "ch",
                        ))
                        .expect("acquire");
                    let (want, want_reclaimed) =
                        algorithm::queue::acquire(&mut model, &key, now, &id, limit, lease, wait, "ch");
                    // The shim answers with the model's own `AcquireReply`.
                    prop_assert_eq!(got, want, "acquire at {}", now);
                    prop_assert_eq!(got_reclaimed, want_reclaimed, "reclaimed at {}", now);
                }
            }
            QueueOp::Release { n } => {
                if ids.is_empty() {
                    continue;
                }
                let lease_id = ids[n % ids.len()].clone();
                let req = ReleaseRequest { lease: lease_id.clone(), checks: checks.clone() };
                let got = w.runtime.block_on(w.limiter.release_at(&req, Some(Micros(now)))).expect("release");
                let want = algorithm::release(&mut model, now, &[(key.clone(), limit, lease)], &lease_id);
                prop_assert_eq!(got.released, want, "released at {}", now);
            }
            QueueOp::Leave { n } => {
                if ids.is_empty() {
                    continue;
                }
                let id = ids[n % ids.len()].clone();
                let got = w
                    .runtime
                    .block_on(queue::leave_now(w.limiter.waiting(), &script[0], &now.to_string(), &id))
                    .expect("leave");
                let want = algorithm::queue::leave(&mut model, &key, now, &id, limit, lease);
                prop_assert_eq!(got, i64::from(want), "leave at {}", now);
            }
            QueueOp::Reclaim { dt } => {
                now += dt;
                let got = w
                    .runtime
                    .block_on(queue::reclaim_now(w.limiter.waiting(), &script[0], &now.to_string()))
                    .expect("reclaim");
                let want = algorithm::queue::reclaim_timer(&mut model, &key, now, limit, lease);
                prop_assert_eq!(got, want, "reclaim at {}", now);
            }
        }
        let (leases, queue) = queue_state(&mut conn, &key);
        prop_assert_eq!(
            (&leases, &queue),
            (&model_state(&model, &key).0, &model_state(&model, &key).1),
            "state after {}",
            n
        );
        let live = leases.iter().filter(|(_, x)| *x > now as f64).count() as u64;
        prop_assert!(live <= limit, "{} live leases over a limit of {}", live, limit);
    }
    Ok(())
}

/// The queue scripts (acquire, release with hand-over and tombstones, leave,
/// reclaim) and plain checks on the same lease set decide exactly as the
/// model, leave the same leases and the same queue, and never hold more
/// than `limit` live leases.
#[test]
fn queue_scripts_decide_as_the_model() {
    let world = World::start();
    let mut runner = TestRunner::new(ProptestConfig { cases: 300, ..ProptestConfig::default() });
    let cases =
        (1u32..4, prop::sample::select(vec![5u64, 100, 1_000]), prop::collection::vec(queue_op(), 1..40));
    if let Err(failure) =
        runner.run(&cases, |(limit, lease_ms, ops)| run_queue_case(&world, limit, lease_ms, ops))
    {
        panic!("{failure}");
    }
}

/// A time limit that a mixed request waits on beside its concurrency limit.
fn time_limit() -> impl Strategy<Value = WireLimit> {
    prop_oneof![
        prop::sample::select(vec![1u64, 10, 100])
            .prop_map(|every_ms| WireLimit::Interval { every_ms: Millis(every_ms) }),
        (1u32..4, prop::sample::select(vec![7u64, 100])).prop_map(|(limit, window_ms)| {
            WireLimit::SlidingWindow { limit, window_ms: Millis(window_ms), approximate: false }
        }),
        (1u32..4, prop::sample::select(vec![7u64, 100])).prop_map(|(limit, window_ms)| {
            WireLimit::FixedWindow { limit, window_ms: Millis(window_ms), cost: 1 }
        }),
        (1u32..4, prop::sample::select(vec![10u64, 100]), 1u32..3)
            .prop_map(|(rate, per_ms, burst)| WireLimit::TokenBucket { rate, per_ms: Millis(per_ms), burst }),
    ]
}

#[derive(Debug, Clone)]
enum MixedOp {
    /// After `dt` µs, a mixed request that may wait `wait` µs reserves its time slot.
    Arrive { dt: u64, wait: u64 },
    /// The `n`th reserved request reaches its time slot and takes the concurrency slot or queues.
    Take { n: usize },
    /// The `n`th request is released.
    Release { n: usize },
    /// The `n`th request leaves the queue.
    Leave { n: usize },
    /// After `dt` µs, a reclaim timer fires.
    Reclaim { dt: u64 },
    /// After `dt` µs, a request under both limits decided at once.
    Check { dt: u64 },
}

fn mixed_op() -> impl Strategy<Value = MixedOp> {
    let dt = prop_oneof![2 => Just(0u64), 2 => 0u64..2_000, 1 => 0u64..200_000];
    let wait = prop::sample::select(vec![1u64, 1_000, 50_000, 1_000_000]);
    prop_oneof![
        4 => (dt.clone(), wait).prop_map(|(dt, wait)| MixedOp::Arrive { dt, wait }),
        4 => any::<usize>().prop_map(|n| MixedOp::Take { n }),
        3 => any::<usize>().prop_map(|n| MixedOp::Release { n }),
        1 => any::<usize>().prop_map(|n| MixedOp::Leave { n }),
        1 => dt.clone().prop_map(|dt| MixedOp::Reclaim { dt }),
        2 => dt.prop_map(|dt| MixedOp::Check { dt }),
    ]
}

/// A time limit's state as Redis holds it, and as the model does, in one form.
fn time_state(conn: &mut redis::Connection, key: &str) -> String {
    let kind: String = redis::cmd("TYPE").arg(key).query(conn).unwrap_or_default();
    match kind.as_str() {
        "zset" => {
            format!("{:?}", conn.zrange_withscores::<_, Vec<(String, u64)>>(key, 0, -1).unwrap_or_default())
        }
        "hash" => {
            let (w, n): (Option<u64>, Option<u64>) =
                redis::cmd("HMGET").arg(key).arg("w").arg("n").query(conn).unwrap_or_default();
            format!("{w:?} {n:?}")
        }
        "string" => format!("{:?}", conn.get::<_, Option<u64>>(key).unwrap_or_default()),
        _ => String::new(),
    }
}

fn model_time_state(model: &RedisTwin, key: &str) -> String {
    match model.keys.get(key) {
        Some(algorithm::State::Set(entries)) => {
            let mut e: Vec<(u64, String)> = entries.clone();
            e.sort();
            if e.is_empty() {
                return String::new();
            }
            format!("{:?}", e.into_iter().map(|(s, m)| (m, s)).collect::<Vec<_>>())
        }
        Some(algorithm::State::Counter { window, count }) => format!("{:?} {:?}", Some(window), Some(count)),
        Some(algorithm::State::Tat(t)) => format!("{:?}", Some(t)),
        _ => String::new(),
    }
}

fn run_mixed_case(
    w: &World,
    (limit, lease_ms): (u32, u64),
    time_limit: WireLimit,
    time_first: bool,
    ops: Vec<MixedOp>,
) -> Result<(), TestCaseError> {
    static CASE: AtomicU64 = AtomicU64::new(0);
    let policy = format!("m{}", CASE.fetch_add(1, Ordering::Relaxed));
    let check = |limits: Vec<WireLimit>| {
        vec![Check {
            policy: policy.clone(),
            key: "k".into(),
            limits,
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        }]
    };
    let concurrency = WireLimit::Concurrency { limit, lease_ms: Millis(lease_ms) };
    let all = check(if time_first { vec![time_limit, concurrency] } else { vec![concurrency, time_limit] });
    let time_only = check(vec![time_limit]);
    let script = script_limits(&all).expect("valid limits");
    let (c, t) = if time_first { (1, 0) } else { (0, 1) };
    let (conc, time) = (script[c].clone(), vec![script[t].clone()]);
    let model_limits: Vec<(String, Algorithm)> =
        script.iter().map(|l| (l.key.clone(), l.algorithm)).collect();
    let waiting: Vec<algorithm::reserve::Waiting> = vec![(time[0].key.clone(), time[0].algorithm, 0)];
    let (limit, lease) = (u64::from(limit), lease_ms * 1000);
    let mut conn = w.redis.connection().expect("redis connection");
    let mut model = RedisTwin::default();
    let mut now = 1_700_000_000_000_000u64;
    let mut ids: Vec<String> = Vec::new();
    // Reserved, not yet taken: id, slot, gcra tat set, wait left.
    let mut pending: Vec<(String, u64, Vec<u64>, u64)> = Vec::new();
    for (n, op) in ops.into_iter().enumerate() {
        match op {
            MixedOp::Arrive { dt, wait } => {
                now += dt;
                let id = format!("r{n}");
                ids.push(id.clone());
                let req = CheckRequest {
                    checks: time_only.as_slice().into(),
                    now_us: Some(Micros(now)),
                    id: Some(id.clone().into()),
                    wait_ms: Some(Millis(wait.div_ceil(1000))),
                    views: Default::default(),
                };
                let got =
                    w.runtime.block_on(wait::reserve_request(w.limiter.waiting(), &req)).expect("reserve");
                let want =
                    algorithm::reserve::reserve(&mut model, now, &id, wait.div_ceil(1000) * 1000, &waiting)
                        .expect("waits");
                prop_assert_eq!(&got.response.checks[0].limits, &want.reply.limits, "reserve at {}", now);
                prop_assert_eq!(got.at, want.at, "slot at {}", now);
                if let Some(at) = got.at {
                    let held = got.response.checks[0]
                        .limits
                        .iter()
                        .map(|l| l.held_until_us.map_or(0, Micros::get))
                        .collect();
                    pending.push((id, at, held, wait));
                }
            }
            MixedOp::Take { n } => {
                if pending.is_empty() {
                    continue;
                }
                let (id, at, held, wait) = pending.remove(n % pending.len());
                now = now.max(at);
                let got = w
                    .runtime
                    .block_on(mixed::take(
                        w.limiter.waiting(),
                        &conc,
                        &time,
                        &[0],
                        &now.to_string(),
                        &id,
                        wait,
                        "ch",
                        at,
                        &held,
                    ))
                    .expect("take");
                let (want, want_reclaimed) = algorithm::queue::take(
                    &mut model,
                    &conc.key,
                    now,
                    &id,
                    (limit, lease, wait),
                    "ch",
                    at,
                    &waiting,
                    &held,
                );
                prop_assert_eq!(got, (want, want_reclaimed), "take at {}", now);
            }
            MixedOp::Release { n } => {
                if ids.is_empty() {
                    continue;
                }
                let lease_id = ids[n % ids.len()].clone();
                let req = ReleaseRequest { lease: lease_id.clone(), checks: all.clone() };
                let got = w.runtime.block_on(w.limiter.release_at(&req, Some(Micros(now)))).expect("release");
                let want =
                    algorithm::release(&mut model, now, &[(conc.key.clone(), limit, lease)], &lease_id);
                prop_assert_eq!(got.released, want, "released at {}", now);
            }
            MixedOp::Leave { n } => {
                if ids.is_empty() {
                    continue;
                }
                let id = ids[n % ids.len()].clone();
                let got = w
                    .runtime
                    .block_on(queue::leave_now(w.limiter.waiting(), &conc, &now.to_string(), &id))
                    .expect("leave");
                let want = algorithm::queue::leave(&mut model, &conc.key, now, &id, limit, lease);
                prop_assert_eq!(got, i64::from(want), "leave at {}", now);
            }
            MixedOp::Check { dt } => {
                now += dt;
                let id = format!("r{n}");
                ids.push(id.clone());
                let req = CheckRequest {
                    checks: all.as_slice().into(),
                    now_us: Some(Micros(now)),
                    id: Some(id.clone().into()),
                    wait_ms: None,
                    views: Default::default(),
                };
                let got = w.runtime.block_on(w.limiter.check(&req)).expect("check");
                let want = algorithm::check(&mut model, now, &id, &model_limits);
                prop_assert_eq!(got.allowed, want.allowed, "check at {}", now);
                prop_assert_eq!(&got.checks[0].limits, &want.limits, "check limits at {}", now);
            }
            MixedOp::Reclaim { dt } => {
                now += dt;
                let got = w
                    .runtime
                    .block_on(queue::reclaim_now(w.limiter.waiting(), &conc, &now.to_string()))
                    .expect("reclaim");
                let want = algorithm::queue::reclaim_timer(&mut model, &conc.key, now, limit, lease);
                prop_assert_eq!(got, want, "reclaim at {}", now);
            }
        }
        let (leases, queue) = queue_state(&mut conn, &conc.key);
        let (want_leases, want_queue) = model_state(&model, &conc.key);
        prop_assert_eq!((&leases, &queue), (&want_leases, &want_queue), "leases and queue after op {}", n);
        prop_assert_eq!(
            time_state(&mut conn, &time[0].key),
            model_time_state(&model, &time[0].key),
            "time state after op {}",
            n
        );
        let live = leases.iter().filter(|(_, x)| *x > now as f64).count() as u64;
        prop_assert!(live <= limit, "{} live leases over a limit of {}", live, limit);
    }
    Ok(())
}

/// Mixed waits: reserve the time slot, take the concurrency slot or queue
/// with the time limits attached (take.lua), and hand-overs that re-check
/// them (queue.lua), all decide as the model and leave the same leases,
/// queue and time-limit state.
#[test]
fn mixed_scripts_decide_as_the_model() {
    let world = World::start();
    let mut runner = TestRunner::new(ProptestConfig { cases: 300, ..ProptestConfig::default() });
    let cases = (
        (1u32..3, prop::sample::select(vec![5u64, 100, 1_000])),
        time_limit(),
        any::<bool>(),
        prop::collection::vec(mixed_op(), 1..40),
    );
    if let Err(failure) = runner.run(&cases, |(c, t, first, ops)| run_mixed_case(&world, c, t, first, ops)) {
        panic!("{failure}");
    }
}

#[derive(Debug, Clone)]
enum LeaseOp {
    /// After `dt` µs, an exact check of the window (a request that found its lease empty).
    Check { dt: u64 },
    /// After `dt` µs, a lease of up to `want` tokens, after giving back
    /// `back` tokens to the window `offset` windows before now's (if `back` > 0).
    Lease { dt: u64, want: u32, back: u32, offset: u64 },
}

fn lease_op() -> impl Strategy<Value = LeaseOp> {
    let round = prop::sample::select(vec![1u64, 1_000, 7_000, 50_000, 1_000_000]);
    let near = (round, -1i64..=1).prop_map(|(r, d)| r.saturating_add_signed(d));
    let dt = prop_oneof![3 => Just(0u64), 3 => near, 2 => 0u64..2_000, 1 => 0u64..200_000];
    prop_oneof![
        2 => dt.clone().prop_map(|dt| LeaseOp::Check { dt }),
        3 => (dt, 0u32..12, prop_oneof![2 => Just(0u32), 1 => 0u32..12], 0u64..2)
            .prop_map(|(dt, want, back, offset)| LeaseOp::Lease { dt, want, back, offset }),
    ]
}

fn run_lease_case(w: &World, limit: u32, window_ms: u64, ops: Vec<LeaseOp>) -> Result<(), TestCaseError> {
    static CASE: AtomicU64 = AtomicU64::new(0);
    let policy = format!("l{}", CASE.fetch_add(1, Ordering::Relaxed));
    let wire = WireLimit::FixedWindow { limit, window_ms: Millis(window_ms), cost: 1 };
    let checks = vec![Check {
        policy: policy.clone(),
        key: String::new(),
        limits: vec![wire],
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }];
    let script = script_limits(&checks).expect("valid limit");
    let key = script[0].key.clone();
    let model_limits: Vec<(String, Algorithm)> =
        script.iter().map(|l| (l.key.clone(), l.algorithm)).collect();
    let window_us = window_ms * 1000;
    let mut conn = w.redis.connection().expect("redis connection");
    let mut model = RedisTwin::default();
    let mut now = 1_700_000_000_000_000u64;
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            LeaseOp::Check { dt } => {
                now += dt;
                let req = CheckRequest {
                    checks: checks.as_slice().into(),
                    now_us: Some(Micros(now)),
                    id: None,
                    wait_ms: None,
                    views: Default::default(),
                };
                let got = w.runtime.block_on(w.limiter.check(&req)).expect("check");
                let want = algorithm::check(&mut model, now, &format!("m{i}"), &model_limits);
                prop_assert_eq!(got.allowed, want.allowed, "check at {}", now);
                prop_assert_eq!(&got.checks[0].limits, &want.limits, "check at {}", now);
            }
            LeaseOp::Lease { dt, want, back, offset } => {
                now += dt;
                let back_window = (now / window_us).saturating_sub(offset);
                let give_back = (back > 0).then_some(GiveBack {
                    window: back_window,
                    tokens: back.min(limit),
                    charged: None,
                });
                let req = LeaseRequest {
                    policy: policy.clone(),
                    key: String::new(),
                    limit: wire,
                    want: want.min(limit),
                    give_back,
                    ttl_ms: None,
                    now_us: Some(Micros(now)),
                    call: None,
                };
                let got = w.runtime.block_on(w.limiter.lease(&req)).expect("lease");
                let grant = algorithm::lease(
                    &mut model,
                    now,
                    &key,
                    limit.into(),
                    window_us,
                    want.min(limit).into(),
                    give_back.map(|b| (b.window, b.tokens.into())),
                );
                let modelled = LeaseResponse {
                    granted: u32::try_from(grant.granted).expect("small"),
                    window: grant.window,
                    expires_in_ms: Millis(grant.expires_in_us / 1000),
                    remaining: grant.remaining,
                };
                prop_assert_eq!(got, modelled, "lease at {}", now);
            }
        }
        prop_assert_eq!(time_state(&mut conn, &key), model_time_state(&model, &key), "state after op {}", i);
    }
    Ok(())
}

/// Leased mode: `lua/scripts/lease.lua` grants and takes back exactly as the model,
/// interleaved with the window's exact checks, around window boundaries,
/// with give-backs to now's window and to the one before.
#[test]
fn lease_script_decides_as_the_model() {
    let world = World::start();
    let mut runner = TestRunner::new(ProptestConfig { cases: 300, ..ProptestConfig::default() });
    let cases =
        (1u32..20, prop::sample::select(vec![1u64, 7, 50, 1_000]), prop::collection::vec(lease_op(), 1..40));
    if let Err(failure) =
        runner.run(&cases, |(limit, window_ms, ops)| run_lease_case(&world, limit, window_ms, ops))
    {
        panic!("{failure}");
    }
}

/// A lease call with its id: after `dt` µs, gateway `gateway`'s call number
/// `seq`, a new one, the last one sent again (its answer lost), or an older
/// one run late.
#[derive(Debug, Clone)]
struct IdLeaseOp {
    dt: u64,
    gateway: u64,
    /// -1: an older call than the gateway's last; 0: the last one again; 1: the next.
    step: i64,
    want: u32,
    back: u32,
    offset: u64,
}

fn id_lease_op() -> impl Strategy<Value = IdLeaseOp> {
    let dt = prop_oneof![3 => Just(0u64), 2 => 0u64..2_000, 1 => 0u64..200_000];
    (
        dt,
        1u64..3,
        prop_oneof![3 => Just(1i64), 2 => Just(0i64), 1 => Just(-1i64)],
        0u32..12,
        0u32..12,
        0u64..2,
    )
        .prop_map(|(dt, gateway, step, want, back, offset)| IdLeaseOp {
            dt,
            gateway,
            step,
            want,
            back,
            offset,
        })
}

fn run_id_lease_case(
    w: &World,
    limit: u32,
    window_ms: u64,
    ops: Vec<IdLeaseOp>,
) -> Result<(), TestCaseError> {
    static CASE: AtomicU64 = AtomicU64::new(0);
    let policy = format!("i{}", CASE.fetch_add(1, Ordering::Relaxed));
    let wire = WireLimit::FixedWindow { limit, window_ms: Millis(window_ms), cost: 1 };
    let checks = vec![Check {
        policy: policy.clone(),
        key: String::new(),
        limits: vec![wire],
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }];
    let key = script_limits(&checks).expect("valid limit")[0].key.clone();
    let calls_key = algorithm::lease_calls_key(&key);
    let window_us = window_ms * 1000;
    let mut conn = w.redis.connection().expect("redis connection");
    let mut model = RedisTwin::default();
    let mut now = 1_700_000_000_000_000u64;
    let mut seqs = [0u64; 3];
    for (i, op) in ops.into_iter().enumerate() {
        now += op.dt;
        let seq = &mut seqs[op.gateway as usize];
        *seq = seq.saturating_add_signed(op.step);
        let back_window = (now / window_us).saturating_sub(op.offset);
        let give_back = (op.back > 0).then_some(GiveBack {
            window: back_window,
            tokens: op.back.min(limit),
            charged: None,
        });
        let want = op.want.min(limit);
        let call = LeaseCall { gateway: op.gateway, seq: *seq };
        let req = LeaseRequest {
            policy: policy.clone(),
            key: String::new(),
            limit: wire,
            want,
            give_back,
            ttl_ms: None,
            now_us: Some(Micros(now)),
            call: Some(call),
        };
        let got = w.runtime.block_on(w.limiter.lease(&req)).expect("lease");
        let gateway = op.gateway.to_string();
        let grant = algorithm::lease_call(
            &mut model,
            now,
            &key,
            limit.into(),
            window_us,
            want.into(),
            give_back.map(|b| (b.window, b.tokens.into())),
            Some((gateway.as_str(), *seq)),
        );
        let modelled = LeaseResponse {
            granted: u32::try_from(grant.granted).expect("small"),
            window: grant.window,
            expires_in_ms: Millis(grant.expires_in_us / 1000),
            remaining: grant.remaining,
        };
        prop_assert_eq!(got, modelled, "lease {:?} at {}", call, now);
        prop_assert_eq!(time_state(&mut conn, &key), model_time_state(&model, &key), "state after op {}", i);
        prop_assert_eq!(
            records(&mut conn, &calls_key),
            model_records(&model, &calls_key),
            "record after op {}",
            i
        );
    }
    Ok(())
}

/// A leased limit's calls' record as Redis holds it, sorted.
fn records(conn: &mut redis::Connection, calls_key: &str) -> Vec<(String, String)> {
    let mut records: Vec<(String, String)> = conn.hgetall(calls_key).unwrap_or_default();
    records.sort();
    records
}

/// The model's calls' record, as Redis would hold it.
fn model_records(model: &RedisTwin, calls_key: &str) -> Vec<(String, String)> {
    match model.keys.get(calls_key) {
        Some(algorithm::State::Calls(calls)) => {
            calls.iter().map(|(g, (s, w, n))| (g.clone(), format!("{s} {w} {n}"))).collect()
        }
        _ => Vec::new(),
    }
}

/// Lost answers: `lua/scripts/lease.lua` with call ids answers a call sent
/// again with the grant it recorded (charged once, its give-back taken
/// once), does nothing for a late run of an older call, and keeps one
/// record per gateway, cleared when a new window is charged: exactly as the
/// model, interleaved across two gateways, around window boundaries.
#[test]
fn lease_script_with_call_ids_decides_as_the_model() {
    let world = World::start();
    let mut runner = TestRunner::new(ProptestConfig { cases: 300, ..ProptestConfig::default() });
    let cases = (
        1u32..20,
        prop::sample::select(vec![1u64, 7, 50, 1_000]),
        prop::collection::vec(id_lease_op(), 1..40),
    );
    if let Err(failure) =
        runner.run(&cases, |(limit, window_ms, ops)| run_id_lease_case(&world, limit, window_ms, ops))
    {
        panic!("{failure}");
    }
}

/// A bucket lease call, or an exact check: after `dt` µs.
#[derive(Debug, Clone)]
enum BucketLeaseOp {
    /// An exact check of the bucket (a request that found its lease empty).
    Check { dt: u64 },
    /// Gateway `gateway`'s call (a new one, the last sent again, or an
    /// older one run late, as [`IdLeaseOp`]; none when `gateway` is 0):
    /// up to `want` tokens, after giving back `back` of the period
    /// `periods_ago` before now's, of which it held `charged` more.
    Lease { dt: u64, gateway: u64, step: i64, want: u32, back: u32, charged: u32, periods_ago: u64 },
}

fn bucket_lease_op() -> impl Strategy<Value = BucketLeaseOp> {
    let round = prop::sample::select(vec![1u64, 1_000, 5_000, 50_000, 1_000_000]);
    let near = (round, -1i64..=1).prop_map(|(r, d)| r.saturating_add_signed(d));
    let dt = prop_oneof![3 => Just(0u64), 3 => near, 2 => 0u64..5_000, 1 => 0u64..2_000_000];
    prop_oneof![
        2 => dt.clone().prop_map(|dt| BucketLeaseOp::Check { dt }),
        4 => (
            dt,
            0u64..3,
            prop_oneof![3 => Just(1i64), 2 => Just(0i64), 1 => Just(-1i64)],
            0u32..12,
            prop_oneof![2 => Just(0u32), 1 => 0u32..12],
            0u32..20,
            0u64..3,
        )
            .prop_map(|(dt, gateway, step, want, back, charged, periods_ago)| BucketLeaseOp::Lease {
                dt,
                gateway,
                step,
                want,
                back,
                charged,
                periods_ago,
            }),
    ]
}

fn bucket_limit() -> impl Strategy<Value = WireLimit> {
    let per = prop::sample::select(vec![1u64, 7, 50, 1_000]);
    prop_oneof![
        (1u32..4, per.clone(), 1u32..20).prop_map(|(rate, per_ms, burst)| WireLimit::TokenBucket {
            rate,
            per_ms: Millis(per_ms),
            burst
        }),
        (1u32..20, per)
            .prop_map(|(capacity, drain_ms)| WireLimit::LeakyBucket { capacity, drain_ms: Millis(drain_ms) }),
    ]
}

fn run_bucket_lease_case(
    w: &World,
    wire: WireLimit,
    ttl_ms: u64,
    ops: Vec<BucketLeaseOp>,
) -> Result<(), TestCaseError> {
    static CASE: AtomicU64 = AtomicU64::new(0);
    let policy = format!("b{}", CASE.fetch_add(1, Ordering::Relaxed));
    let checks = vec![Check {
        policy: policy.clone(),
        key: "k".into(),
        limits: vec![wire],
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }];
    let script = script_limits(&checks).expect("valid limit");
    let key = script[0].key.clone();
    let model_limits: Vec<(String, Algorithm)> =
        script.iter().map(|l| (l.key.clone(), l.algorithm)).collect();
    let Algorithm::Gcra { interval_us, burst, .. } = script[0].algorithm else {
        return Err(TestCaseError::fail("not a bucket"));
    };
    let most = burst.min(u64::from(u32::MAX)) as u32;
    let (calls_key, horizon_key) = (algorithm::lease_calls_key(&key), algorithm::lease_horizon_key(&key));
    let period_us = ttl_ms * 1000;
    let mut conn = w.redis.connection().expect("redis connection");
    let mut model = RedisTwin::default();
    let mut now = 1_700_000_000_000_000u64;
    let mut seqs = [0u64; 3];
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            BucketLeaseOp::Check { dt } => {
                now += dt;
                let req = CheckRequest {
                    checks: checks.as_slice().into(),
                    now_us: Some(Micros(now)),
                    id: None,
                    wait_ms: None,
                    views: Default::default(),
                };
                let got = w.runtime.block_on(w.limiter.check(&req)).expect("check");
                let want = algorithm::check(&mut model, now, &format!("m{i}"), &model_limits);
                prop_assert_eq!(got.allowed, want.allowed, "check at {}", now);
                prop_assert_eq!(&got.checks[0].limits, &want.limits, "check at {}", now);
            }
            BucketLeaseOp::Lease { dt, gateway, step, want, back, charged, periods_ago } => {
                now += dt;
                let call = (gateway > 0).then(|| {
                    let seq = &mut seqs[gateway as usize];
                    *seq = seq.saturating_add_signed(step);
                    LeaseCall { gateway, seq: *seq }
                });
                let window = (now / period_us).saturating_sub(periods_ago);
                let tokens = back.min(most);
                let give_back =
                    (back > 0).then_some(GiveBack { window, tokens, charged: Some(tokens + charged) });
                let req = LeaseRequest {
                    policy: policy.clone(),
                    key: "k".into(),
                    limit: wire,
                    want: want.min(most),
                    give_back,
                    ttl_ms: Some(Millis(ttl_ms)),
                    now_us: Some(Micros(now)),
                    call,
                };
                let got = w.runtime.block_on(w.limiter.lease(&req)).expect("lease");
                let gateway_id = gateway.to_string();
                let grant = algorithm::lease_bucket_call(
                    &mut model,
                    now,
                    &key,
                    (interval_us.get(), burst),
                    period_us,
                    want.min(most).into(),
                    give_back.map(|b| algorithm::BucketGiveBack {
                        window: b.window,
                        tokens: b.tokens.into(),
                        charged: b.charged.unwrap_or(b.tokens).into(),
                    }),
                    call.map(|c| (gateway_id.as_str(), c.seq)),
                );
                prop_assert_eq!(got, LeaseResponse::from(grant), "lease {:?} at {}", call, now);
            }
        }
        prop_assert_eq!(time_state(&mut conn, &key), model_time_state(&model, &key), "state after op {}", i);
        let horizon: Option<u64> = conn.get(&horizon_key).unwrap_or_default();
        let modelled = match model.keys.get(&horizon_key) {
            Some(&algorithm::State::Horizon(h)) => Some(h),
            _ => None,
        };
        prop_assert_eq!(horizon, modelled, "horizon after op {}", i);
        prop_assert_eq!(
            records(&mut conn, &calls_key),
            model_records(&model, &calls_key),
            "record after op {}",
            i
        );
    }
    Ok(())
}

/// Leased buckets: `lua/scripts/lease_bucket.lua` grants, charges at the
/// period's end, takes back (late, early, too old, with or without what
/// the gateway was charged) and answers calls sent again or run late
/// exactly as the model, interleaved with the bucket's exact checks,
/// around period boundaries, for token and leaky buckets.
#[test]
fn lease_bucket_script_decides_as_the_model() {
    let world = World::start();
    let mut runner = TestRunner::new(ProptestConfig { cases: 300, ..ProptestConfig::default() });
    let cases = (
        bucket_limit(),
        prop::sample::select(vec![1u64, 5, 50, 1_000]),
        prop::collection::vec(bucket_lease_op(), 1..40),
    );
    if let Err(failure) =
        runner.run(&cases, |(wire, ttl_ms, ops)| run_bucket_lease_case(&world, wire, ttl_ms, ops))
    {
        panic!("{failure}");
    }
}
