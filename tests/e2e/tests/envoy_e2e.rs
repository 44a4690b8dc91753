//! End to end through the real parts: Envoy running `sluice.wasm`, the
//! `sluice` shim, and redis-server, with the S0 dual window (25 per 5 s and
//! 300 per minute, per `x-api-key`).
//!
//! The policy fails closed (`deny`) with a 2 s shim timeout, so a slow machine
//! shows up as a failure here rather than as fail-open over-admission. Every
//! test starts its own stack on its own ports; the guards stop it even when the
//! test panics.

use std::thread::sleep;
use std::time::Duration;

use sluice_harness::client::{burst, count, HttpReply};
use sluice_harness::{free_port, Envoy, Redis, Shim, Stack, Upstream};

const PATH: &str = "/v42/orders";

/// The S0 policy, strict: fail closed, generous timeout.
fn policy(first_window: &str) -> String {
    format!(
        r#"{{
  "shim": {{"cluster": "sluice_shim", "timeout_ms": 2000}},
  "failure_mode": "deny",
  "policies": [
    {{"name": "partner-api",
      "match": {{"path_prefix": "/v42/", "methods": ["GET", "POST"]}},
      "key": ["header:x-api-key"],
      "limits": [
        {{"type": "sliding_window", "limit": 25, "window": "{first_window}"}},
        {{"type": "sliding_window", "limit": 300, "window": "1m"}}
      ]}}
  ]
}}"#
    )
}

fn start() -> Stack {
    Stack::start(&policy("5s")).expect("starting Redis, the shim, the upstream and Envoy")
}

/// `count` concurrent GETs of [`PATH`] with this API key.
fn get(stack: &Stack, key: &str, count: usize) -> Vec<HttpReply> {
    burst(stack.envoy.port, "GET", PATH, Some(("x-api-key", key)), count).expect("sending requests")
}

/// Asserts `want` replies of 200 and the rest 429; shows Envoy's log if not.
fn assert_split(stack: &Stack, replies: &[HttpReply], want_ok: usize) {
    let statuses: Vec<u16> = replies.iter().map(|reply| reply.status).collect();
    let split = (count(replies, 200), count(replies, 429));
    let want = (want_ok, replies.len() - want_ok);
    assert_eq!(split, want, "(200s, 429s) of {statuses:?}\n--- envoy log ---\n{}", stack.envoy.log());
}

/// The shim on a Unix socket beside Envoy (a `pipe` address in the shim's
/// cluster, the same `unix:/PATH` given to `sluice serve --listen`), and
/// Redis on its Unix socket: the same exact decision as over TCP, 25 of 40.
/// The policy fails closed, so a shim Envoy cannot reach would deny all 40.
#[test]
fn the_shim_on_a_unix_socket_decides_exactly() {
    let redis = Redis::start().expect("starting Redis");
    let shim = Shim::start_unix(&redis.unix_url()).expect("starting the shim on a Unix socket");
    let upstream = Upstream::start().expect("starting the upstream");
    let address = [("SHIM_ADDRESS", shim.address().envoy_address())];
    let envoy = Envoy::start_with(&policy("5s"), 0, upstream.port, &address).expect("starting Envoy");
    let stack = Stack { envoy, shim, upstream, redis };
    let replies = get(&stack, "alice", 40);
    assert_split(&stack, &replies, 25);
    assert_split(&stack, &get(&stack, "alice", 5), 0);
    assert_split(&stack, &get(&stack, "bob", 5), 5);
}

/// Concurrent requests are admitted exactly up to the 5 s limit: of 40 at
/// once, 25 pass and 15 get 429, each with a whole-second `retry-after` within
/// the window.
#[test]
fn a_burst_of_40_admits_exactly_25() {
    let stack = start();
    let replies = get(&stack, "alice", 40);
    assert_split(&stack, &replies, 25);
    for reply in replies.iter().filter(|reply| reply.status == 429) {
        let secs = reply.retry_after_secs();
        assert!(matches!(secs, Some(1..=5)), "429 without a retry-after in 1..=5: {reply:?}");
    }
}

/// Keys are independent: once alice is exhausted, bob still gets 200s.
#[test]
fn a_second_key_is_independent() {
    let stack = start();
    assert_split(&stack, &get(&stack, "alice", 30), 25);
    assert_split(&stack, &get(&stack, "bob", 10), 10);
}

/// The 5 s window slides: after it has passed, the exhausted key is admitted
/// again (the minute window, at 25 of 300, does not stand in the way).
#[test]
fn the_key_is_admitted_again_after_the_window() {
    let stack = start();
    assert_split(&stack, &get(&stack, "alice", 30), 25);
    sleep(Duration::from_millis(5500));
    assert_split(&stack, &get(&stack, "alice", 10), 10);
}

