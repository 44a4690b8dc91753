//! Redis Cluster: a request whose policies hash to different slots is
//! decided by one call per slot, reserve-then-refund. When one slot denies,
//! what the other slots charged is taken back, for every algorithm.

use std::time::Duration;

use redis::cluster_routing::Slot;
use sluice_harness::RedisCluster;
use sluice_policies::units::Millis;
use sluice_policies::wire::{Check, CheckRequest, WireLimit};
use sluice_shim::limiter::Limiter;
use sluice_shim::store::Target;

fn every_algorithm(limit: u32) -> Vec<WireLimit> {
    vec![
        WireLimit::SlidingWindow { limit, window_ms: Millis(3_600_000), approximate: false },
        WireLimit::SlidingWindow { limit, window_ms: Millis(7_200_000), approximate: true },
        WireLimit::FixedWindow { limit, window_ms: Millis(31_536_000_000), cost: 1 },
        WireLimit::TokenBucket { rate: 1, per_ms: Millis(3_600_000), burst: limit },
        WireLimit::Concurrency { limit, lease_ms: Millis(3_600_000) },
    ]
}

fn check(policy: &str, limits: Vec<WireLimit>) -> Check {
    Check {
        policy: policy.into(),
        key: "k".into(),
        limits,
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }
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
    let narrow = WireLimit::SlidingWindow { limit: 1, window_ms: Millis(3_600_000), approximate: false };
    let both = CheckRequest {
        checks: vec![check("wide", every_algorithm(5)), check("narrow", vec![narrow])].into(),
        now_us: None,
        id: None,
        wait_ms: None,
        views: Default::default(),
    };

    let first = limiter.check(&both).await.expect("check");
    assert!(first.allowed);
    assert!(first.lease.is_some(), "the concurrency limit holds a lease");
    for _ in 0..10 {
        let denied = limiter.check(&both).await.expect("check");
        assert!(!denied.allowed);
        assert!(denied.checks[0].limits.iter().all(|l| l.allowed), "wide itself allowed: {denied:?}");
        assert!(!denied.checks[1].limits[0].allowed);
        assert!(denied.retry_after_ms.is_some_and(|ms| ms > Millis(3_000_000)), "{denied:?}");
    }

    // Only `wide` now: 4 more pass on every algorithm, the fifth does not.
    let wide = CheckRequest {
        checks: vec![check("wide", every_algorithm(5))].into(),
        now_us: None,
        id: None,
        wait_ms: None,
        views: Default::default(),
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
                WireLimit::SlidingWindow { limit: 25, window_ms: Millis(5_000), approximate: false },
                WireLimit::SlidingWindow { limit: 300, window_ms: Millis(60_000), approximate: false },
            ],
        )]
        .into(),
        now_us: None,
        id: None,
        wait_ms: None,
        views: Default::default(),
    };
    let mut allowed = 0;
    for _ in 0..40 {
        if limiter.check(&req).await.expect("check").allowed {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 25);
}

