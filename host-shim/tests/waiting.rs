//! Egress waiting through the shim's `Limiter` on a real redis-server and
//! real time: a request whose slot lies within its wait is held until the
//! slot and then admitted; one whose slot lies further is refused at once,
//! reserving nothing; a client that goes away while held gives its slot back.

use std::time::{Duration, Instant};

use redis::Commands;
use sluice_harness::Redis;
use sluice_policies::units::Millis;
use sluice_policies::wire::{Check, CheckRequest, CheckResponse, WireLimit};
use sluice_shim::limiter::{CheckError, Limiter};
use sluice_shim::store::Target;

fn limiter(redis: &Redis) -> Limiter {
    Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter")
}

fn request(id: &str, limits: &[WireLimit], wait_ms: u64) -> CheckRequest<'static> {
    CheckRequest {
        checks: vec![Check {
            policy: "p".into(),
            key: "k".into(),
            limits: limits.to_vec(),
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        }]
        .into(),
        now_us: None,
        id: Some(id.to_string().into()),
        wait_ms: Some(Millis(wait_ms)),
        views: Default::default(),
    }
}

async fn check(limiter: &Limiter, id: &str, limits: &[WireLimit], wait_ms: u64) -> CheckResponse {
    match limiter.check(&request(id, limits, wait_ms)).await {
        Ok(resp) => resp,
        Err(err) => panic!("check failed: {err:?}"),
    }
}

fn tat(redis: &Redis) -> Option<String> {
    redis.connection().expect("redis connection").get("sluice:{p:k}:gcra:300000").expect("GET")
}

/// An interval limit: the second request waits for the first's interval to
/// pass, then is admitted and says how long it waited.
#[tokio::test]
async fn a_waiting_request_is_held_until_its_slot() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis);
    let every = [WireLimit::Interval { every_ms: Millis(300) }];
    let first = check(&limiter, "r1", &every, 1_000).await;
    assert!(first.allowed && first.waited_ms.is_none(), "{first:?}");
    let started = Instant::now();
    let second = check(&limiter, "r2", &every, 1_000).await;
    let held = started.elapsed();
    assert!(second.allowed, "{second:?}");
    assert!(held >= Duration::from_millis(250), "answered after {held:?}, before its slot");
    assert!(second.waited_ms.is_some_and(|ms| ms >= Millis(250)), "{second:?}");
}

/// A slot further away than the wait: refused at once with the exact wait,
/// and nothing reserved anywhere.
#[tokio::test]
async fn a_slot_beyond_the_wait_is_refused_and_reserves_nothing() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis);
    let every = [WireLimit::Interval { every_ms: Millis(300) }];
    assert!(check(&limiter, "r1", &every, 1_000).await.allowed);
    let before = tat(&redis);
    let started = Instant::now();
    let second = check(&limiter, "r2", &every, 100).await;
    assert!(!second.allowed, "{second:?}");
    assert!(second.retry_after_ms.is_some_and(|ms| (Millis(200)..=Millis(300)).contains(&ms)), "{second:?}");
    assert!(started.elapsed() < Duration::from_millis(100), "a refusal was held");
    assert_eq!(tat(&redis), before, "a refused waiting request changed the bucket");
}

/// A client that goes away while its answer is held (the handler's future
/// is dropped) gives its reservation back: the next request gets the slot.
#[tokio::test]
async fn a_client_that_goes_away_gives_its_slot_back() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis);
    let every = [WireLimit::Interval { every_ms: Millis(300) }];
    assert!(check(&limiter, "r1", &every, 1_000).await.allowed);
    let after_first = tat(&redis);
    let gone = tokio::time::timeout(Duration::from_millis(50), check(&limiter, "r2", &every, 1_000)).await;
    assert!(gone.is_err(), "r2 was answered before its slot");
    assert_ne!(tat(&redis), after_first, "r2 reserved nothing");
    // The guard gives the slot back from a spawned task.
    let deadline = Instant::now() + Duration::from_secs(2);
    while tat(&redis) != after_first && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(tat(&redis), after_first, "the cancelled reservation was not given back");
}

/// Approximate windows keep no per-request state: they cannot wait, and the
/// shim says so (400).
#[tokio::test]
async fn approximate_windows_cannot_wait() {
    let redis = Redis::start().expect("redis");
    let limiter = limiter(&redis);
    let approx = [WireLimit::SlidingWindow { limit: 5, window_ms: Millis(1_000), approximate: true }];
    match limiter.check(&request("r1", &approx, 100)).await {
        Err(CheckError::BadRequest(reason)) => assert!(reason.contains("approximate"), "{reason}"),
        other => panic!("expected a 400, got {other:?}"),
    }
    assert!(check(&limiter, "r2", &approx, 0).await.allowed, "without a wait it is decided as before");
}

