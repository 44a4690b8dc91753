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

/// A held request that wakes later than its margin covers (here its shim
/// is blocked for 600 ms, far past a slot 300 ms ahead and its 100 ms
/// margin) is not sent at its old slot, which would crowd the call after
/// it: it is given a new slot, at or after the time it woke, and admitted
/// there. The slot it went at is read back from Redis (the interval's `tat`
/// is its slot plus the interval).
#[tokio::test]
async fn a_request_woken_later_than_its_margin_is_given_a_new_slot() {
    let redis = Redis::start().expect("redis");
    let limiter = std::sync::Arc::new(limiter(&redis));
    let with_margin = |id: &str| {
        let mut req = request(id, &[WireLimit::Interval { every_ms: Millis(300) }], 5_000);
        req.checks.to_mut()[0].margin_ms = Some(Millis(100));
        req
    };
    assert!(limiter.check(&with_margin("r1")).await.expect("r1").allowed);
    let after_first = tat(&redis);
    let l = limiter.clone();
    let second = with_margin("r2");
    let held = tokio::spawn(async move { l.check(&second).await });
    // r2 has reserved its slot (about 400 ms ahead) and is held.
    let deadline = Instant::now() + Duration::from_secs(10);
    while tat(&redis) == after_first && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let old_slot: u64 = tat(&redis).expect("r2's reservation").parse::<u64>().expect("a tat") - 300_000;
    // This test's runtime has one thread: blocking it keeps r2 from waking.
    std::thread::sleep(Duration::from_millis(600));
    let woke_after = redis_time(&redis);
    assert!(woke_after > old_slot + 100_000, "the block did not outlast the slot and its margin");
    let r2 = held.await.expect("r2's task").expect("r2");
    assert!(r2.allowed, "{r2:?}");
    let sent_at: u64 = tat(&redis).expect("r2's new reservation").parse::<u64>().expect("a tat") - 300_000;
    assert!(
        sent_at >= woke_after,
        "r2 was sent at its old slot {old_slot}, or another before it woke at {woke_after}: {sent_at}"
    );
}
