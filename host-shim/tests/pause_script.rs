//! Upstream feedback in the scripts (`lua/scripts/upstream.lua` records a pause and
//! lowers the rate, `lua/lib/pause.lua` and `lua/lib/rate.lua` are what every check
//! sees) against their Rust twins, `algorithm::pause` and `algorithm::rate`,
//! on a real redis-server: the same decisions, waits and slots over random
//! traffic; and the properties judged on true outcomes: a pause only ever
//! extends, nothing is admitted inside one, and no reservation falls inside
//! one.

use std::cell::Cell;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use sluice_harness::Redis;
use sluice_policies::algorithm::reserve::{self, Waiting};
use sluice_policies::algorithm::{self, Algorithm, RedisTwin, State};
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{Check, CheckRequest, FeedbackRequest, Pause, Slowdown, WireLimit};
use sluice_shim::keys::script_limits;
use sluice_shim::limiter::Limiter;
use sluice_shim::store::Target;
use sluice_shim::wait::reserve_request;

#[derive(Debug, Clone)]
enum Op {
    /// The partner says: stop for pause_ms; refused, it also lowers the rate.
    Feedback { dt: u64, pause_ms: u64, refused: bool },
    /// A request decided at once.
    Check { dt: u64 },
    /// A request that may wait up to wait_ms.
    Wait { dt: u64, wait_ms: u64 },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let dt = prop_oneof![Just(0u64), 0u64..2_000, 0u64..400_000, 0u64..3_000_000];
    let op = prop_oneof![
        2 => (dt.clone(), prop_oneof![Just(0u64), 1u64..3_000, Just(1_000u64)], any::<bool>())
            .prop_map(|(dt, pause_ms, refused)| Op::Feedback { dt, pause_ms, refused }),
        4 => dt.clone().prop_map(|dt| Op::Check { dt }),
        4 => (dt, prop_oneof![Just(1u64), 1u64..4_000]).prop_map(|(dt, wait_ms)| Op::Wait { dt, wait_ms }),
    ];
    prop::collection::vec(op, 1..60)
}

const LIMIT: WireLimit = WireLimit::SlidingWindow { limit: 3, window_ms: Millis(1_000), approximate: false };
/// Halves the rate, back in 4 s, never below a tenth: 3 a second becomes 1.
const SLOW: Slowdown = Slowdown { decrease_ppm: 500_000, recover_ms: Millis(4_000), min_ppm: 100_000 };

fn request(policy: &str, now_us: u64, id: &str, wait_ms: Option<u64>) -> CheckRequest<'static> {
    CheckRequest {
        checks: vec![Check {
            policy: policy.into(),
            key: "k".into(),
            limits: vec![LIMIT],
            margin_ms: None,
            upstream: true,
            levels: Vec::new(),
        }]
        .into(),
        now_us: Some(Micros(now_us)),
        id: Some(id.to_string().into()),
        wait_ms: wait_ms.map(Millis),
        views: Default::default(),
    }
}

/// The scripts decide as the model, and the true outcomes keep the pause.
#[test]
fn the_pause_scripts_decide_as_the_model() {
    let redis = Redis::start().expect("redis");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _in_runtime = runtime.enter();
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter");
    let case = Cell::new(0u64);
    let mut runner = TestRunner::new(ProptestConfig { cases: 150, ..ProptestConfig::default() });
    runner
        .run(&ops(), |ops| {
            case.set(case.get() + 1);
            let policy = format!("p{}", case.get());
            let probe = request(&policy, 0, "x", None);
            let keys: Vec<(String, Algorithm)> = script_limits(&probe.checks)
                .expect("valid")
                .into_iter()
                .map(|l| (l.key, l.algorithm))
                .collect();
            let (pause_key, rate_key) = (keys[1].0.clone(), keys[2].0.clone());
            let mut model = RedisTwin::default();
            let mut now = 1_700_000_000_000_000u64;
            // The pause's end as the partner set it: it must only grow.
            let mut until = 0u64;
            let mut admitted: Vec<u64> = Vec::new();
            for (n, op) in ops.into_iter().enumerate() {
                let id = format!("r{n}");
                match op {
                    Op::Feedback { dt, pause_ms, refused } => {
                        now += dt;
                        let slow = refused.then_some(SLOW);
                        let req = FeedbackRequest {
                            pauses: vec![Pause {
                                policy: policy.clone(),
                                key: "k".into(),
                                pause_ms: Millis(pause_ms),
                                slow,
                            }],
                            now_us: Some(Micros(now)),
                        };
                        let got = runtime
                            .block_on(limiter.feedback(&req))
                            .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                        let (moved, slowed) = algorithm::upstream(
                            &mut model,
                            now,
                            (&pause_key, &rate_key),
                            pause_ms * 1000,
                            slow.as_ref(),
                        );
                        prop_assert_eq!(got.extended, u64::from(moved));
                        prop_assert_eq!(got.slowed, u64::from(slowed));
                        prop_assert!(!slowed || now >= until, "a refusal inside a pause lowered the rate");
                        let Some(State::Pause(stored)) = model.keys.get(&pause_key).cloned() else {
                            return Err(TestCaseError::fail("no pause stored"));
                        };
                        prop_assert!(stored >= until, "a pause moved earlier: {} -> {}", until, stored);
                        until = stored;
                    }
                    Op::Check { dt } => {
                        now += dt;
                        let got = runtime
                            .block_on(limiter.check(&request(&policy, now, &id, None)))
                            .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                        let want = algorithm::check(&mut model, now, &id, &keys);
                        prop_assert_eq!(got.allowed, want.allowed, "decision at {}", now);
                        prop_assert_eq!(got.retry_after_ms, want.retry_after_ms);
                        prop_assert_eq!(
                            &got.checks[0].limits[0],
                            &want.limits[0],
                            "the scaled limit at {}",
                            now
                        );
                        let paused = want.limits[1].reset_ms;
                        prop_assert_eq!(got.checks[0].paused_ms, (paused > Millis(0)).then_some(paused));
                        if got.allowed {
                            prop_assert!(now >= until, "admitted at {} inside a pause until {}", now, until);
                            admitted.push(now);
                        }
                    }
                    Op::Wait { dt, wait_ms } => {
                        now += dt;
                        let got = runtime
                            .block_on(reserve_request(
                                limiter.waiting(),
                                &request(&policy, now, &id, Some(wait_ms)),
                            ))
                            .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                        let waiting: Vec<Waiting> = keys.iter().map(|(k, a)| (k.clone(), *a, 0)).collect();
                        let want = reserve::reserve(&mut model, now, &id, wait_ms * 1000, &waiting)
                            .expect("can wait");
                        prop_assert_eq!(got.response.allowed, want.reply.allowed, "reservation at {}", now);
                        prop_assert_eq!(got.at, want.at);
                        if let Some(at) = got.at {
                            prop_assert!(at >= until, "reserved at {} inside a pause until {}", at, until);
                            admitted.push(at);
                        }
                    }
                }
            }
            // The limit itself still holds over the admitted times.
            admitted.sort_unstable();
            for (i, &t) in admitted.iter().enumerate() {
                let within = admitted[i..].iter().take_while(|&&s| s < t + 1_000_000).count();
                prop_assert!(within <= 3, "{} admitted within a second of {}", within, t);
            }
            Ok(())
        })
        .expect("the scripts and the model agree");
}

