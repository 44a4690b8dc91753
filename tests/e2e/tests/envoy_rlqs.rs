//! The RLQS face through real Envoy: its `envoy.filters.http.rate_limit_quota`
//! filter (`envoy/rlqs.yaml`, as `sluice envoy-config --face rlqs` renders
//! it) streaming to `sluice serve --grpc-listen` on a real Redis, and
//! enforcing the assignments itself. One Envoy spends a window exactly;
//! two share one window, never over its limit, holding back no more than
//! the stated bound; `deny_all` once the window is spent; the assignment's
//! expiry when Sluice goes away (`no_assignment_behavior`,
//! `expired_assignment_behavior`), and the stream's return; a limit lowered
//! while assignments are live.
//!
//! Nothing here waits for a fixed time: each phase polls until what it
//! waits for happens, under a generous deadline.

use std::time::{Duration, Instant};

use serde_json::json;
use sluice_harness::gateway::{sample, send};
use sluice_harness::shim::GrpcShim;
use sluice_harness::{Envoy, Redis, Upstream};

/// One pooled window (`x-pool`: its key) of `limit` an hour, leased
/// `tokens` at a time, assignments living `ttl`; and an unlimited tier.
fn document(failure_mode: &str, limit: u32, tokens: u32, ttl: &str) -> String {
    format!(
        r#"{{"failure_mode": "{failure_mode}", "policies": [
  {{"name": "pooled", "match": {{"domain": "edge", "bucket": {{"x-pool": {{"present": true}}}}}},
   "key": ["bucket:x-pool"], "leased": {{"tokens": {tokens}, "ttl": "{ttl}"}},
   "limits": [{{"type": "fixed_window", "limit": {limit}, "window": "1h"}}]}},
  {{"name": "internal", "unlimited": true, "match": {{"domain": "edge", "bucket": {{"x-tier": {{"prefix": "internal"}}}}}}}}
]}}"#
    )
}

const DEADLINE: Duration = Duration::from_secs(90);

fn get(envoy: &Envoy, headers: &[(&str, &str)]) -> u16 {
    send(envoy.port, "GET", "/api", headers).expect("request").status
}

fn pool(envoy: &Envoy, pool: &str) -> u16 {
    get(envoy, &[("x-pool", pool)])
}

/// The pooled policy's window, in milliseconds.
const WINDOW_MS: u64 = 3_600_000;

/// The index of the window (aligned to the epoch, as the policy's) that
/// holds this moment. The claims here are per window: a run may cross a
/// window's end, and the next window admits its own `limit` (regression:
/// a run across the hour counted both windows' admissions against one
/// limit, and failed "over the limit").
fn window_now() -> u64 {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis();
    u64::try_from(ms).expect("ms") / WINDOW_MS
}

/// What the current window of pool `key` has counted in Redis (0 while
/// the stored count is an earlier window's).
fn counted(redis: &Redis, key: &str) -> u64 {
    let client = redis::Client::open(redis.url()).expect("client");
    let mut conn = client.get_connection().expect("connection");
    let (w, n): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
        .arg(format!("sluice:{{pooled:{key}}}:fw:{WINDOW_MS}"))
        .arg("w")
        .arg("n")
        .query(&mut conn)
        .expect("HMGET");
    if w == Some(window_now()) {
        n.unwrap_or(0)
    } else {
        0
    }
}

