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
        WireLimit::FixedWindow { limit: 1, window_ms: Millis(200), cost: 1 },
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

/// The held reservations of an interval of `ms`, by slot: (id, slot in µs).
fn held_slots(redis: &Redis, ms: u64) -> Vec<(String, u64)> {
    let key = format!("sluice:{{p:k}}:gcra:{}:held", ms * 1000);
    redis.connection().expect("redis connection").zrange_withscores(key, 0, -1).expect("ZRANGE")
}

/// Issue 37: a late send that pushes a held request past its own deadline
/// refuses it at once, at that send, told the wait it would have had;
/// before, it was held until its slot and refused then. Here r2 (wait 5 s)
/// and r3 (wait 2.1 s) are held behind r1 on an interval of 1 s (margin 10
/// ms): slots about 1.01 and 2.02 s ahead. The shim is blocked past r2's
/// slot, not past r3's, so r2 is sent late and r3's place moves to 1.01 s
/// after that send, beyond r3's deadline. r2 is served first; r3 is refused
/// with a retry-after of exactly the interval and margin from r2's send
/// (1,010 ms). Refused at its own slot, which lies after r2's send, it
/// would have been told less.
#[tokio::test]
async fn a_send_that_pushes_a_waiter_past_its_deadline_refuses_it_at_once() {
    let redis = Redis::start().expect("redis");
    let limiter = std::sync::Arc::new(limiter(&redis));
    let every = |id: &str, wait_ms| {
        let mut req = request(id, &[WireLimit::Interval { every_ms: Millis(1000) }], wait_ms);
        req.checks.to_mut()[0].margin_ms = Some(Millis(10));
        req
    };
    assert!(limiter.check(&every("r1", 5_000)).await.expect("r1").allowed);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut answers = Vec::new();
    for (id, wait_ms) in [("r2", 5_000), ("r3", 2_100)] {
        let before = held_slots(&redis, 1000).len();
        let (l, req, tx) = (limiter.clone(), every(id, wait_ms), tx.clone());
        answers.push(tokio::spawn(async move {
            let answer = l.check(&req).await;
            let _ = tx.send(req.id.as_deref().unwrap_or_default().to_string());
            answer
        }));
        let deadline = Instant::now() + Duration::from_secs(10);
        while held_slots(&redis, 1000).len() == before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let held = held_slots(&redis, 1000);
    let [(_, r2_slot), (ref r3, r3_slot)] = held[..] else { panic!("r2 and r3 not held: {held:?}") };
    assert_eq!(r3, "r3");
    let need: String = redis
        .connection()
        .expect("redis connection")
        .hget("sluice:{p:k}:gcra:1000000:need", "r3")
        .expect("HGET");
    let r3_deadline: u64 = need.split(' ').nth(2).and_then(|d| d.parse().ok()).expect("r3's deadline");
    // This test's runtime has one thread: blocking it keeps r2 from waking.
    std::thread::sleep(Duration::from_millis(1300));
    let woke = redis_time(&redis);
    assert!(woke > r2_slot && woke < r3_slot, "the block did not end between r2's and r3's slots");
    let r2 = answers.remove(0).await.expect("r2's task").expect("r2's check");
    let r3 = answers.remove(0).await.expect("r3's task").expect("r3's check");
    assert!(r2.allowed, "{r2:?}");
    assert_eq!(rx.recv().await.as_deref(), Some("r2"));
    let r2_sent = sent_at(&redis, 1000) - 1_000_000;
    assert!(r2_sent + 1_010_000 > r3_deadline, "r2's send did not push r3 past its deadline");
    assert!(!r3.allowed, "{r3:?}");
    assert_eq!(r3.retry_after_ms, Some(Millis(1010)), "r3 was not refused at r2's send: {r3:?}");
    assert!(held_slots(&redis, 1000).is_empty(), "still held: {:?}", held_slots(&redis, 1000));
}

/// The real sends' `tat` of an interval of `ms`, in µs.
fn sent_at(redis: &Redis, ms: u64) -> u64 {
    let key = format!("sluice:{{p:k}}:gcra:{}:sent", ms * 1000);
    let s: String = redis.connection().expect("redis connection").hget(key, "s").expect("HGET");
    s.parse().expect("a time")
}

/// How many FCALLs Redis has run: the check script's calls.
fn fcalls(redis: &Redis) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.connection().expect("redis connection"))
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Regression (a race): a client that went away while its reservation's
/// script was still queued in Redis (hyper dropped the handler before the
/// reply) left the slot held: the reply found no one, and the reservation
/// stayed until its deadline and a second more, a phantom slot for
/// everyone behind it. Here (an interval of 1 s) a 400 ms script keeps
/// Redis busy while r2's reservation waits behind it, and r2's client goes
/// away meanwhile: the
/// reservation is made (Redis ran r2's check), and given back once its
/// reply comes, long before its 30 s wait would end.
#[tokio::test]
async fn a_client_gone_before_its_reservation_reply_gives_the_slot_back() {
    let redis = Redis::start().expect("redis");
    let limiter = std::sync::Arc::new(limiter(&redis));
    let every = [WireLimit::Interval { every_ms: Millis(1000) }];
    assert!(check(&limiter, "r1", &every, 1_000).await.allowed);
    let tat = |redis: &Redis| -> Option<String> {
        redis.connection().expect("redis connection").get("sluice:{p:k}:gcra:1000000").expect("GET")
    };
    let after_first = tat(&redis);
    let calls = fcalls(&redis);
    let mut conn = redis.connection().expect("redis connection");
    let busy = std::thread::spawn(move || {
        let spin = "local s = redis.call('TIME') local t0 = s[1] * 1e6 + s[2] \
                    while true do local t = redis.call('TIME') \
                    if t[1] * 1e6 + t[2] - t0 > 400000 then return 1 end end";
        let _: i64 = redis::cmd("EVAL").arg(spin).arg(0).query(&mut conn).expect("the busy script");
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let l = limiter.clone();
    let r2 = tokio::spawn(async move { check(&l, "r2", &every, 30_000).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    r2.abort();
    busy.join().expect("the busy thread");
    let deadline = Instant::now() + Duration::from_secs(5);
    while tat(&redis) != after_first && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(fcalls(&redis) > calls, "r2's reservation never reached Redis: the case is not exercised");
    assert_eq!(tat(&redis), after_first, "the reservation whose reply came too late was not given back");
    assert!(held_slots(&redis, 1000).is_empty(), "still held: {:?}", held_slots(&redis, 1000));
}

/// How many subscribers listen on a channel (`PUBSUB NUMSUB`).
fn listening(redis: &Redis, channel: &str) -> u64 {
    let reply: (String, u64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query(&mut redis.connection().expect("redis connection"))
        .expect("PUBSUB NUMSUB");
    reply.1
}

/// Issue 37: a late send on one shim that pushes a request held by
/// another shim past its deadline refuses it at once, on that other shim,
/// with the exact wait; before, only the sending shim's own waiters were,
/// and another shim's was held until its slot and refused then, without a
/// retry-after. Two shims share one Redis: r2 (wait 5 s) is held on shim A
/// and r3 (wait 2.1 s) on shim B, behind r1 on an interval of 1 s (margin
/// 10 ms): slots about 1.01 and 2.02 s ahead. Both shims run on this test's
/// one thread, which is blocked past r2's slot, not past r3's, so r2 is
/// sent late and r3's place moves to 1.01 s after that send, beyond r3's
/// deadline. r2 is served; r3 is refused by shim B with a retry-after of
/// exactly the interval and margin from r2's send (1,010 ms), before its
/// own slot has come on Redis's clock.
#[tokio::test]
async fn a_send_on_one_shim_refuses_another_shims_waiter_it_pushed_out_at_once() {
    let redis = Redis::start().expect("redis");
    let (a, b) = (std::sync::Arc::new(limiter(&redis)), std::sync::Arc::new(limiter(&redis)));
    let every = |id: &str, wait_ms| {
        let mut req = request(id, &[WireLimit::Interval { every_ms: Millis(1000) }], wait_ms);
        req.checks.to_mut()[0].margin_ms = Some(Millis(10));
        req
    };
    // Both shims listen for pushed-out requests before anything is held.
    let channel = sluice_policies::algorithm::confirm::PUSHED_CHANNEL;
    let deadline = Instant::now() + Duration::from_secs(10);
    while listening(&redis, channel) < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(listening(&redis, channel), 2, "the shims' subscribers are not listening");
    assert!(a.check(&every("r1", 5_000)).await.expect("r1").allowed);
    let mut answers = Vec::new();
    for (shim, id, wait_ms) in [(&a, "r2", 5_000), (&b, "r3", 2_100)] {
        let before = held_slots(&redis, 1000).len();
        let (shim, req, url) = (shim.clone(), every(id, wait_ms), redis.url());
        answers.push(tokio::spawn(async move {
            let answer = shim.check(&req).await;
            // Redis's clock as the answer came.
            let client = redis::Client::open(url).expect("a client");
            let (secs, micros): (u64, u64) =
                redis::cmd("TIME").query(&mut client.get_connection().expect("a connection")).expect("TIME");
            (answer, secs * 1_000_000 + micros)
        }));
        let deadline = Instant::now() + Duration::from_secs(10);
        while held_slots(&redis, 1000).len() == before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let held = held_slots(&redis, 1000);
    let [(_, r2_slot), (ref r3, r3_slot)] = held[..] else { panic!("r2 and r3 not held: {held:?}") };
    assert_eq!(r3, "r3");
    // The one thread blocked: neither shim runs until it ends.
    std::thread::sleep(Duration::from_millis(1300));
    let woke = redis_time(&redis);
    assert!(woke > r2_slot && woke < r3_slot, "the block did not end between r2's and r3's slots");
    let (r2, _) = answers.remove(0).await.expect("r2's task");
    let (r3, r3_answered) = answers.remove(0).await.expect("r3's task");
    assert!(r2.expect("r2's check").allowed, "r2 was not served");
    let r3 = r3.expect("r3's check");
    let r2_sent = sent_at(&redis, 1000) - 1_000_000;
    assert!(!r3.allowed, "{r3:?}");
    assert_eq!(r3.retry_after_ms, Some(Millis(1010)), "shim B did not refuse r3 at r2's send: {r3:?}");
    assert!(
        r2_sent < r3_answered && r3_answered < r3_slot,
        "r3 was not answered between r2's send and its slot"
    );
    assert!(held_slots(&redis, 1000).is_empty(), "still held: {:?}", held_slots(&redis, 1000));
}

/// A held request whose place is gone when it confirms at its slot, with no
/// push message for it (the message is still on its way, or its shim's
/// subscriber was reconnecting), asks again within what is left of its wait
/// instead of being refused without a retry-after. r1 is sent at once on an
/// interval of 1 s and r2 (wait 5 s) is held for the next slot; its place
/// is then taken out of the chain behind the shim's back, as another shim's
/// late send does. At its slot the confirm finds it gone and gives its
/// reservation back; asked again, the slot is free, and r2 is served.
/// Before, r2 was refused with no retry-after though it had waited.
#[tokio::test]
async fn a_waiter_that_finds_its_place_gone_asks_again_within_its_wait() {
    let redis = Redis::start().expect("redis");
    let shim = std::sync::Arc::new(limiter(&redis));
    let every = |id: &str| request(id, &[WireLimit::Interval { every_ms: Millis(1000) }], 5_000);
    assert!(shim.check(&every("r1")).await.expect("r1").allowed);
    let (held_shim, req) = (shim.clone(), every("r2"));
    let r2 = tokio::spawn(async move { held_shim.check(&req).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while held_slots(&redis, 1000).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let key = "sluice:{p:k}:gcra:1000000:held";
    let removed: u64 = redis.connection().expect("redis connection").zrem(key, "r2").expect("ZREM");
    assert_eq!(removed, 1, "r2 was not held");
    let r2 = r2.await.expect("r2's task").expect("r2's check");
    assert!(r2.allowed, "r2 was refused after its wait: {r2:?}");
    assert!(held_slots(&redis, 1000).is_empty(), "still held: {:?}", held_slots(&redis, 1000));
}
