//! SIGTERM drains the shim (`sluice serve`, a real process on a real Redis),
//! with checks in flight and requests waiting for their slots:
//!
//! - every check in flight when the signal comes is answered (200);
//! - a request held for a time slot is served if its slot comes before the
//!   hold deadline (the drain timeout less the Redis timeout), else refused
//!   with a `retry_after_ms`, and its reservation is gone from Redis;
//! - a request queued for a concurrency slot is served if a release hands it
//!   one before the hold deadline, else refused with a `retry_after_ms`, and
//!   it is out of the queue;
//! - every waiter is answered within its own wait, the shim exits by itself
//!   within the drain timeout, and a scan of Redis afterwards finds no lease,
//!   queue entry or reservation but those the test still holds on purpose.
//!
//! A second shim on the same Redis stays up: it is where the test releases
//! a lease during the drain (as another gateway would) and cleans up after.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::Commands;
use serde_json::{json, Value};
use sluice_harness::{free_port, Redis};

const DRAIN_TIMEOUT_MS: u64 = 6_000;
const REDIS_TIMEOUT_MS: u64 = 1_000;
/// The time limit: one request per window, so waiters get one slot each
/// window apart.
const WINDOW_MS: u64 = 4_000;
const TIME_KEY: &str = "sluice:{drain:time}:sw:4000";
const LEASE_KEY: &str = "sluice:{drain:conc}:cc:60000";

struct Shim {
    child: Child,
    port: u16,
}

fn start_shim(redis: &Redis) -> Shim {
    let port = free_port().expect("port");
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--redis", &redis.url()])
        .args(["--drain-timeout-ms", &DRAIN_TIMEOUT_MS.to_string()])
        .args(["--redis-timeout-ms", &REDIS_TIMEOUT_MS.to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !matches!(call(port, "GET", "/healthz", ""), Ok((200, _))) {
        assert!(Instant::now() < deadline, "the shim did not start");
        thread::sleep(Duration::from_millis(50));
    }
    Shim { child, port }
}

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 call on its own connection: the status and the body.
fn call(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut conn = TcpStream::connect(("127.0.0.1", port))?;
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        conn,
        "{method} {path} HTTP/1.1\r\nhost: shim\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)?;
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("no HTTP answer: {answer:?}"))
    })?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    Ok((status, body))
}

fn check_body(id: &str, key: &str, limit: Value, wait_ms: u64) -> String {
    let mut req = json!({"id": id, "checks": [{"policy": "drain", "key": key, "limits": [limit]}]});
    if wait_ms > 0 {
        req["wait_ms"] = json!(wait_ms);
    }
    req.to_string()
}

fn time_limit() -> Value {
    json!({"type": "sliding_window", "limit": 1, "window_ms": WINDOW_MS})
}

fn lease_limit() -> Value {
    json!({"type": "concurrency", "limit": 2, "lease_ms": 60_000})
}

/// A check's answer, parsed.
fn decided(port: u16, body: &str) -> Value {
    let (status, text) = call(port, "POST", "/v1/check", body).expect("check");
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).expect("JSON answer")
}

fn release(port: u16, lease: &str) {
    let body =
        json!({"lease": lease, "checks": [{"policy": "drain", "key": "conc", "limits": [lease_limit()]}]});
    let (status, text) = call(port, "POST", "/v1/release", &body.to_string()).expect("release");
    assert_eq!(status, 200, "{text}");
}

/// A waiter's outcome: when it was answered and the answer.
struct Answered {
    id: String,
    at: Instant,
    answer: std::io::Result<(u16, String)>,
}

fn spawn_waiter(port: u16, id: String, body: String) -> thread::JoinHandle<Answered> {
    thread::spawn(move || {
        let answer = call(port, "POST", "/v1/check", &body);
        Answered { id, at: Instant::now(), answer }
    })
}

