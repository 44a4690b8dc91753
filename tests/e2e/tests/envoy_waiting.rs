//! Egress waiting through real Envoy, `sluice.wasm`, the shim and Redis: a
//! request the shim holds for its slot is held before the router, so a
//! route timeout shorter than the hold does not cut it short; it passes with
//! `server-timing: sluice;dur=<ms held>`, and the stats count it.
//!
//! Needs the shim side of waiting (the shim holding its answer until the
//! slot): against a shim that ignores `wait_ms`, the second request is
//! refused at once and this test fails.

use std::time::{Duration, Instant};

use sluice_harness::gateway::{envoy_with_route_timeout, eventually, prometheus, sample, send};
use sluice_harness::{Redis, Shim, Upstream};

/// One call per 2 s, held up to 5 s (no margin, so the first call is not
/// held at all); the route times out after 1 s.
#[test]
fn a_request_held_longer_than_the_route_timeout_still_passes() {
    let doc = r#"{"shim": {"timeout_ms": 1000}, "failure_mode": "deny",
        "policies": [{"name": "partner", "wait": {"timeout": "5s", "margin": "0ms"},
                      "limits": [{"type": "interval", "every": "2s"}]}]}"#;
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let upstream = Upstream::start().expect("upstream");
    let envoy = envoy_with_route_timeout(doc, shim.port, upstream.port, "1s").expect("envoy");

    let first = send(envoy.port, "GET", "/v1/a", &[]).expect("first request");
    assert_eq!(first.status, 200, "the first call goes at once: {first:?}");
    assert_eq!(first.header("server-timing"), None, "not held");

    let started = Instant::now();
    let second = send(envoy.port, "GET", "/v1/b", &[]).expect("second request");
    let took = started.elapsed();
    assert_eq!(second.status, 200, "held until its slot, then passed: {second:?}");
    assert!(
        took > Duration::from_millis(1500),
        "held about 2 s, longer than the 1 s route timeout: {took:?}"
    );
    let timing = second.header("server-timing").expect("a held request says how long");
    let held: u64 = timing
        .strip_prefix("sluice;dur=")
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("server-timing {timing:?}"));
    assert!((1000..=2100).contains(&held), "held {held} ms for a 2 s interval");

    let stats = || prometheus(&envoy).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(5), || sample(&stats(), r#"sluice_waited{policy="partner"}"#) == 1.0),
        "one request waited:\n{}",
        stats()
    );
    assert_eq!(sample(&stats(), r#"sluice_immediate{policy="partner"}"#), 1.0);
}