/// Every key a waiting request writes has a TTL that covers its future
/// reservations: log entries, fixed windows and buckets reserved ahead, and
/// the queue's keys.
#[tokio::test]
async fn every_waiting_key_has_a_ttl_covering_its_reservations() {
    let redis = Redis::start().expect("redis");
    let limiter = std::sync::Arc::new(limiter(&redis));
    let time = [
        WireLimit::SlidingWindow { limit: 1, window_ms: Millis(200), approximate: false },
        WireLimit::FixedWindow { limit: 1, window_ms: Millis(200) },
        WireLimit::Interval { every_ms: Millis(200) },
    ];
    assert!(check(&limiter, "r1", &time, 1_000).await.allowed);
    let l = limiter.clone();
    let held = tokio::spawn(async move { check(&l, "r2", &time, 1_000).await });
    let slot = [WireLimit::Concurrency { limit: 1, lease_ms: Millis(10_000) }];
    assert!(check(&limiter, "c1", &slot, 0).await.allowed);
    let l = limiter.clone();
    let queued = tokio::spawn(async move { check(&l, "c2", &slot, 1_000).await });
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut conn = redis.connection().expect("redis connection");
    let keys: Vec<String> = conn.keys("sluice:*").expect("KEYS");
    assert!(keys.len() >= 6, "{keys:?}");
    for key in &keys {
        let ttl: i64 = conn.pttl(key).expect("PTTL");
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
    // Reserved ~200 ms ahead: each time key outlives its reservation.
    for key in ["sluice:{p:k}:sw:200", "sluice:{p:k}:gcra:200000", "sluice:{p:k}:fw:200"] {
        let ttl: i64 = conn.pttl(key).expect("PTTL");
        assert!(ttl > 1_000, "{key} expires before its reservation: {ttl} ms");
    }
    assert!(held.await.expect("r2").allowed);
    assert!(!queued.await.expect("c2").allowed);
}

/// Redis's clock, in µs.
fn redis_time(redis: &Redis) -> u64 {
    let (secs, micros): (u64, u64) =
        redis::cmd("TIME").query(&mut redis.connection().expect("redis connection")).expect("TIME");
    secs * 1_000_000 + micros
}

fn sent(redis: &Redis) -> Option<u64> {
    let s: Option<String> = redis
        .connection()
        .expect("redis connection")
        .hget("sluice:{p:k}:gcra:300000:sent", "s")
        .expect("HGET");
    s.and_then(|s| s.parse().ok())
}

/// Regression (issue 37): a held request that woke late used to give its
/// slot back and reserve again behind everyone, then be refused. Here r2
/// and r3 are held behind r1 (slots about 310 and 620 ms ahead, interval
/// 300 ms, margin 10 ms) and the shim is blocked past r2's slot: r2 keeps
/// its place and is sent when it wakes, and r3, whose slot comes before
/// r2's late send plus the interval and margin, waits that much longer
/// instead of crowding it. Both are served, r2 first, and the last send
/// Redis records lies at least one interval and margin after r2's.
#[tokio::test]
async fn a_late_waiter_keeps_its_place_and_shifts_those_behind() {
    let redis = Redis::start().expect("redis");
    let limiter = std::sync::Arc::new(limiter(&redis));
    let with_margin = |id: &str| {
        let mut req = request(id, &[WireLimit::Interval { every_ms: Millis(300) }], 5_000);
        req.checks.to_mut()[0].margin_ms = Some(Millis(10));
        req
    };
    assert!(limiter.check(&with_margin("r1")).await.expect("r1").allowed);
    let mut answers = Vec::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for id in ["r2", "r3"] {
        let before = tat(&redis);
        let l = limiter.clone();
        let req = with_margin(id);
        let tx = tx.clone();
        answers.push(tokio::spawn(async move {
            let answer = l.check(&req).await;
            let _ = tx.send(req.id.as_deref().unwrap_or_default().to_string());
            answer
        }));
        let deadline = Instant::now() + Duration::from_secs(10);
        while tat(&redis) == before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let r2_slot: u64 =
        tat(&redis).expect("r3's reservation").parse::<u64>().expect("a tat") - 2 * 300_000 - 10_000;
    // This test's runtime has one thread: blocking it keeps r2 from waking.
    std::thread::sleep(Duration::from_millis(500));
    let woke_after = redis_time(&redis);
    assert!(woke_after > r2_slot + 10_000, "the block did not outlast r2's slot and its margin");
    for answer in answers {
        let answer = answer.await.expect("a task").expect("a check");
        assert!(answer.allowed, "refused after waiting: {answer:?}");
    }
    assert_eq!(rx.recv().await.as_deref(), Some("r2"), "r2 lost its place");
    let last = sent(&redis).expect("the sends recorded") - 300_000;
    assert!(last >= woke_after + 310_000, "r3 was sent {last} within an interval of r2's late send");
}

/// Regression (issue 37): a give-back undid a bucket's reservation only if
/// it was the newest, so give-backs out of order (a drain, client resets)
/// left phantom slots. Here r2 to r5 are held; the clients of r3, r5 and r4
/// go away, in that order: the bucket comes back to exactly what it was
/// after r2's reservation, with r2 still held where it was.
#[tokio::test]
async fn give_backs_in_any_order_leave_no_phantom_slot() {
    let redis = Redis::start().expect("redis");
    let limiter = std::sync::Arc::new(limiter(&redis));
    let every = [WireLimit::Interval { every_ms: Millis(300) }];
    assert!(check(&limiter, "r1", &every, 5_000).await.allowed);
    let mut held = Vec::new();
    let mut after = Vec::new();
    for id in ["r2", "r3", "r4", "r5"] {
        let before = tat(&redis);
        let l = limiter.clone();
        held.push(tokio::spawn(async move { check(&l, id, &every, 5_000).await }));
        let deadline = Instant::now() + Duration::from_secs(10);
        while tat(&redis) == before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        after.push(tat(&redis));
    }
    // Let the last one take its reply and hold (a client gone while the
    // reservation's reply is in flight is not this test's case).
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in [1, 3, 2] {
        held[i].abort();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while tat(&redis) != after[0] && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(tat(&redis), after[0], "given back out of order, a phantom slot stayed");
    let r2 = held.remove(0).await.expect("r2's task");
    assert!(r2.allowed, "{r2:?}");
}
