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
use sluice_policies::algorithm::{self, Algorithm, Store};
use sluice_policies::wire::{AdjustRequest, Adjustment, Check, CheckRequest, ReleaseRequest, WireLimit};
use sluice_shim::keys::script_limits;
use sluice_shim::limiter::Limiter;
use sluice_shim::store::Target;
use sluice_tests::Redis;

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
        (1u32..20, window.clone()).prop_map(|(limit, window_ms)| WireLimit::FixedWindow { limit, window_ms }),
        (1u32..20, window.clone()).prop_map(|(limit, window_ms)| WireLimit::SlidingWindow {
            limit,
            window_ms,
            approximate: false
        }),
        (1u32..20, window).prop_map(|(limit, window_ms)| WireLimit::SlidingWindow {
            limit,
            window_ms,
            approximate: true
        }),
        (1u32..10, prop::sample::select(vec![10u64, 1_000, 3_000]), 1u32..10)
            .prop_map(|(rate, per_ms, burst)| WireLimit::TokenBucket { rate, per_ms, burst }),
        (1u32..10, prop::sample::select(vec![10u64, 700, 3_000]))
            .prop_map(|(capacity, drain_ms)| WireLimit::LeakyBucket { capacity, drain_ms }),
        prop::sample::select(vec![1u64, 10, 1_000]).prop_map(|every_ms| WireLimit::Interval { every_ms }),
        (1u32..5, prop::sample::select(vec![5u64, 100, 1_000]))
            .prop_map(|(limit, lease_ms)| WireLimit::Concurrency { limit, lease_ms }),
        (5u32..50, prop::sample::select(vec![100u64, 1_000]))
            .prop_map(|(capacity, refill_ms)| WireLimit::Points { capacity, refill_ms, cost: 1 }),
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

#[derive(Debug, Clone)]
enum Op {
    /// After `dt` µs, a check costing `cost` points (where points apply).
    Check { dt: u64, cost: u32 },
    /// Release the `n`th lease held (modulo how many are held).
    Release { n: usize },
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
        8 => (dt, 0u32..60).prop_map(|(dt, cost)| Op::Check { dt, cost }),
        1 => any::<usize>().prop_map(|n| Op::Release { n }),
        1 => (0u32..60).prop_map(|actual| Op::Adjust { actual }),
    ]
}

/// `actual` as the filter sends it: at most the points limit's capacity.
fn clamped(actual: u32, limit: &WireLimit) -> u32 {
    match *limit {
        WireLimit::Points { capacity, .. } => actual.min(capacity),
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
            other => other,
        })
        .collect()
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
    static CASE: AtomicU64 = AtomicU64::new(0);
    let policy = format!("p{}", CASE.fetch_add(1, Ordering::Relaxed));
    let key = "k".to_string();
    let mut conn = w.redis.connection().expect("redis connection");
    let mut model = Store::default();
    let mut now = 1_700_000_000_000_000u64;
    let mut held: Vec<(String, Vec<Check>)> = Vec::new();
    // The last admitted check, with what each of its limits charged until.
    let mut last_admitted: Option<(Vec<Check>, Vec<Option<u64>>)> = None;
    let mut id = 0u64;

    for op in ops {
        match op {
            Op::Check { dt, cost } => {
                now += dt;
                id += 1;
                let checks = vec![Check {
                    policy: policy.clone(),
                    key: key.clone(),
                    limits: with_cost(&limits, cost),
                    margin_ms: None,
                }];
                let script = script_limits(&checks).expect("valid limits");
                let model_limits: Vec<(String, Algorithm)> =
                    script.iter().map(|l| (l.key.clone(), l.algorithm)).collect();
                let keys: Vec<String> = script.iter().map(|l| l.key.clone()).collect();
                let before = snapshot(&mut conn, &keys);

                let req = CheckRequest {
                    checks: checks.as_slice().into(),
                    now_us: Some(now),
                    id: None,
                    wait_ms: None,
                };
                let got = w.runtime.block_on(w.limiter.check(&req)).expect("check");
                // The model names its entries as the shim does, so a lease is one id in both.
                let model_id = got.lease.clone().unwrap_or_else(|| format!("m{id}"));
                let want = algorithm::check(&mut model, now, &model_id, &model_limits);

                prop_assert_eq!(got.allowed, want.allowed, "decision at {}", now);
                prop_assert_eq!(got.retry_after_ms, want.retry_after_ms, "retry after at {}", now);
                prop_assert_eq!(&got.checks[0].limits, &want.limits, "limits at {}", now);

                if got.allowed {
                    let held_until = got.checks[0].limits.iter().map(|l| l.held_until_us).collect();
                    last_admitted = Some((checks.clone(), held_until));
                    if let Some(lease) = got.lease {
                        held.push((lease, checks));
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
                let keys: Vec<String> = script_limits(&checks)
                    .expect("valid limits")
                    .into_iter()
                    .filter(|l| matches!(l.algorithm, Algorithm::Concurrency { .. }))
                    .map(|l| l.key)
                    .collect();
                let want = algorithm::release(&mut model, &keys, &lease);
                let got = w
                    .runtime
                    .block_on(w.limiter.release(&ReleaseRequest { lease, checks }))
                    .expect("release");
                prop_assert_eq!(got.released, want, "released");
            }
            Op::Adjust { actual } => {
                let Some((checks, held_until)) = last_admitted.clone() else { continue };
                let adjustments: Vec<Adjustment> = checks[0]
                    .limits
                    .iter()
                    .zip(held_until)
                    .filter(|(l, _)| matches!(l, WireLimit::Points { .. }))
                    .map(|(l, held_until_us)| Adjustment {
                        policy: policy.clone(),
                        key: key.clone(),
                        limit: *l,
                        actual: clamped(actual, l),
                        held_until_us,
                    })
                    .collect();
                if adjustments.is_empty() {
                    continue;
                }
                let script = sluice_shim::keys::script_adjustments(&adjustments).expect("valid adjustments");
                let model_adjust: Vec<(String, u64, i64, u64)> = script
                    .iter()
                    .filter(|a| a.delta != 0)
                    .map(|a| (a.key.clone(), a.interval_us, a.delta, a.held_until_us))
                    .collect();
                let req = AdjustRequest { adjustments, now_us: Some(now) };
                w.runtime.block_on(w.limiter.adjust(&req)).expect("adjust");
                algorithm::adjust(&mut model, now, &model_adjust);
            }
        }
    }
    Ok(())
}

/// The script decides exactly as the model, for every limit type, alone and
/// combined, through checks, releases and adjustments.
#[test]
fn scripts_decide_as_the_model() {
    let world = World::start();
    let mut runner = TestRunner::new(ProptestConfig { cases: 500, ..ProptestConfig::default() });
    let cases = (limits(), prop::collection::vec(op(), 1..40));
    if let Err(failure) = runner.run(&cases, |(limits, ops)| run_case(&world, limits, ops)) {
        panic!("{failure}");
    }
}
