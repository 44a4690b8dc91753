//! Egress waiting on a concurrency limit through the shim's `Limiter`, on a
//! real redis-server and real time: waiters are served in arrival order the
//! moment a slot is released (pub/sub, no polling), a wait that runs out is
//! refused and leaves the queue, a crashed holder's slot reaches the queue
//! by its lease without new traffic, and a release that overtakes its own
//! check leaves no lease alive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Commands;
use sluice_harness::Redis;
use sluice_policies::units::Millis;
use sluice_policies::wire::{Check, CheckRequest, CheckResponse, ReleaseRequest, WireLimit};
use sluice_shim::limiter::{CheckError, Limiter};
use sluice_shim::store::Target;

const KEY: &str = "sluice:{p:k}:cc:10000";

fn limiter(redis: &Redis) -> Arc<Limiter> {
    Arc::new(Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter"))
}

fn checks(limits: &[WireLimit]) -> Vec<Check> {
    vec![Check {
        policy: "p".into(),
        key: "k".into(),
        limits: limits.to_vec(),
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }]
}

fn slot(limit: u32, lease_ms: u64) -> [WireLimit; 1] {
    [WireLimit::Concurrency { limit, lease_ms: Millis(lease_ms) }]
}

async fn check(limiter: &Limiter, id: &str, limits: &[WireLimit], wait_ms: u64) -> CheckResponse {
    let req = CheckRequest {
        checks: checks(limits).into(),
        now_us: None,
        id: Some(id.to_string().into()),
        wait_ms: Some(Millis(wait_ms)),
        views: Default::default(),
    };
    match limiter.check(&req).await {
        Ok(resp) => resp,
        Err(err) => panic!("check failed: {err:?}"),
    }
}

async fn release(limiter: &Limiter, id: &str, limits: &[WireLimit]) -> u64 {
    let req = ReleaseRequest { lease: id.into(), checks: checks(limits) };
    limiter.release(&req).await.expect("release").released
}

fn queued(redis: &Redis, key: &str) -> u64 {
    redis.connection().expect("redis connection").zcard(format!("{key}:q")).expect("ZCARD")
}

async fn until_queued(redis: &Redis, key: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while queued(redis, key) < n {
        assert!(Instant::now() < deadline, "never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Limit 1: two waiters queue behind the holder; each release hands the
/// slot to the oldest waiter at once, and the lease it answers with is its own.
#[tokio::test]
async fn released_slots_go_to_the_oldest_waiter_at_once() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis);
    let one = slot(1, 10_000);
    assert_eq!(check(&limiter, "r1", &one, 0).await.lease.as_deref(), Some("r1"));
    let l = limiter.clone();
    let second = tokio::spawn(async move { check(&l, "r2", &one, 5_000).await });
    until_queued(&redis, KEY, 1).await;
    let l = limiter.clone();
    let third = tokio::spawn(async move { check(&l, "r3", &one, 5_000).await });
    until_queued(&redis, KEY, 2).await;

    let released = Instant::now();
    assert_eq!(release(&limiter, "r1", &one).await, 1);
    let second = second.await.expect("r2");
    assert!(second.allowed && second.lease.as_deref() == Some("r2"), "{second:?}");
    assert!(released.elapsed() < Duration::from_millis(500), "the hand-over took {:?}", released.elapsed());
    assert!(second.waited_ms.is_some(), "{second:?}");
    assert!(!third.is_finished(), "r3 overtook r2 or got a second slot");

    assert_eq!(release(&limiter, "r2", &one).await, 1);
    let third = third.await.expect("r3");
    assert!(third.allowed && third.lease.as_deref() == Some("r3"), "{third:?}");
    assert_eq!(queued(&redis, KEY), 0);
}

/// A wait that runs out is refused with an unknown retry, on time, and
/// leaves the queue: the next release finds nobody to hand the slot to.
#[tokio::test]
async fn a_wait_that_runs_out_is_refused_and_leaves_the_queue() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis);
    let one = slot(1, 10_000);
    assert!(check(&limiter, "r1", &one, 0).await.allowed);
    let started = Instant::now();
    let late = check(&limiter, "r2", &one, 200).await;
    let took = started.elapsed();
    assert!(!late.allowed && late.retry_after_ms.is_none(), "{late:?}");
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_millis(400),
        "answered after {took:?}"
    );
    // The answer does not wait for Redis: the waiter leaves from a spawned task.
    let deadline = Instant::now() + Duration::from_secs(2);
    while queued(&redis, KEY) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(queued(&redis, KEY), 0, "the timed-out waiter is still queued");
    assert_eq!(release(&limiter, "r1", &one).await, 1);
    let leases: u64 = redis.connection().expect("conn").zcard(KEY).expect("ZCARD");
    assert_eq!(leases, 0, "a slot went to a waiter that had left");
}

/// A client that goes away while queued leaves the queue.
#[tokio::test]
async fn a_client_that_goes_away_leaves_the_queue() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis);
    let one = slot(1, 10_000);
    assert!(check(&limiter, "r1", &one, 0).await.allowed);
    let gone = tokio::time::timeout(Duration::from_millis(100), check(&limiter, "r2", &one, 5_000)).await;
    assert!(gone.is_err());
    let deadline = Instant::now() + Duration::from_secs(2);
    while queued(&redis, KEY) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(queued(&redis, KEY), 0, "the cancelled waiter is still queued");
}

