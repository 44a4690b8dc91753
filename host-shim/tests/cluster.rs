//! Redis Cluster: a request whose policies hash to different slots is
//! decided by one call per slot, reserve-then-refund. When one slot denies,
//! what the other slots charged is taken back, for every algorithm.

use std::time::Duration;

use redis::cluster_routing::Slot;
use sluice_policies::wire::{Check, CheckRequest, WireLimit};
use sluice_shim::limiter::Limiter;
use sluice_shim::store::Target;
use sluice_tests::RedisCluster;

fn every_algorithm(limit: u32) -> Vec<WireLimit> {
    vec![
        WireLimit::SlidingWindow { limit, window_ms: 3_600_000, approximate: false },
        WireLimit::SlidingWindow { limit, window_ms: 7_200_000, approximate: true },
        WireLimit::FixedWindow { limit, window_ms: 31_536_000_000 },
        WireLimit::TokenBucket { rate: 1, per_ms: 3_600_000, burst: limit },
        WireLimit::Concurrency { limit, lease_ms: 3_600_000 },
    ]
}

fn check(policy: &str, limits: Vec<WireLimit>) -> Check {
    Check { policy: policy.into(), key: "k".into(), limits, margin_ms: None }
}

/// Policy `wide` (every algorithm, 5 each) and policy `narrow` (1 per hour)
/// land in different slots. Once `narrow` is spent, requests under both are
/// denied, and `wide` must not keep what it reserved for them: it still has
/// exactly 4 of 5 left afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_in_one_slot_refunds_the_others() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.expect("task").expect("cluster");
    assert_ne!(Slot::for_key("sluice:{wide:k}"), Slot::for_key("sluice:{narrow:k}"));
    let limiter =
        Limiter::new(&Target::Cluster(cluster.urls()), Duration::from_secs(5), false).expect("limiter");
    let narrow = WireLimit::SlidingWindow { limit: 1, window_ms: 3_600_000, approximate: false };
    let both = CheckRequest {
        checks: vec![check("wide", every_algorithm(5)), check("narrow", vec![narrow])].into(),
        now_us: None,
        id: None,
        wait_ms: None,
    };

    let first = limiter.check(&both).await.expect("check");
    assert!(first.allowed);
    assert!(first.lease.is_some(), "the concurrency limit holds a lease");
    for _ in 0..10 {
        let denied = limiter.check(&both).await.expect("check");
        assert!(!denied.allowed);
        assert!(denied.checks[0].limits.iter().all(|l| l.allowed), "wide itself allowed: {denied:?}");
        assert!(!denied.checks[1].limits[0].allowed);
        assert!(denied.retry_after_ms.is_some_and(|ms| ms > 3_000_000), "{denied:?}");
    }

    // Only `wide` now: 4 more pass on every algorithm, the fifth does not.
    let wide = CheckRequest {
        checks: vec![check("wide", every_algorithm(5))].into(),
        now_us: None,
        id: None,
        wait_ms: None,
    };
    for n in 0..4 {
        let resp = limiter.check(&wide).await.expect("check");
        assert!(resp.allowed, "request {n} after the refunds: {resp:?}");
    }
    let resp = limiter.check(&wide).await.expect("check");
    assert!(!resp.allowed);
    assert!(resp.checks[0].limits.iter().all(|l| !l.allowed), "every algorithm is spent: {resp:?}");
}

/// On a cluster, a request's limits in one slot still go in one call, and the
/// single-slot path admits exactly up to the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slot_on_a_cluster_is_exact() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.expect("task").expect("cluster");
    let limiter =
        Limiter::new(&Target::Cluster(cluster.urls()), Duration::from_secs(5), false).expect("limiter");
    let req = CheckRequest {
        checks: vec![check(
            "dual",
            vec![
                WireLimit::SlidingWindow { limit: 25, window_ms: 5_000, approximate: false },
                WireLimit::SlidingWindow { limit: 300, window_ms: 60_000, approximate: false },
            ],
        )]
        .into(),
        now_us: None,
        id: None,
        wait_ms: None,
    };
    let mut allowed = 0;
    for _ in 0..40 {
        if limiter.check(&req).await.expect("check").allowed {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 25);
}
