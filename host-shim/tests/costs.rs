//! Costs out of range, against a real Redis through the shim's `Limiter`:
//! the shim refuses a points cost above the capacity on `/v1/check` and an
//! actual cost above it on `/v1/adjust`, so one bogus header cannot drive a
//! bucket into years of debt nor leave its key without a TTL. (Before, an
//! adjustment of `u32::MAX` was taken: it locked this test's key for 13
//! years, and on a slow bucket, 1 per 365 days, the TTL overflowed what
//! PEXPIRE takes, so the script failed after storing the new state and left
//! the key with no TTL at all.)

use std::time::Duration;

use redis::Commands;
use sluice_harness::Redis;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{AdjustRequest, Adjustment, Check, CheckRequest, CheckResponse, WireLimit};
use sluice_shim::limiter::{CheckError, Limiter};
use sluice_shim::store::Target;

const SECOND: u64 = 1_000_000;
const KEY: &str = "sluice:{p:k}:gcra:100000";

fn points(cost: u32) -> WireLimit {
    WireLimit::Points { capacity: 100, refill_ms: Millis(10_000), cost }
}

async fn check(limiter: &Limiter, cost: u32, now_us: u64) -> Result<CheckResponse, CheckError> {
    let checks = vec![Check {
        policy: "p".into(),
        key: "k".into(),
        limits: vec![points(cost)],
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }];
    limiter
        .check(&CheckRequest {
            checks: checks.into(),
            now_us: Some(Micros(now_us)),
            id: None,
            wait_ms: None,
            views: Default::default(),
        })
        .await
}

async fn adjust(limiter: &Limiter, cost: u32, actual: u32, now_us: u64) -> Result<(), CheckError> {
    let adjustment = Adjustment {
        policy: "p".into(),
        key: "k".into(),
        id: None,
        limit: points(cost),
        actual,
        held_until_us: None,
        refunded_us: Micros(0),
        level: None,
    };
    limiter
        .adjust(&AdjustRequest { adjustments: vec![adjustment], now_us: Some(Micros(now_us)) })
        .await
        .map(|_| ())
}

fn pttl(redis: &Redis) -> i64 {
    redis.connection().expect("redis connection").pttl(KEY).expect("PTTL")
}

/// The largest actual cost (the capacity) empties the bucket and no more:
/// the next request waits one token's time, the key expires within one
/// refill. `u32::MAX`, negative-looking or huge values never reach Redis.
#[tokio::test]
async fn an_actual_cost_beyond_the_capacity_is_refused_and_the_lockout_bounded() {
    let redis = Redis::start().expect("redis");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter");
    let t0 = 1_700_000_000 * SECOND;

    assert!(check(&limiter, 50, t0).await.expect("check").allowed);
    for hostile in [u32::MAX, 101, 1_000_000_000] {
        match adjust(&limiter, 50, hostile, t0).await {
            Err(CheckError::BadRequest(reason)) => {
                assert_eq!(reason, format!("adjustments[0].actual: {hostile} exceeds the capacity 100"))
            }
            other => panic!("actual {hostile}: {other:?}"),
        }
        let ttl = pttl(&redis);
        assert!((1..=11_000).contains(&ttl), "actual {hostile}: PTTL {ttl}");
    }
    adjust(&limiter, 50, 100, t0).await.expect("the capacity itself is a valid actual cost");
    let ttl = pttl(&redis);
    assert!((1..=11_000).contains(&ttl), "PTTL {ttl} after charging the whole capacity");
    let next = check(&limiter, 1, t0).await.expect("check");
    assert!(!next.allowed);
    assert_eq!(next.retry_after_ms, Some(Millis(100)), "an empty bucket waits one token (10 s / 100)");
}

/// A check whose points cost exceeds the capacity is refused, not decided:
/// the filter clamps every cost it sends to the capacity.
#[tokio::test]
async fn a_check_cost_beyond_the_capacity_is_refused() {
    let redis = Redis::start().expect("redis");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter");
    match check(&limiter, u32::MAX, 1_700_000_000 * SECOND).await {
        Err(CheckError::BadRequest(reason)) => {
            assert_eq!(reason, "checks[0].limits[0]: cost 4294967295 exceeds the capacity 100")
        }
        other => panic!("{other:?}"),
    }
    let exists: bool = redis.connection().expect("redis connection").exists(KEY).expect("EXISTS");
    assert!(!exists);
}