/// A shorter or stale answer never shortens a pause: 10 s, then 1 s, then
/// 10 s again from later, which moves it.
#[test]
fn a_pause_only_extends() {
    let redis = Redis::start().expect("redis");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _in_runtime = runtime.enter();
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter");
    let t0 = 1_700_000_000_000_000u64;
    let record = |dt: u64, pause_ms: u64| {
        let req = FeedbackRequest {
            pauses: vec![Pause {
                policy: "p".into(),
                key: "k".into(),
                pause_ms: Millis(pause_ms),
                slow: None,
            }],
            now_us: Some(Micros(t0 + dt)),
        };
        runtime.block_on(limiter.feedback(&req)).expect("feedback").extended
    };
    assert_eq!(record(0, 10_000), 1);
    assert_eq!(record(1_000_000, 1_000), 0, "a shorter pause moved the end earlier");
    assert_eq!(record(2_000_000, 10_000), 1);
    let check = runtime.block_on(limiter.check(&request("p", t0 + 11_000_000, "a", None))).expect("check");
    assert!(!check.allowed);
    assert_eq!(check.checks[0].paused_ms, Some(Millis(1_000)));
    assert_eq!(check.retry_after_ms, Some(Millis(1_000)));
    let mut conn = redis.connection().expect("redis");
    let ttl: i64 = redis::cmd("PTTL").arg("sluice:{p:k}:pause").query(&mut conn).expect("PTTL");
    assert!(ttl > 0, "the pause key has no TTL");
}

/// Bad feedback is refused before it reaches Redis.
#[test]
fn bad_feedback_is_refused() {
    let redis = Redis::start().expect("redis");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _in_runtime = runtime.enter();
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter");
    let bad = |policy: &str, key: &str, pause_ms: u64| FeedbackRequest {
        pauses: vec![Pause {
            policy: policy.into(),
            key: key.into(),
            pause_ms: Millis(pause_ms),
            slow: None,
        }],
        now_us: None,
    };
    for req in [bad("p{", "k", 1), bad("p", "a b", 1), bad("p", "k", u64::MAX)] {
        assert!(runtime.block_on(limiter.feedback(&req)).is_err(), "{req:?} accepted");
    }
}

/// Regression: a request held for a slot it reserved before the partner
/// paused its key went out at that slot, inside the pause. Now, at its slot,
/// it finds the pause, gives the slot back and reserves again from the
/// pause's end: one per second, r2 reserved at about 1 s, a 2 s pause lands
/// at 0.2 s, so r2 is admitted after about 2.2 s, not 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_request_is_moved_past_a_pause_that_lands_while_it_waits() {
    let redis = Redis::start().expect("redis");
    let limiter = std::sync::Arc::new(
        Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter"),
    );
    let one_per_second = WireLimit::SlidingWindow { limit: 1, window_ms: Millis(1_000), approximate: false };
    let request = move |id: &str| CheckRequest {
        checks: vec![Check {
            policy: "p".into(),
            key: "k".into(),
            limits: vec![one_per_second],
            margin_ms: None,
            upstream: true,
            levels: Vec::new(),
        }]
        .into(),
        now_us: None,
        id: Some(id.to_string().into()),
        wait_ms: Some(Millis(5_000)),
        views: Default::default(),
    };
    assert!(limiter.check(&request("r1")).await.expect("r1").allowed);
    let held = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.check(&request("r2")).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pause = FeedbackRequest {
        pauses: vec![Pause { policy: "p".into(), key: "k".into(), pause_ms: Millis(2_000), slow: None }],
        now_us: None,
    };
    assert_eq!(limiter.feedback(&pause).await.expect("feedback").extended, 1);
    let r2 = held.await.expect("task").expect("r2");
    assert!(r2.allowed, "{r2:?}");
    let waited = r2.waited_ms.expect("held").get();
    assert!(waited >= 2_000, "r2 went out after {waited} ms, inside the 2 s pause that began at 0.2 s");
}