/// The holder crashed (never releases): its lease expires, and the waiting
/// shim's timer reclaims the slot for the waiter without any new traffic.
#[tokio::test]
async fn a_crashed_holders_slot_reaches_the_waiter_by_its_lease() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis);
    let short = slot(1, 300);
    assert!(check(&limiter, "r1", &short, 0).await.allowed);
    let started = Instant::now();
    let waiter = check(&limiter, "r2", &short, 3_000).await;
    assert!(waiter.allowed && waiter.lease.as_deref() == Some("r2"), "{waiter:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(1_500),
        "served after {took:?}"
    );
}

/// Regression (correctness issue, item 3): a release for lease X that
/// arrives before the check that takes lease X (a client reset during a
/// slow check) left that lease alive until its TTL. The release now
/// tombstones X, and the late check takes no lease.
#[tokio::test]
async fn a_release_that_overtakes_its_check_leaves_no_lease() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis);
    let one = slot(1, 10_000);
    assert_eq!(release(&limiter, "x", &one).await, 0);
    let late = check(&limiter, "x", &one, 0).await;
    assert!(!late.allowed, "a released lease was granted: {late:?}");
    let leases: u64 = redis.connection().expect("conn").zcard(KEY).expect("ZCARD");
    assert_eq!(leases, 0, "a lease outlived its own release");
    assert!(check(&limiter, "y", &one, 0).await.allowed, "the slot is free for others");
}

/// Two concurrency limits in one waiting request cannot wait: one queue
/// per request, a clear 400.
#[tokio::test]
async fn two_concurrency_limits_cannot_wait() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis);
    let two = [
        WireLimit::Concurrency { limit: 1, lease_ms: Millis(10_000) },
        WireLimit::Concurrency { limit: 1, lease_ms: Millis(20_000) },
    ];
    let req = CheckRequest {
        checks: checks(&two).into(),
        now_us: None,
        id: None,
        wait_ms: Some(Millis(100)),
        views: Default::default(),
    };
    match limiter.check(&req).await {
        Err(CheckError::BadRequest(reason)) => assert!(reason.contains("concurrency"), "{reason}"),
        other => panic!("expected a 400, got {other:?}"),
    }
}

fn leases(redis: &Redis, key: &str) -> Vec<String> {
    redis.connection().expect("redis connection").zrange(key, 0, -1).expect("ZRANGE")
}

/// Mixed waits (a concurrency limit and an interval) never hold the
/// concurrency slot while waiting for the time slot, and hand the slot
/// over with the time limit re-checked:
/// - r1 holds both; r2 reserves the next interval slot and, at it, finds
///   the concurrency slot taken, so it gives its interval slot back and
///   queues; r3 then gets the interval slot at once and queues behind r2;
/// - r1's release hands the slot to r2, whose interval admits it now;
/// - r2's release finds r3's interval not yet due: r3's time slot is
///   reserved, the concurrency slot stays free (nobody holds it while r3
///   waits), and r3 takes it at its time slot.
#[tokio::test]
async fn mixed_waits_never_hold_a_concurrency_slot_while_waiting_for_time() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis);
    let mixed = [
        WireLimit::Concurrency { limit: 1, lease_ms: Millis(10_000) },
        WireLimit::Interval { every_ms: Millis(400) },
    ];
    let r1 = check(&limiter, "r1", &mixed, 3_000).await;
    assert!(r1.allowed && r1.lease.as_deref() == Some("r1"), "{r1:?}");

    let l = limiter.clone();
    let r2 = tokio::spawn(async move { check(&l, "r2", &mixed, 5_000).await });
    // Before its interval slot r2 holds nothing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(leases(&redis, KEY), ["r1"], "r2 took the concurrency slot before its time slot");
    until_queued(&redis, KEY, 1).await;
    let l = limiter.clone();
    let r3 = tokio::spawn(async move { check(&l, "r3", &mixed, 5_000).await });
    until_queued(&redis, KEY, 2).await;

    assert_eq!(release(&limiter, "r1", &mixed).await, 1);
    let r2 = r2.await.expect("r2");
    assert!(r2.allowed && r2.lease.as_deref() == Some("r2"), "{r2:?}");
    assert_eq!(leases(&redis, KEY), ["r2"]);

    assert_eq!(release(&limiter, "r2", &mixed).await, 1);
    // r3's interval slot is ~400 ms after r2's: the concurrency slot waits free.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!r3.is_finished(), "r3 admitted before its interval slot");
    assert!(leases(&redis, KEY).is_empty(), "a concurrency slot is held while its request waits for time");
    let r3 = r3.await.expect("r3");
    assert!(r3.allowed && r3.lease.as_deref() == Some("r3"), "{r3:?}");
}

/// Redis drops the shim's wake-up subscription while a request waits: the
/// wake-up could not reach it, so the check fails (503, and the filter
/// applies its failure_mode) instead of waiting blind.
#[tokio::test]
async fn losing_the_wake_up_subscription_while_waiting_is_a_store_error() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis);
    let one = slot(1, 10_000);
    assert!(check(&limiter, "r1", &one, 0).await.allowed);
    let l = limiter.clone();
    let waiter = tokio::spawn(async move {
        let req = CheckRequest {
            checks: checks(&one).into(),
            now_us: None,
            id: Some("r2".into()),
            wait_ms: Some(Millis(5_000)),
            views: Default::default(),
        };
        l.check(&req).await
    });
    until_queued(&redis, KEY, 1).await;
    let started = Instant::now();
    let _: u64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"][..])
        .query(&mut redis.connection().expect("conn"))
        .expect("CLIENT KILL");
    match waiter.await.expect("task") {
        Err(CheckError::Store(_)) => {}
        other => panic!("expected a store error, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(1));
}