/// Egress waiting on a cluster. A waiting request whose checks land in one
/// slot waits as on one server: held for its time slot, or queued for a
/// concurrency slot and woken by pub/sub from whichever node holds the key.
/// A waiting request whose checks span several slots does not wait: it is
/// decided at once, as without `wait_ms` (one atomic call cannot reserve
/// across slots). A mixed wait in one slot queues and is handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_on_a_cluster() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.expect("task").expect("cluster");
    let limiter = std::sync::Arc::new(
        Limiter::new(&Target::Cluster(cluster.urls()), Duration::from_secs(5), false).expect("limiter"),
    );
    let every = |ms| vec![WireLimit::Interval { every_ms: Millis(ms) }];
    let waiting = |checks: Vec<Check>, wait_ms| CheckRequest {
        checks: checks.into(),
        now_us: None,
        id: None,
        wait_ms: Some(Millis(wait_ms)),
        views: Default::default(),
    };

    // One slot: held until the slot.
    let one = waiting(vec![check("one", every(300))], 2_000);
    assert!(limiter.check(&one).await.expect("check").allowed);
    let started = std::time::Instant::now();
    let held = limiter.check(&one).await.expect("check");
    assert!(held.allowed && held.waited_ms.is_some(), "{held:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));

    // Two slots: decided at once.
    let spread = waiting(vec![check("wide", every(60_000)), check("narrow", every(60_000))], 2_000);
    assert!(limiter.check(&spread).await.expect("check").allowed);
    let started = std::time::Instant::now();
    let denied = limiter.check(&spread).await.expect("check");
    assert!(!denied.allowed && denied.waited_ms.is_none(), "{denied:?}");
    assert!(started.elapsed() < Duration::from_millis(1_000), "a request spanning slots was held");

    // A concurrency slot handed over across the cluster.
    let slot = vec![check("leases", vec![WireLimit::Concurrency { limit: 1, lease_ms: Millis(60_000) }])];
    let holder = limiter.check(&waiting(slot.clone(), 1)).await.expect("check");
    let lease = holder.lease.clone().expect("a lease");
    let l = limiter.clone();
    let s = slot.clone();
    let waiter = tokio::spawn(async move { l.check(&waiting(s, 5_000)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = limiter
        .release(&sluice_policies::wire::ReleaseRequest { lease, checks: slot })
        .await
        .expect("release");
    assert_eq!(released.released, 1);
    let served = waiter.await.expect("task").expect("check");
    assert!(served.allowed && served.lease.is_some(), "{served:?}");

    // A mixed wait (concurrency and interval in one policy, one slot): the
    // waiter queues with its time limit, and the hand-over re-checks it on
    // the node that holds the slot.
    let mixed = vec![check(
        "mixed",
        vec![
            WireLimit::Concurrency { limit: 1, lease_ms: Millis(60_000) },
            WireLimit::Interval { every_ms: Millis(100) },
        ],
    )];
    let holder = limiter.check(&waiting(mixed.clone(), 1_000)).await.expect("check");
    let lease = holder.lease.clone().expect("a lease");
    let l = limiter.clone();
    let m = mixed.clone();
    let waiter = tokio::spawn(async move { l.check(&waiting(m, 5_000)).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let released = limiter
        .release(&sluice_policies::wire::ReleaseRequest { lease, checks: mixed })
        .await
        .expect("release");
    assert_eq!(released.released, 1);
    let served = waiter.await.expect("task").expect("check");
    assert!(served.allowed && served.lease.is_some(), "{served:?}");
}

/// The fixed window's count of `policy` on the cluster, 0 when the key does not exist.
async fn fixed_count(cluster: &RedisCluster, policy: &str) -> (bool, i64) {
    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("client");
    let mut conn = client.get_async_connection().await.expect("connection");
    let key = format!("sluice:{{{policy}:k}}:fw:31536000000");
    let exists: bool = redis::cmd("EXISTS").arg(&key).query_async(&mut conn).await.expect("EXISTS");
    let n: Option<i64> = redis::cmd("HGET").arg(&key).arg("n").query_async(&mut conn).await.expect("HGET");
    (exists, n.unwrap_or(0))
}

/// Regression: a slot that denies stops the request there. The shim used
/// to go on charging the later slots only to refund them; now a slot after
/// the denial is never asked, so its keys are never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_stops_before_the_later_slots() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.expect("task").expect("cluster");
    let limiter =
        Limiter::new(&Target::Cluster(cluster.urls()), Duration::from_secs(5), false).expect("limiter");
    let spent = WireLimit::FixedWindow { limit: 1, window_ms: Millis(31_536_000_000), cost: 1 };
    let narrow = CheckRequest {
        checks: vec![check("narrow", vec![spent])].into(),
        now_us: None,
        id: None,
        wait_ms: None,
        views: Default::default(),
    };
    assert!(limiter.check(&narrow).await.expect("check").allowed);
    let both = CheckRequest {
        checks: vec![check("narrow", vec![spent]), check("wide", every_algorithm(5))].into(),
        now_us: None,
        id: None,
        wait_ms: None,
        views: Default::default(),
    };
    let denied = limiter.check(&both).await.expect("check");
    assert!(!denied.allowed);
    assert_eq!(fixed_count(&cluster, "wide").await, (false, 0), "a slot after the denial was charged");
    // The unasked limits read as allowed and full: the denial is narrow's.
    assert_eq!(denied.denied_check(), Some(0));
    assert!(denied.checks[1].limits.iter().all(|l| l.allowed));
}

/// Regression: a slot whose call fails gives back what the slots before it
/// charged. The shim used to return the error at once, leaving the earlier
/// slot charged until its window ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_slot_refunds_the_slots_before_it() {
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(60_000))
        .await
        .expect("task")
        .expect("cluster");
    let wide_master = cluster.master_of("sluice:{wide:k}").expect("master");
    // A second policy on another master.
    let (other, dead) = (0..100)
        .map(|i| format!("other{i}"))
        .find_map(|name| {
            let master = cluster.master_of(&format!("sluice:{{{name}:k}}")).ok()?;
            (master != wide_master).then_some((name, master))
        })
        .expect("a policy on another master");
    let limiter =
        Limiter::new(&Target::Cluster(cluster.urls()), Duration::from_secs(2), false).expect("limiter");
    let one = WireLimit::FixedWindow { limit: 5, window_ms: Millis(31_536_000_000), cost: 1 };
    let both = CheckRequest {
        checks: vec![check("wide", vec![one]), check(&other, vec![one])].into(),
        now_us: None,
        id: None,
        wait_ms: None,
        views: Default::default(),
    };
    assert!(limiter.check(&both).await.expect("check").allowed);
    assert_eq!(fixed_count(&cluster, "wide").await, (true, 1));
    // The other policy's master goes away (its replica is not promoted for a minute).
    tokio::task::block_in_place(|| cluster.kill(dead)).expect("kill");
    assert!(limiter.check(&both).await.is_err(), "a dead slot is a store error");
    assert_eq!(fixed_count(&cluster, "wide").await, (true, 1), "the failed request kept wide's charge");
}

/// Regression: a refund that fails keeps the request's denial. The shim
/// used to return the refund's error, a 503 that `failure_mode: allow`
/// turns into an admission of a request a limit had denied. Policy `wide`
/// admits and `narrow` (on another master) denies; `wide`'s master has the
/// check script cached but refuses to load any other (an ACL), so the
/// refund fails there. The answer is still the denial, and `wide` keeps the
/// charge: under-admission until it expires, never over-admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_refund_keeps_the_denial() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.expect("task").expect("cluster");
    let wide_master = cluster.master_of("sluice:{wide:k}").expect("master");
    let narrow = (0..100)
        .map(|i| format!("narrow{i}"))
        .find(|name| cluster.master_of(&format!("sluice:{{{name}:k}}")).is_ok_and(|m| m != wide_master))
        .expect("a policy on another master");
    let limiter =
        Limiter::new(&Target::Cluster(cluster.urls()), Duration::from_secs(5), false).expect("limiter");
    let request = |checks: Vec<Check>| CheckRequest {
        checks: checks.into(),
        now_us: None,
        id: None,
        wait_ms: None,
        views: Default::default(),
    };
    let one = WireLimit::FixedWindow { limit: 5, window_ms: Millis(31_536_000_000), cost: 1 };
    let spent = WireLimit::FixedWindow { limit: 1, window_ms: Millis(31_536_000_000), cost: 1 };
    // The check script is cached on both masters; narrow is spent.
    assert!(limiter.check(&request(vec![check("wide", vec![one])])).await.expect("check").allowed);
    assert!(limiter.check(&request(vec![check(&narrow, vec![spent])])).await.expect("check").allowed);
    // wide's master runs cached scripts but loads no new one: the refund fails there.
    let node = redis::Client::open(format!("redis://127.0.0.1:{wide_master}")).expect("client");
    let mut conn = node.get_multiplexed_async_connection().await.expect("connection");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-script|load")
        .arg("-eval")
        .query_async(&mut conn)
        .await
        .expect("ACL");

    let both = request(vec![check("wide", vec![one]), check(&narrow, vec![spent])]);
    let answer = limiter.check(&both).await.expect("a denial, not a store error");
    assert!(!answer.allowed);
    assert_eq!(answer.denied_check(), Some(1), "the denial is narrow's");
    assert_eq!(fixed_count(&cluster, "wide").await, (true, 2), "the failed refund left wide's charge");
}

/// Exact refunds on a cluster (issue 33): a token budget (`budget`, points)
/// and a request rate (`rate`, one an hour) land in different slots.
/// Request `a` reserves 500 of 10,000 under both; request `b` reserves 500
/// and `rate` denies it, so its budget charge is taken back on its slot
/// (`refund.lua`). `a` then settles to 50 and gives back all of its 450.
/// The regression: `refund.lua` logged nothing, `a`'s settlement took
/// `b`'s refund for one of a charge before its own, found its charge all
/// but refilled, and gave back nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_on_another_slot_leaves_a_settlement_exact() {
    use sluice_policies::units::Micros;
    use sluice_policies::wire::{AdjustRequest, Adjustment, Views};
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.expect("task").expect("cluster");
    assert_ne!(Slot::for_key("sluice:{budget:k}"), Slot::for_key("sluice:{rate:k}"));
    let limiter =
        Limiter::new(&Target::Cluster(cluster.urls()), Duration::from_secs(5), false).expect("limiter");
    let points = WireLimit::Points { capacity: 10_000, refill_ms: Millis(31_536_000_000), cost: 500 };
    let rate = WireLimit::FixedWindow { limit: 1, window_ms: Millis(3_600_000), cost: 1 };
    let request = |id: &'static str| CheckRequest {
        checks: vec![check("budget", vec![points]), check("rate", vec![rate])].into(),
        now_us: None,
        id: Some(id.into()),
        wait_ms: None,
        views: Views::All,
    };
    let a = limiter.check(&request("a")).await.expect("check");
    assert!(a.allowed, "{a:?}");
    let b = limiter.check(&request("b")).await.expect("check");
    assert!(!b.allowed && b.checks[0].limits[0].allowed, "the budget charged, the rate denied: {b:?}");
    let charge = a.checks[0].limits[0];
    let settle = AdjustRequest {
        adjustments: vec![Adjustment {
            policy: "budget".into(),
            key: "k".into(),
            id: Some("a".into()),
            limit: points,
            actual: 50,
            held_until_us: charge.held_until_us,
            refunded_us: charge.refunded_us,
            level: None,
        }],
        now_us: None,
    };
    let moved = limiter.adjust(&settle).await.expect("adjust").moved;
    assert_eq!(moved, vec![-450], "a gives back its own unused part, whole");
    assert!(charge.held_until_us.is_some_and(|t| t > Micros(0)));
}

