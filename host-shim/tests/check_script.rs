//! The check script against a real redis-server, through the shim's
//! `Limiter`. Most tests use the shim's test mode, an explicit time in
//! microseconds, so that every decision is deterministic.

use std::time::Duration;

use redis::Commands;
use sluice_harness::Redis;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{
    AdjustRequest, Adjustment, Check, CheckRequest, CheckResponse, RenewRequest, WireLimit,
};
use sluice_shim::limiter::{CheckError, Limiter};
use sluice_shim::store::Target;

const SECOND: u64 = 1_000_000;

fn limiter(redis: &Redis, test_time: bool) -> Limiter {
    Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), test_time).expect("limiter")
}

fn window(limit: u32, window_ms: u64) -> WireLimit {
    WireLimit::SlidingWindow { limit, window_ms: Millis(window_ms), approximate: false }
}

fn request(key: &str, limits: &[WireLimit], now_us: Option<u64>) -> CheckRequest<'static> {
    CheckRequest {
        checks: vec![Check {
            policy: "p".into(),
            key: key.into(),
            limits: limits.to_vec(),
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        }]
        .into(),
        now_us: now_us.map(Micros),
        id: None,
        wait_ms: None,
        views: Default::default(),
    }
}

async fn check(limiter: &Limiter, key: &str, limits: &[WireLimit], now_us: u64) -> CheckResponse {
    match limiter.check(&request(key, limits, Some(now_us))).await {
        Ok(resp) => resp,
        Err(err) => panic!("check failed: {err:?}"),
    }
}

fn zcard(redis: &Redis, key: &str) -> u64 {
    redis.connection().expect("redis connection").zcard(key).expect("ZCARD")
}

/// A request that the first window rejects is not charged to the second
/// window (the S0 bug), and one that the second rejects is not charged to
/// the first.
#[tokio::test]
async fn dual_window_is_all_or_nothing() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis, true);
    let limits = [window(2, 1_000), window(3, 10_000)];
    let t0 = 1_700_000_000 * SECOND;

    let allowed: Vec<bool> = futures_in_order(&limiter, &limits, &[t0, t0 + 1, t0 + 2, t0 + 3]).await;
    assert_eq!(allowed, [true, true, false, false]);
    assert_eq!(zcard(&redis, "sluice:{p:k}:sw:1000"), 2);
    assert_eq!(zcard(&redis, "sluice:{p:k}:sw:10000"), 2, "rejected requests charged the long window");

    // One second later the short window is free; the long one has one slot left.
    let allowed = futures_in_order(&limiter, &limits, &[t0 + SECOND, t0 + SECOND + 1]).await;
    assert_eq!(allowed, [true, false]);
    assert_eq!(
        zcard(&redis, "sluice:{p:k}:sw:1000"),
        1,
        "a request the long window denied charged the short one"
    );
    assert_eq!(zcard(&redis, "sluice:{p:k}:sw:10000"), 3);
}

async fn futures_in_order(limiter: &Limiter, limits: &[WireLimit], times: &[u64]) -> Vec<bool> {
    let mut out = Vec::new();
    for &t in times {
        out.push(check(limiter, "k", limits, t).await.allowed);
    }
    out
}

/// Two requests in the same microsecond are two entries, not one.
#[tokio::test]
async fn same_instant_requests_are_counted_separately() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis, true);
    let t = 1_700_000_000 * SECOND;
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let resp = check(&limiter, "k", &[window(10, 1_000)], t).await;
        remaining.push(resp.checks[0].limits[0].remaining);
    }
    assert_eq!(remaining, [9, 8, 7, 6, 5]);
    assert_eq!(zcard(&redis, "sluice:{p:k}:sw:1000"), 5);
}

/// Retry-after is the exact wait until the request fits, and the window
/// frees exactly one window after the entry that blocks.
#[tokio::test]
async fn retry_after_is_exact() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis, true);
    let limits = [window(2, 5_000)];
    let t0 = 1_700_000_000 * SECOND;
    assert!(check(&limiter, "k", &limits, t0).await.allowed);
    assert!(check(&limiter, "k", &limits, t0 + SECOND).await.allowed);
    let denied = check(&limiter, "k", &limits, t0 + 2 * SECOND).await;
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after_ms, Some(Millis(3_000)));
    assert_eq!(denied.checks[0].limits[0].retry_after_ms, Some(Millis(3_000)));
    // One microsecond early is still too early; on time it passes.
    assert!(!check(&limiter, "k", &limits, t0 + 5 * SECOND - 1).await.allowed);
    assert!(check(&limiter, "k", &limits, t0 + 5 * SECOND).await.allowed);
}

/// Every key the script writes has a TTL no longer than its window plus a second.
#[tokio::test]
async fn every_key_has_a_ttl() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis, false);
    let resp = limiter.check(&request("k", &[window(25, 5_000), window(300, 60_000)], None)).await;
    assert!(resp.expect("check").allowed);
    let mut conn = redis.connection().expect("redis connection");
    let keys: Vec<String> = conn.keys("*").expect("KEYS");
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in keys {
        let pttl: i64 = conn.pttl(&key).expect("PTTL");
        let window_ms: i64 = key.rsplit(':').next().and_then(|w| w.parse().ok()).expect("window in key");
        assert!(pttl > 0 && pttl <= window_ms + 1_000, "{key} has PTTL {pttl}");
    }
}