/// Sends requests (`one` returns a status) until `done` says so, at most
/// until the deadline; every status of the current window, in order (a
/// window that ends mid-run starts the list again: see [`window_now`]).
fn until(mut one: impl FnMut() -> u16, mut done: impl FnMut(&[u16]) -> bool) -> Vec<u16> {
    let start = Instant::now();
    let mut statuses = Vec::new();
    let mut window = window_now();
    while start.elapsed() < DEADLINE {
        let status = one();
        if window_now() != window {
            window = window_now();
            statuses.clear();
        }
        statuses.push(status);
        if done(&statuses) {
            return statuses;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("not done in {DEADLINE:?}: {statuses:?}");
}

fn admitted(statuses: &[u16]) -> usize {
    statuses.iter().filter(|s| **s == 200).count()
}

/// The last `n` statuses are all `status`.
fn ends_with(statuses: &[u16], n: usize, status: u16) -> bool {
    statuses.len() >= n && statuses[statuses.len() - n..].iter().all(|s| *s == status)
}

/// One Envoy spends its pool's window, lease by lease, to exactly the
/// limit and no further: then the bucket is told `deny_all`. An unlimited
/// bucket is `allow_all`; Envoy's reported usage counts as `face="rlqs"`.
#[test]
fn one_envoy_spends_a_window_exactly_then_denies_all() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let doc = document("deny", 12, 5, "5s");
    let shim = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let envoy = Envoy::start_rlqs(&doc, shim.grpc_port, upstream.port, json!({})).expect("envoy");
    let statuses = until(
        || pool(&envoy, "p1"),
        |s| {
            assert!(admitted(s) <= 12, "over the limit: {s:?}");
            admitted(s) == 12 && ends_with(s, 20, 429)
        },
    );
    assert_eq!(counted(&redis, "p1"), 12, "every token charged was spent: {statuses:?}");
    // The next report shows the bucket empty and the window spent: deny_all.
    let denied_all = r#"sluice_rlqs_assignments_total{strategy="deny_all"}"#;
    let page = until_metric(&shim, denied_all);
    assert!(
        sample(&page, denied_all) >= 1.0,
        "the spent window's bucket is denied all: {page}\n{}",
        shim.shim.log()
    );
    let after = until(|| pool(&envoy, "p1"), |s| s.len() >= 20);
    assert!(after.iter().all(|s| *s == 429), "{after:?}");
    for _ in 0..5 {
        assert_eq!(get(&envoy, &[("x-tier", "internal-batch")]), 200, "unlimited");
    }
    let page =
        until_metric(&shim, r#"sluice_decisions_total{policy="internal",result="unlimited",face="rlqs"}"#);
    assert!(
        sample(&page, r#"sluice_decisions_total{policy="pooled",result="allowed",face="rlqs"}"#) >= 12.0,
        "{page}"
    );
    assert!(sample(&page, r#"sluice_rlqs_assignments_total{strategy="allow_all"}"#) >= 1.0, "{page}");
}

/// The page once `name` is counted (reports come every half second).
fn until_metric(shim: &GrpcShim, name: &str) -> String {
    let start = Instant::now();
    loop {
        let page = shim.metrics().expect("metrics");
        if sample(&page, name) > 0.0 || start.elapsed() > DEADLINE {
            return page;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Two Envoys spend one window: never over the limit, every token spent in
/// the end (leftovers given back and leased again), and what the window
/// holds back beyond what was admitted stays within the stated bound: per
/// Envoy, 1.5 leases held plus one on its way.
#[test]
fn two_envoys_share_one_window_never_over_it() {
    let (limit, tokens) = (60u32, 5u32);
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let doc = document("deny", limit, tokens, "5s");
    let shim = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let a = Envoy::start_rlqs(&doc, shim.grpc_port, upstream.port, json!({})).expect("envoy a");
    let b = Envoy::start_rlqs(&doc, shim.grpc_port, upstream.port, json!({})).expect("envoy b");
    let turn = std::cell::Cell::new(0usize);
    let mut held = 0u64;
    // Turns alternate, B first: an even turn is A's. The last status is
    // the current turn's.
    let of = |s: &[u16], envoy_a: bool| -> Vec<u16> {
        let first = turn.get() + 1 - s.len();
        s.iter()
            .enumerate()
            .filter(|(i, _)| (first + i).is_multiple_of(2) == envoy_a)
            .map(|(_, x)| *x)
            .collect()
    };
    let statuses = until(
        || {
            turn.set(turn.get() + 1);
            pool(if turn.get().is_multiple_of(2) { &a } else { &b }, "shared")
        },
        |s| {
            let admitted = admitted(s) as u64;
            assert!(admitted <= u64::from(limit), "over the limit in one window: {s:?}");
            held = held.max(counted(&redis, "shared").saturating_sub(admitted));
            admitted == u64::from(limit)
                && ends_with(&of(s, true), 20, 429)
                && ends_with(&of(s, false), 20, 429)
        },
    );
    assert_eq!(counted(&redis, "shared"), u64::from(limit), "{statuses:?}");
    let (from_a, from_b) = (of(&statuses, true), of(&statuses, false));
    assert!(admitted(&from_a) > 0 && admitted(&from_b) > 0, "both spent the window: {from_a:?} {from_b:?}");
    let bound = 2 * (u64::from(tokens) * 3 / 2 + u64::from(tokens));
    assert!(held <= bound, "the window held back {held} beyond what it admitted, over {bound}");
    eprintln!("two Envoys, limit {limit}, leases of {tokens}: held back at most {held} (bound {bound})");
}

/// `failure_mode: deny`: with Sluice gone, a bucket's assignment stands
/// until its time to live runs out, then the bucket denies everything
/// (`no_assignment_behavior: deny_all`); once Sluice is back, Envoy's next
/// report opens a new stream and the bucket is assigned tokens again.
#[test]
fn with_sluice_gone_the_assignment_expires_to_deny_all_and_returns() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let doc = document("deny", 100_000, 1_000, "2s");
    let mut shim = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let envoy = Envoy::start_rlqs(&doc, shim.grpc_port, upstream.port, json!({})).expect("envoy");
    until(|| pool(&envoy, "p"), |s| ends_with(s, 5, 200));
    shim.shim.kill();
    let gone = until(|| pool(&envoy, "p"), |s| ends_with(s, 10, 429));
    assert!(!gone.contains(&500), "{gone:?}");
    shim.start_again().expect("the shim again");
    until(|| pool(&envoy, "p"), |s| ends_with(s, 5, 200));
}

/// `expired_assignment_behavior`: an expired assignment falls back to its
/// `fallback_rate_limit` (here `allow_all`) for its timeout, then to
/// `no_assignment_behavior` (`deny_all`). The bucket is denied all (its
/// window spent) when Sluice goes away.
#[test]
fn an_expired_assignment_falls_back_then_to_no_assignment() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let doc = document("deny", 3, 3, "2s");
    let mut shim = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let expired = json!({"expired_assignment_behavior": {
        "fallback_rate_limit": {"blanket_rule": "ALLOW_ALL"},
        "expired_assignment_behavior_timeout": "4s"
    }});
    let envoy = Envoy::start_rlqs(&doc, shim.grpc_port, upstream.port, expired).expect("envoy");
    until(|| pool(&envoy, "p"), |s| admitted(s) == 3 && ends_with(s, 10, 429));
    shim.shim.kill();
    // deny_all until it expires, allow_all for the fallback's timeout, deny_all again.
    let after = until(
        || pool(&envoy, "p"),
        |s| s.iter().position(|x| *x == 200).is_some_and(|first| ends_with(&s[first..], 10, 429)),
    );
    assert!(!after.contains(&500), "{after:?}");
}

/// `failure_mode: allow` renders `no_assignment_behavior: allow_all`: with
/// Sluice gone and the assignment expired, the bucket lets everything through.
#[test]
fn failure_mode_allow_lets_an_expired_bucket_through() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let doc = document("allow", 3, 3, "2s");
    let mut shim = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let envoy = Envoy::start_rlqs(&doc, shim.grpc_port, upstream.port, json!({})).expect("envoy");
    until(|| pool(&envoy, "p"), |s| admitted(s) >= 3 && ends_with(s, 10, 429));
    shim.shim.kill();
    until(|| pool(&envoy, "p"), |s| ends_with(s, 10, 200));
}

/// A limit lowered (the document reloaded, SIGHUP) while a bucket holds a
/// long-lived assignment with tokens left: Sluice replaces it at once with
/// `deny_all`, and the window, already past its new limit, admits nothing
/// more. The tokens Envoy held and never spent go back to the window at
/// the next report that settles them (regression: they stayed charged
/// until the window's end, an hour here), so the window counts exactly
/// what was admitted.
#[test]
fn a_lowered_limit_replaces_live_assignments() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    // A lease larger than the requests sent until Envoy gets `deny_all`
    // (a report comes every 5 s, a request every 25 ms or more).
    let doc = document("deny", 100_000, 1_000, "30s");
    let shim = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let envoy = Envoy::start_rlqs(&doc, shim.grpc_port, upstream.port, json!({})).expect("envoy");
    let before = until(|| pool(&envoy, "p"), |s| ends_with(s, 10, 200));
    assert!(counted(&redis, "p") >= 1_000, "a lease of 1,000 is out");
    shim.reload(&document("deny", 5, 5, "30s")).expect("reload");
    let after = until(|| pool(&envoy, "p"), |s| ends_with(s, 20, 429));
    let first_denied = after.iter().position(|s| *s == 429).expect("denied");
    assert!(after[first_denied..].iter().all(|s| *s == 429), "nothing more admitted: {after:?}");
    let spent = (admitted(&before) + admitted(&after)) as u64;
    assert!(spent < 1_000, "{spent} admitted: some of the lease is left to give back");
    let back = until(|| pool(&envoy, "p"), |_| counted(&redis, "p") == spent);
    assert_eq!(admitted(&back), 0, "{back:?}");
    eprintln!(
        "{spent} admitted; the rest of the lease of 1,000 went back after {} more requests",
        back.len()
    );
}