/// Counted refusals (the RLS face's `charge: every_hit`) charge every slot,
/// after a denial too, and refund none: each window counts the cost
/// whatever the others say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counted_refusals_charge_every_slot_and_refund_none() {
    use sluice_policies::algorithm::Refusals;
    assert_ne!(Slot::for_key("sluice:{narrow:k}"), Slot::for_key("sluice:{wide:k}"));
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.expect("task").expect("cluster");
    let limiter =
        Limiter::new(&Target::Cluster(cluster.urls()), Duration::from_secs(5), false).expect("limiter");
    let window = |limit| WireLimit::FixedWindow { limit, window_ms: Millis(31_536_000_000), cost: 1 };
    let request = |checks: Vec<Check>| CheckRequest {
        checks: checks.into(),
        now_us: None,
        id: None,
        wait_ms: None,
        views: Default::default(),
    };
    let narrow = request(vec![check("narrow", vec![window(1)])]);
    assert!(limiter.check_charging(&narrow, Refusals::Counted).await.expect("check").allowed);
    let both = request(vec![check("narrow", vec![window(1)]), check("wide", vec![window(5)])]);
    let denied = limiter.check_charging(&both, Refusals::Counted).await.expect("check");
    assert!(!denied.allowed && denied.checks[1].limits[0].allowed, "{denied:?}");
    assert_eq!(fixed_count(&cluster, "narrow").await, (true, 2), "the refusal was counted");
    assert_eq!(fixed_count(&cluster, "wide").await, (true, 1), "the slot after the denial was charged, kept");
}
