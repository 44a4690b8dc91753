//! `lua/scripts/shed.lua` against its Rust twin, `sluice_policies::shed::Shedder`,
//! on a real redis-server: the same level, to the last bit, after every
//! report of random traffic; and one level for a fleet of reporters.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use sluice_harness::Redis;
use sluice_policies::shed::{ShedSettings, ShedState, Shedder};
use sluice_policies::units::Millis;
use sluice_policies::wire::ShedRequest;
use sluice_shim::decision::CheckError;
use sluice_shim::limiter::Limiter;
use sluice_shim::shed::ShedScript;
use sluice_shim::store::{RedisClient, Target};

const CLASSES: usize = 4;

fn reports() -> impl Strategy<Value = Vec<(u64, f64)>> {
    let utilization = prop_oneof![Just(0.8), Just(0.7), Just(0.75), 0.0f64..1.0, Just(1.0), Just(0.0)];
    prop::collection::vec((prop_oneof![Just(0u64), 0u64..5_000, 0u64..60_000], utilization), 1..80)
}

/// The script moves the level exactly as the model does, report by report.
#[test]
fn the_script_controls_as_the_model() {
    let redis = Redis::start().expect("redis");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _in_runtime = runtime.enter();
    let store = RedisClient::new(&Target::Single(redis.url()), Duration::from_secs(5)).expect("store");
    let shed = ShedScript::new();
    let settings = ShedSettings::default();
    let mut runner = TestRunner::new(ProptestConfig { cases: 200, ..ProptestConfig::default() });
    let case = std::cell::Cell::new(0u64);
    runner
        .run(&reports(), |reports| {
            case.set(case.get() + 1);
            let policy = format!("p{}", case.get());
            let mut model = Shedder::new(settings, CLASSES);
            let mut now = 1_700_000_000_000u64;
            for (dt, u) in reports {
                now += dt;
                let got = runtime
                    .block_on(shed.report(&store, &policy, CLASSES, &settings, u, Some(Millis(now))))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                model.observe(now, u);
                prop_assert_eq!(
                    got.level.to_bits(),
                    model.level().to_bits(),
                    "level {} vs {} at {}",
                    got.level,
                    model.level(),
                    now
                );
                prop_assert_eq!(got.trouble_since_ms, model.trouble_since());
            }
            Ok(())
        })
        .expect("the script and the model agree");
}

/// Two gateways reporting in turn drive one level: after 28 s of trouble
/// seen by either, both read the same level back.
#[test]
fn a_fleet_shares_one_level() {
    let redis = Redis::start().expect("redis");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _in_runtime = runtime.enter();
    let store = RedisClient::new(&Target::Single(redis.url()), Duration::from_secs(5)).expect("store");
    let shed = ShedScript::new();
    let settings = ShedSettings::default();
    let t0 = 1_700_000_000_000u64;
    let mut levels = Vec::new();
    for i in 0..=60u64 {
        // Gateway A reports on even seconds, B on odd ones.
        let level = runtime
            .block_on(shed.report(&store, "fleet", CLASSES, &settings, 0.9, Some(Millis(t0 + i * 1_000))))
            .expect("report");
        levels.push(level.level);
    }
    let mut model = Shedder::from_state(settings, CLASSES, ShedState::default());
    for i in 0..=60u64 {
        model.observe(t0 + i * 1_000, 0.9);
    }
    assert_eq!(levels[27], 0.0, "nothing shed before 28 s of trouble");
    assert!(levels[29] > 0.0);
    assert_eq!(levels[60].to_bits(), model.level().to_bits());
}

/// A utilization outside 0 to 1 (or NaN) is refused before it reaches Redis.
#[test]
fn nonsense_utilization_is_refused() {
    let redis = Redis::start().expect("redis");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _in_runtime = runtime.enter();
    let store = RedisClient::new(&Target::Single(redis.url()), Duration::from_secs(5)).expect("store");
    for u in [f64::NAN, -0.1, 1.5, f64::INFINITY] {
        let got = runtime.block_on(ShedScript::new().report(
            &store,
            "p",
            CLASSES,
            &ShedSettings::default(),
            u,
            Some(Millis(1)),
        ));
        assert!(got.is_err(), "{u} accepted");
    }
}

/// A report Redis fails is the store's failure (503 on the wire), not the
/// gateway's mistake; a report out of range is the gateway's (400).
#[test]
fn a_failed_report_is_the_stores_failure_and_a_bad_one_the_gateways() {
    let redis = Redis::start().expect("redis");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _in_runtime = runtime.enter();
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter");
    let report = |utilization: f64| ShedRequest {
        policy: "api".into(),
        classes: CLASSES,
        high: 0.8,
        low: 0.6,
        delay_ms: Millis(1_000),
        ramp_ms: Millis(5_000),
        recovery_ms: Millis(10_000),
        utilization: Some(utilization),
        now_ms: None,
    };
    let shed = |req: ShedRequest| runtime.block_on(limiter.shed(&req));
    assert!(shed(report(0.5)).is_ok());
    assert!(matches!(shed(report(2.0)), Err(CheckError::BadRequest(_))), "out of range");
    redis.refuse_scripts().expect("ACL");
    let failed = shed(report(0.5));
    redis.allow_scripts().expect("ACL");
    assert!(matches!(failed, Err(CheckError::Store(_))), "{failed:?}");
}