fn parsed(a: &Answered) -> Value {
    match &a.answer {
        Ok((200, body)) => serde_json::from_str(body).expect("JSON answer"),
        other => panic!("waiter {} was not answered 200: {other:?}", a.id),
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_answers_in_flight_checks_and_every_waiter_and_leaks_nothing() {
    let redis = Redis::start().expect("redis");
    let mut draining = start_shim(&redis);
    let other = start_shim(&redis);
    let mut conn = redis.connection().expect("redis connection");

    // The time limit's window is taken now: waiter i's slot is i windows on.
    let t0 = Instant::now();
    assert_eq!(decided(draining.port, &check_body("first", "time", time_limit(), 0))["allowed"], true);
    // Both concurrency slots held, by leases the test keeps.
    for lease in ["hold-a", "hold-b"] {
        assert_eq!(decided(draining.port, &check_body(lease, "conc", lease_limit(), 0))["allowed"], true);
    }
    let mut waiters = Vec::new();
    // One at a time, each reserved before the next is sent: waiter i's slot
    // is i windows on only if they reach Redis in this order.
    for i in 1..=3 {
        let id = format!("slot-{i}");
        let body = check_body(&id, "time", time_limit(), 20_000);
        waiters.push(spawn_waiter(draining.port, id, body));
        wait_for(&format!("slot-{i}'s reservation"), || {
            conn.zcard::<_, usize>(TIME_KEY).unwrap_or(0) == 1 + i
        });
    }
    for i in 1..=3 {
        let id = format!("queued-{i}");
        let body = check_body(&id, "conc", lease_limit(), 20_000);
        waiters.push(spawn_waiter(draining.port, id, body));
    }
    wait_for("three reservations and three queued", || {
        let reserved: usize = conn.zcard(TIME_KEY).unwrap_or(0);
        let queued: usize = conn.zcard(format!("{LEASE_KEY}:q")).unwrap_or(0);
        reserved == 4 && queued == 3
    });

    // Checks in flight: Redis paused, so they are still running at SIGTERM.
    redis.pause();
    let in_flight: Vec<_> = (0..10)
        .map(|i| {
            let body = check_body(
                &format!("flight-{i}"),
                "flight",
                json!({"type": "fixed_window", "limit": 1000, "window_ms": 60_000}),
                0,
            );
            spawn_waiter(draining.port, format!("flight-{i}"), body)
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let sigterm = Instant::now();
    let killed = Command::new("kill").arg(draining.child.id().to_string()).status().expect("kill");
    assert!(killed.success());
    thread::sleep(Duration::from_millis(300));
    redis.resume();

    // Another gateway's request ends during the drain: its slot goes to
    // the first of the queued waiters, who is served.
    thread::sleep(Duration::from_millis(700));
    release(other.port, "hold-a");

    let hold_deadline = sigterm + Duration::from_millis(DRAIN_TIMEOUT_MS - REDIS_TIMEOUT_MS);
    let exit_deadline = sigterm + Duration::from_millis(DRAIN_TIMEOUT_MS) + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = draining.child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < exit_deadline, "the shim did not exit within its drain timeout (+10 s)");
        thread::sleep(Duration::from_millis(20));
    };
    let exited = sigterm.elapsed();
    let mut log = String::new();
    draining.child.stderr.take().expect("stderr").read_to_string(&mut log).expect("log");
    assert!(status.success(), "{status}\n{log}");
    assert!(log.contains("drained"), "{log}");

    let in_flight: Vec<Answered> = in_flight.into_iter().map(|h| h.join().expect("thread")).collect();
    for a in &in_flight {
        assert_eq!(parsed(a)["allowed"], true, "check in flight {}", a.id);
    }
    let waiters: Vec<Answered> = waiters.into_iter().map(|h| h.join().expect("thread")).collect();

    let (mut served, mut refused) = (0, 0);
    let mut slot_leases = Vec::new();
    let margin = Duration::from_millis(500);
    for (i, a) in waiters.iter().enumerate() {
        let answer = parsed(a);
        // Within its own wait (20 s), counting from before it was sent.
        assert!(a.at < t0 + Duration::from_secs(20) + margin, "{} answered after its wait", a.id);
        let allowed = answer["allowed"] == true;
        if allowed {
            served += 1;
        } else {
            refused += 1;
            let retry = answer["retry_after_ms"].as_u64();
            assert!(retry.is_some_and(|ms| ms > 0), "{} refused without a retry-after: {answer}", a.id);
            assert!(a.at < hold_deadline + Duration::from_secs(2), "{} refused late", a.id);
        }
        if a.id.starts_with("slot-") {
            // Slot i+1 windows after `first`: the deadline decides, unless
            // the slot is too close to it to tell on a loaded machine.
            let slot = t0 + Duration::from_millis(WINDOW_MS * (i as u64 + 1));
            if slot + margin < hold_deadline {
                assert!(allowed, "{}: slot before the hold deadline, yet refused: {answer}", a.id);
                assert!(a.at + margin >= slot, "{} served before its slot", a.id);
            } else if slot > hold_deadline + margin {
                assert!(!allowed, "{}: slot after the hold deadline, yet served: {answer}", a.id);
            }
        } else if allowed {
            slot_leases.push(answer["lease"].as_str().expect("a served queued waiter's lease").to_string());
        }
    }
    let queued_served = slot_leases.len();
    assert_eq!(queued_served, 1, "exactly the one queued waiter a release reached is served");

    // What is left in Redis: the reservations of the served time waiters
    // only, no queue, and the leases the test holds, then none.
    let members: Vec<String> = conn.zrange(TIME_KEY, 0, -1).expect("ZRANGE");
    for a in waiters.iter().filter(|a| a.id.starts_with("slot-")) {
        let kept = members.contains(&a.id);
        assert_eq!(kept, parsed(a)["allowed"] == true, "{}'s reservation: {members:?}", a.id);
    }
    for suffix in ["q", "d", "w", "l"] {
        let exists: bool = conn.exists(format!("{LEASE_KEY}:{suffix}")).expect("EXISTS");
        assert!(!exists, "{LEASE_KEY}:{suffix} still holds queue entries");
    }
    let held: Vec<String> = conn.zrange(LEASE_KEY, 0, -1).expect("ZRANGE");
    let mut expected = vec!["hold-b".to_string()];
    expected.extend(slot_leases.iter().cloned());
    expected.sort();
    let mut held_sorted = held.clone();
    held_sorted.sort();
    assert_eq!(held_sorted, expected, "leases left after the drain");
    for lease in &expected {
        release(other.port, lease);
    }
    let exists: bool = conn.exists(LEASE_KEY).expect("EXISTS");
    assert!(!exists, "leases left after every holder released");

    println!(
        "DRAIN in_flight_answered={} waiters={} served={served} refused={refused} queued_served={queued_served} exited_after_ms={} drain_timeout_ms={DRAIN_TIMEOUT_MS}",
        in_flight.len(),
        waiters.len(),
        exited.as_millis()
    );
}
