//! When the shim cannot decide, end to end through real Envoy and
//! `sluice.wasm`: a shim that never answers (bounded wait), a real shim
//! whose Redis refuses the scripts (5xx), a malformed answer, per-policy
//! failure modes where deny wins, and the outage breaker that stops asking
//! a failing shim for a cooldown and closes once it answers again.

use std::time::{Duration, Instant};

use sluice_harness::gateway::{eventually, prometheus, sample, send, Blackhole, FakeShim, Response};
use sluice_harness::{Envoy, Redis, Shim, Upstream};

fn document(top: &str, policies: &str) -> String {
    format!(r#"{{{top} "policies": [{policies}]}}"#)
}

const API: &str = r#"{"name": "api", "key": ["header:x-api-key"],
    "limits": [{"type": "sliding_window", "limit": 100, "window": "1m"}]}"#;

fn get(envoy: &Envoy) -> Response {
    send(envoy.port, "GET", "/api/x", &[("x-api-key", "alice")]).expect("request")
}

/// A shim that accepts TCP and never answers: each request waits at most
/// `timeout_ms` plus a little, then `failure_mode` decides (deny: 503, with
/// the document's `failure_status`; allow: 200). Bound asserted: < timeout +
/// 2 s; the measured times are printed.
#[test]
fn a_hanging_shim_costs_at_most_the_timeout() {
    let blackhole = Blackhole::start().expect("blackhole");
    let upstream = Upstream::start().expect("upstream");
    let timeout_ms = 300;
    for (mode, want) in [("deny", 503), ("allow", 200)] {
        let top = format!(
            r#""shim": {{"timeout_ms": {timeout_ms}, "failure_threshold": 0}}, "failure_mode": "{mode}", "failure_status": 503,"#
        );
        let envoy = Envoy::start(&document(&top, API), blackhole.port, upstream.port).expect("envoy");
        for _ in 0..3 {
            let started = Instant::now();
            let reply = get(&envoy);
            let took = started.elapsed();
            eprintln!(
                "failure_mode {mode}: answered {} after {took:?} (timeout {timeout_ms} ms)",
                reply.status
            );
            assert_eq!(reply.status, want, "{reply:?}");
            assert!(took < Duration::from_millis(timeout_ms + 2000), "waited {took:?}");
        }
        if mode == "deny" {
            let reply = get(&envoy);
            assert_eq!(reply.body, r#"{"error":"rate_limiter_unavailable"}"#);
        }
    }
}

/// A real shim whose Redis refuses the scripts answers 5xx; with two
/// policies applying, one `allow` and one `deny` with `failure_status` 429
/// overriding the document's `allow`, deny wins. A request only the allow
/// policy applies to passes. The stats count each decision per policy.
#[test]
fn a_failing_shim_lets_the_policies_decide_and_deny_wins() {
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let upstream = Upstream::start().expect("upstream");
    let lenient =
        r#"{"name": "lenient", "limits": [{"type": "sliding_window", "limit": 100, "window": "1m"}]}"#;
    let strict = r#"{"name": "strict", "match": {"path_prefix": "/strict/"}, "failure_mode": "deny",
        "failure_status": 429, "limits": [{"type": "sliding_window", "limit": 100, "window": "1m"}]}"#;
    let top = r#""shim": {"timeout_ms": 2000, "failure_threshold": 0}, "failure_mode": "allow","#;
    let envoy = Envoy::start(&document(top, &format!("{lenient},{strict}")), shim.port, upstream.port)
        .expect("envoy");
    assert_eq!(send(envoy.port, "GET", "/strict/x", &[]).expect("request").status, 200);
    redis.refuse_scripts().expect("ACL");
    let strict_reply = send(envoy.port, "GET", "/strict/x", &[]).expect("request");
    assert_eq!(strict_reply.status, 429, "{strict_reply:?}\n{}", shim.log());
    assert_eq!(send(envoy.port, "GET", "/other", &[]).expect("request").status, 200);
    let page = prometheus(&envoy).expect("stats");
    assert_eq!(sample(&page, r#"sluice_failure_denied{policy="lenient"}"#), 1.0, "both applied to /strict/x");
    assert_eq!(sample(&page, r#"sluice_failure_denied{policy="strict"}"#), 1.0);
    assert_eq!(
        sample(&page, r#"sluice_failure_allowed{policy="lenient"}"#),
        1.0,
        "only lenient applied to /other"
    );
    let log = envoy.log();
    assert!(log.contains("failure_mode deny (policy strict) answers 429"), "{log}");
}

/// A malformed answer (200 with a body that is not a check response) is a
/// failure like any other: `failure_mode` deny answers 503.
#[test]
fn a_malformed_answer_is_a_failure() {
    let fake = FakeShim::start(200, "{\"allowed\": tr").expect("fake shim");
    let upstream = Upstream::start().expect("upstream");
    let top = r#""shim": {"failure_threshold": 0}, "failure_mode": "deny","#;
    let envoy = Envoy::start(&document(top, API), fake.port, upstream.port).expect("envoy");
    let reply = get(&envoy);
    assert_eq!(reply.status, 503, "{reply:?}");
    assert!(envoy.log().contains("malformed shim answer"), "{}", envoy.log());
}

/// The outage breaker: with a threshold of 2 and a 60 s cooldown, 30
/// requests against a failing shim reach it at most twice per worker (the
/// rest are decided locally, still counted as failure_allowed); the opening
/// is logged once per worker and counted. After Redis recovers and a short
/// cooldown (a second Envoy with 1 s) ends, a probe succeeds and the breaker closes.
#[test]
fn the_breaker_stops_asking_a_failing_shim_and_closes_when_it_recovers() {
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let upstream = Upstream::start().expect("upstream");
    let top = r#""shim": {"failure_threshold": 2, "cooldown_ms": 60000}, "failure_mode": "allow","#;
    let envoy = Envoy::start(&document(top, API), shim.port, upstream.port).expect("envoy");
    redis.refuse_scripts().expect("ACL");
    for _ in 0..30 {
        assert_eq!(get(&envoy).status, 200);
    }
    let page = prometheus(&envoy).expect("stats");
    let shim_calls = sample(&page, r#"envoy_cluster_upstream_rq_total{envoy_cluster_name="sluice_shim"}"#);
    assert!(shim_calls <= 4.0, "{shim_calls} shim calls for 30 requests on 2 workers");
    assert_eq!(sample(&page, r#"sluice_failure_allowed{policy="api"}"#), 30.0);
    let opened = sample(&page, "sluice_breaker_opened");
    assert!((1.0..=2.0).contains(&opened), "opened {opened}");
    let lines = envoy.log().matches("shim failing: deciding locally").count();
    assert_eq!(lines as f64, opened, "one line per state change");
    drop(envoy);

    let top = r#""shim": {"failure_threshold": 1, "cooldown_ms": 1000}, "failure_mode": "deny","#;
    let envoy = Envoy::start(&document(top, API), shim.port, upstream.port).expect("envoy");
    for _ in 0..10 {
        assert_eq!(get(&envoy).status, 503);
    }
    redis.allow_scripts().expect("ACL");
    let closed = || prometheus(&envoy).map(|page| sample(&page, "sluice_breaker_closed")).unwrap_or(0.0);
    let recovered = eventually(Duration::from_secs(20), || get(&envoy).status == 200 && closed() >= 1.0);
    assert!(recovered, "{}", envoy.log());
    assert!(envoy.log().contains("breaker closed"));
    assert_eq!(get(&envoy).status, 200);
}