/// Rejected requests cost nothing (S0's bug): after 40 requests, 15 of them
/// rejected, both windows of alice hold 25 entries, not 40, and both keys
/// carry a TTL.
#[test]
fn rejected_requests_do_not_charge_either_window() {
    let stack = start();
    assert_split(&stack, &get(&stack, "alice", 40), 25);
    let mut redis = stack.redis.connection().expect("connecting to Redis");
    for window_ms in [5_000, 60_000] {
        let key = format!("sluice:{{partner-api:alice}}:sw:{window_ms}");
        let entries: u64 = redis::cmd("ZCARD").arg(&key).query(&mut redis).expect("ZCARD");
        assert_eq!(entries, 25, "ZCARD {key}");
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut redis).expect("PTTL");
        assert!(ttl > 0, "PTTL {key} = {ttl}: every key needs a TTL");
    }
}

/// Requests outside the policy's match (another path, or a method it does
/// not list) always pass and charge nothing.
#[test]
fn requests_outside_the_policy_always_pass() {
    let stack = start();
    let alice = Some(("x-api-key", "alice"));
    let other_path = burst(stack.envoy.port, "GET", "/v1/orders", alice, 40).expect("sending requests");
    assert_split(&stack, &other_path, 40);
    let delete = burst(stack.envoy.port, "DELETE", PATH, alice, 40).expect("sending requests");
    assert_split(&stack, &delete, 40);
    assert_split(&stack, &get(&stack, "alice", 30), 25);
}

/// A bad policy document stops Envoy from starting, and its log names the
/// offending field: `"window": "5 sec"` is reported at `policies[0].limits[0].window`.
#[test]
fn a_bad_policy_document_keeps_envoy_from_starting() {
    let upstream = Upstream::start().expect("starting the upstream");
    let shim_port = free_port().expect("a free port");
    let (status, log) =
        Envoy::start_expect_exit(&policy("5 sec"), shim_port, upstream.port).expect("envoy should exit");
    assert!(!status.success(), "envoy exited with {status}\n{log}");
    let line = log.lines().find(|line| line.contains("sluice: invalid policy document: "));
    let line =
        line.unwrap_or_else(|| panic!("no `sluice: invalid policy document:` line in the log:\n{log}"));
    assert!(line.contains("policies[0].limits[0].window"), "the line does not name the field: {line}");
}

/// The RateLimit fields of one refusal, and its `retry-after` and verdict.
fn refusal(stack: &Stack) -> (u64, u64, u64, String) {
    let reply = sluice_harness::gateway::send(stack.envoy.port, "GET", PATH, &[("x-api-key", "alice")])
        .expect("a request");
    assert_eq!(reply.status, 429, "{reply:?}");
    let field = |name: &str| -> u64 {
        let value = reply.header("ratelimit").unwrap_or_else(|| panic!("no ratelimit header: {reply:?}"));
        let found = value.split(';').find_map(|p| p.strip_prefix(&format!("{name}=")));
        found.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {name} in {value:?}"))
    };
    let retry = reply.header("retry-after").and_then(|v| v.parse().ok()).expect("a retry-after");
    (field("r"), field("t"), retry, reply.header("x-sluice-verdict").unwrap_or_default().to_string())
}

/// Draft -11 through Envoy: a `points` refusal's `t` is the time until the
/// request's cost fits (its `retry-after`), not the whole bucket's refill,
/// and the over-limit cache's next refusal shows the same `r` and `t`.
/// Regression: the shim's refusal said `t` = the full refill
/// (`retry-after: 1344` beside `t=78787`), the cache's `r=0`.
#[test]
fn a_refusal_shows_the_same_fields_from_the_shim_and_the_cache() {
    // One point every 100 s; 10 at most; each request costs 3.
    let doc = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 2000}, "failure_mode": "deny",
      "verdict_header": true,
      "policies": [{"name": "messages-tokens", "match": {"path_prefix": "/v42/"}, "key": ["header:x-api-key"],
        "limits": [{"type": "points", "capacity": 10, "refill": "1000s", "cost": 3}]}]}"#;
    let stack = Stack::start(doc).expect("the stack");
    assert_split(&stack, &get(&stack, "alice", 3), 3);
    // 1 point left, 2 missing: 200 s until the cost fits (the refill is 1,000 s).
    let started = std::time::Instant::now();
    let (r, t, retry, verdict) = refusal(&stack);
    assert_eq!(verdict, "denied", "the shim answers first");
    assert_eq!(t, retry, "t is the retry-after");
    assert!((199..=200).contains(&t), "t={t}: the cost fits in 200 s, not the whole refill");
    assert_eq!(r, 1, "1 point in the bucket");
    let (r2, t2, retry2, verdict2) = refusal(&stack);
    let elapsed = started.elapsed().as_secs() + 1;
    assert_eq!(verdict2, "cache_denied", "the over-limit cache answers next");
    assert_eq!((r2, t2), (r, t2), "the same r");
    assert_eq!(t2, retry2, "t is the retry-after");
    assert!(t2 <= t && t - t2 <= elapsed, "the same t, less the {elapsed} s gone at most: {t} then {t2}");
}