/// Over a random arrival sequence, the log admits a request exactly when
/// fewer than `limit` requests were admitted in the window before it: never
/// more (over-admission), never fewer (under-admission).
#[tokio::test]
async fn sliding_log_is_exact_over_random_arrivals() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis, true);
    let (limit, window_us) = (7u32, 2 * SECOND);
    let mut t = 1_700_000_000 * SECOND;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut admitted: Vec<u64> = Vec::new();
    for _ in 0..400 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        t += (seed >> 33) % 150_000; // 0 to 150 ms apart, same-instant arrivals included
        let live = admitted.iter().filter(|&&s| s + window_us > t).count();
        let resp = check(&limiter, "k", &[window(limit, window_us / 1000)], t).await;
        assert_eq!(resp.allowed, live < limit as usize, "at {t} with {live} live entries");
        if resp.allowed {
            admitted.push(t);
        }
    }
    assert!(admitted.len() > 100, "the sequence should admit many requests");
}

/// Concurrent checks on one key never admit more than the limit, and admit
/// exactly the limit when they all arrive within the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_checks_admit_exactly_the_limit() {
    let redis = Redis::start().expect("redis");
    let limiter = std::sync::Arc::new(limiter(&redis, false));
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.check(&request("k", &[window(50, 60_000)], None)).await })
        })
        .collect();
    let mut allowed = 0;
    for task in tasks {
        if task.await.expect("task").expect("check").allowed {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 50);
}

/// An explicit time is refused unless the shim runs in test mode.
#[tokio::test]
async fn explicit_time_needs_test_mode() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis, false);
    let err = limiter.check(&request("k", &[window(1, 1_000)], Some(1))).await;
    assert!(matches!(err, Err(CheckError::BadRequest(_))), "{err:?}");
}

/// When Redis is unreachable the check fails promptly with a store error.
#[tokio::test]
async fn unreachable_redis_is_a_store_error() {
    let port = sluice_harness::free_port().expect("port");
    let limiter =
        Limiter::new(&Target::Single(format!("redis://127.0.0.1:{port}")), Duration::from_millis(300), false)
            .expect("limiter");
    let err = limiter.check(&request("k", &[window(1, 1_000)], None)).await;
    assert!(matches!(err, Err(CheckError::Store(_))), "{err:?}");
}

/// Corrects the points cost of `admitted` (a check of key "k") to `actual` at `now_us`.
async fn adjust(limiter: &Limiter, admitted: &CheckResponse, limit: WireLimit, actual: u32, now_us: u64) {
    let outcome = &admitted.checks[0].limits[0];
    let adjustment = Adjustment {
        policy: "p".into(),
        key: "k".into(),
        id: None,
        limit,
        actual,
        held_until_us: outcome.held_until_us,
        refunded_us: outcome.refunded_us,
        level: None,
    };
    let req = AdjustRequest { adjustments: vec![adjustment], now_us: Some(Micros(now_us)) };
    limiter.adjust(&req).await.expect("adjust");
}

/// Regression: a late points refund over-admitted. Capacity 10, refilling in
/// 10 s. R1 costs 10 at t=0; R2 costs 10 at t=10 s and is admitted; R1's
/// adjustment (actual 0) lands at t=10.001 s. R1's charge had refilled by
/// then, so the refund returns nothing and R3 (cost 10) at t=10.002 s is
/// refused. The old adjust took the whole refund off the bucket and admitted
/// R3: 20 points within 2 ms against a bucket of 10.
#[tokio::test]
async fn a_late_points_refund_cannot_over_admit() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis, true);
    let points = |cost| [WireLimit::Points { capacity: 10, refill_ms: Millis(10_000), cost }];
    let t0 = 1_700_000_000 * SECOND;

    let r1 = check(&limiter, "k", &points(10), t0).await;
    assert!(r1.allowed);
    assert!(check(&limiter, "k", &points(10), t0 + 10 * SECOND).await.allowed);
    adjust(&limiter, &r1, points(10)[0], 0, t0 + 10 * SECOND + 1_000).await;
    let r3 = check(&limiter, "k", &points(10), t0 + 10 * SECOND + 2_000).await;
    assert!(!r3.allowed, "20 points admitted within 2 ms against a bucket of 10");
}

/// A refund that lands while the request's own charge still holds the
/// bucket gives it back: a request that cost nothing leaves room for the next.
#[tokio::test]
async fn an_early_points_refund_returns_the_charge() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis, true);
    let points = |cost| [WireLimit::Points { capacity: 10, refill_ms: Millis(10_000), cost }];
    let t0 = 1_700_000_000 * SECOND;

    let r1 = check(&limiter, "k", &points(10), t0).await;
    adjust(&limiter, &r1, points(10)[0], 0, t0 + 1_000).await;
    assert!(check(&limiter, "k", &points(10), t0 + 2_000).await.allowed);
}

/// Regression: an earlier refund moves the charges behind it, and a later
/// refund may return only what its moved charge still holds. Capacity 3, one
/// point per 100 ms: R0 and R1 cost 1 at 0 and R0's refund (actual 0) lands
/// at once; R2 costs 1 at 50 ms and turns out to cost 3; R1's refund (actual
/// 0) at 60 ms. A bucket charged the true costs holds 2.4 points at 110 ms,
/// so R3 (cost 1) is refused. Refunding R1 from where its charge first ended
/// returned a whole point and admitted R3.
#[tokio::test]
async fn a_refund_behind_an_earlier_refund_cannot_over_admit() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis, true);
    let points = |cost| [WireLimit::Points { capacity: 3, refill_ms: Millis(300), cost }];
    let ms = 1_000;
    let t0 = 1_700_000_000 * SECOND;

    let r0 = check(&limiter, "k", &points(1), t0).await;
    let r1 = check(&limiter, "k", &points(1), t0).await;
    assert!(r0.allowed && r1.allowed);
    adjust(&limiter, &r0, points(1)[0], 0, t0 + 1).await;
    let r2 = check(&limiter, "k", &points(1), t0 + 50 * ms).await;
    assert!(r2.allowed);
    adjust(&limiter, &r2, points(1)[0], 3, t0 + 50 * ms).await;
    adjust(&limiter, &r1, points(1)[0], 0, t0 + 60 * ms).await;
    let r3 = check(&limiter, "k", &points(1), t0 + 110 * ms).await;
    assert!(!r3.allowed, "a refund returned more than its moved charge still held");
}

/// Regression (correctness issue, bug 9): after the clock steps back into an
/// older window, a fixed window overwrote the newer stored window with the
/// older one, so the newer window's count was lost and it admitted its limit
/// again once the clock caught up. The newer window now keeps its count, and
/// nothing is admitted before it.
#[tokio::test]
async fn a_clock_step_back_keeps_the_newer_fixed_window() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis, true);
    let limits = [WireLimit::FixedWindow { limit: 2, window_ms: Millis(1_000), cost: 1 }];
    let t0 = 1_700_000_005 * SECOND;
    assert!(check(&limiter, "k", &limits, t0).await.allowed);
    assert!(check(&limiter, "k", &limits, t0 + 1).await.allowed);
    let back = check(&limiter, "k", &limits, t0 - SECOND / 2).await;
    assert!(!back.allowed, "admitted in the older window after a step back: {back:?}");
    assert_eq!(back.retry_after_ms, Some(Millis(1_500)), "the stored window is full: wait for the next one");
    let later = check(&limiter, "k", &limits, t0 + 2).await;
    assert!(!later.allowed, "the newer window lost its count: a third request in it was admitted");
}

/// Regression (correctness issue, bug 9): the same for the approximate
/// window, which overwrote its stored counts with the older window's.
#[tokio::test]
async fn a_clock_step_back_keeps_the_newer_approximate_window() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis, true);
    let limits = [WireLimit::SlidingWindow { limit: 2, window_ms: Millis(1_000), approximate: true }];
    let t0 = 1_700_000_005 * SECOND;
    assert!(check(&limiter, "k", &limits, t0).await.allowed);
    assert!(check(&limiter, "k", &limits, t0 + 1).await.allowed);
    let back = check(&limiter, "k", &limits, t0 - SECOND / 2).await;
    assert!(!back.allowed, "admitted in the older window after a step back: {back:?}");
    let later = check(&limiter, "k", &limits, t0 + 2).await;
    assert!(!later.allowed, "the newer window lost its counts: a third request in it was admitted");
}

/// A renewal keeps a live lease past its length, and never revives one that
/// has expired. Concurrency 1 with 1 s leases: A's lease, renewed at 0.8 s,
/// still holds the slot at 1.5 s, so B is refused. Not renewed again, it
/// expires at 1.8 s; a renewal at 3 s renews nothing, and C takes the slot.
#[tokio::test]
async fn a_renewed_lease_outlives_its_length_and_an_expired_one_stays_gone() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis, true);
    let pool = [WireLimit::Concurrency { limit: 1, lease_ms: Millis(1_000) }];
    let ms = 1_000;
    let t0 = 1_700_000_000 * SECOND;

    let a = check(&limiter, "k", &pool, t0).await;
    let lease = a.lease.clone().expect("A holds a lease");
    let renew = |at| {
        let req = RenewRequest { lease: lease.clone(), checks: request("k", &pool, None).checks.to_vec() };
        let limiter = &limiter;
        async move { limiter.renew_at(&req, Some(Micros(at))).await.expect("renew").renewed }
    };
    assert_eq!(renew(t0 + 800 * ms).await, 1);
    assert!(!check(&limiter, "k", &pool, t0 + 1_500 * ms).await.allowed, "the renewed lease was reclaimed");
    assert_eq!(renew(t0 + 3 * SECOND).await, 0, "an expired lease came back");
    assert!(check(&limiter, "k", &pool, t0 + 3 * SECOND).await.allowed);
}
