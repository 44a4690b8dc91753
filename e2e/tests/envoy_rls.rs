//! The RLS face through real Envoy: its native `envoy.filters.http.ratelimit`
//! filter, with the route's `rate_limits` actions (`envoy/rls.yaml`, as
//! `sluice envoy-config --face rls` renders it), calling `sluice serve
//! --grpc-listen` on a real Redis. Allow then deny with the headers, the
//! filter's `failure_mode_deny` both ways with the shim down, two Envoys
//! sharing one limit exactly, shadow mode, `unlimited`, and a descriptor no
//! policy matches.

use sluice_harness::gateway::{sample, send, Response};
use sluice_harness::shim::GrpcShim;
use sluice_harness::{Envoy, Redis, Upstream};

fn document(top: &str) -> String {
    format!(
        r#"{{{top} "headers": "always", "shim": {{"timeout_ms": 5000}}, "policies": [
  {{"name": "per-client", "match": {{"domain": "edge", "entries": {{"x-client": {{"present": true}}}}}},
   "key": ["entry:x-client"], "limits": [{{"type": "fixed_window", "limit": 2, "window": "1h"}}]}},
  {{"name": "pooled", "match": {{"domain": "edge", "entries": {{"x-pool": {{"present": true}}}}}},
   "key": ["entry:x-pool"], "limits": [{{"type": "sliding_window", "limit": 7, "window": "1h"}}]}},
  {{"name": "trial", "shadow": true, "match": {{"domain": "edge", "entries": {{"x-trial": {{"present": true}}}}}},
   "limits": [{{"type": "fixed_window", "limit": 1, "window": "1h"}}]}},
  {{"name": "internal", "unlimited": true, "match": {{"domain": "edge", "entries": {{"x-tier": {{"equals": "internal"}}}}}}}}
]}}"#
    )
}

fn get(envoy: &Envoy, headers: &[(&str, &str)]) -> Response {
    send(envoy.port, "GET", "/api", headers).expect("request")
}

#[test]
fn envoy_asks_the_rls_face_allows_then_denies_with_headers() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let doc = document("");
    let shim = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let envoy = Envoy::start_rls(&doc, shim.grpc_port, upstream.port).expect("envoy");
    for remaining in ["1", "0"] {
        let ok = get(&envoy, &[("x-client", "alice")]);
        assert_eq!(ok.status, 200, "{}\n{}", envoy.log(), shim.shim.log());
        assert_eq!(ok.header("ratelimit-policy"), Some(r#""per-client";q=2;w=3600"#), "{:?}", ok.headers);
        assert!(
            ok.header("ratelimit").is_some_and(|h| h.starts_with(&format!("\"per-client\";r={remaining};"))),
            "{:?}",
            ok.headers
        );
        assert_eq!(ok.header("x-ratelimit-remaining"), Some(remaining), "{:?}", ok.headers);
        assert!(ok.header("x-ratelimit-limit").is_some_and(|h| h.starts_with('2')), "{:?}", ok.headers);
    }
    let denied = get(&envoy, &[("x-client", "alice")]);
    assert_eq!(denied.status, 429, "{:?}", denied.headers);
    assert!(
        denied.header("ratelimit").is_some_and(|h| h.starts_with("\"per-client\";r=0;")),
        "{:?}",
        denied.headers
    );
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"), "{:?}", denied.headers);
    // Another client has its own bucket; a request without the header sends no descriptor.
    assert_eq!(get(&envoy, &[("x-client", "bob")]).status, 200);
    assert_eq!(get(&envoy, &[]).status, 200);
    let page = shim.metrics().expect("metrics");
    assert_eq!(
        sample(&page, r#"sluice_decisions_total{policy="per-client",result="denied",face="rls"}"#),
        1.0,
        "{page}"
    );
    assert_eq!(
        sample(&page, r#"sluice_decisions_total{policy="per-client",result="allowed",face="rls"}"#),
        3.0,
        "{page}"
    );
}

#[test]
fn shadow_unlimited_and_unmatched_descriptors_pass() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let doc = document("");
    let shim = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let envoy = Envoy::start_rls(&doc, shim.grpc_port, upstream.port).expect("envoy");
    for _ in 0..3 {
        assert_eq!(get(&envoy, &[("x-trial", "t")]).status, 200, "shadow never refuses");
        assert_eq!(get(&envoy, &[("x-tier", "internal")]).status, 200, "unlimited");
        assert_eq!(get(&envoy, &[("x-tier", "free")]).status, 200, "a descriptor no policy matches");
    }
    let page = shim.metrics().expect("metrics");
    assert_eq!(
        sample(&page, r#"sluice_decisions_total{policy="trial",result="allowed",face="rls"}"#),
        1.0,
        "{page}"
    );
    assert_eq!(
        sample(&page, r#"sluice_decisions_total{policy="trial",result="denied",face="rls"}"#),
        2.0,
        "{page}"
    );
    assert_eq!(
        sample(&page, r#"sluice_decisions_total{policy="internal",result="unlimited",face="rls"}"#),
        3.0,
        "{page}"
    );
    assert_eq!(sample(&page, r#"sluice_unmatched_descriptors_total{face="rls"}"#), 3.0, "{page}");
}

/// Two Envoys, one shim, one Redis: the limit holds exactly across both.
#[test]
fn two_envoys_share_one_limit_exactly() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let doc = document("");
    let shim = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let a = Envoy::start_rls(&doc, shim.grpc_port, upstream.port).expect("envoy a");
    let b = Envoy::start_rls(&doc, shim.grpc_port, upstream.port).expect("envoy b");
    let statuses: Vec<u16> =
        (0..20).map(|i| get(if i % 2 == 0 { &a } else { &b }, &[("x-pool", "shared")]).status).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 7, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 13, "{statuses:?}");
}

/// The shim down: `failure_mode: deny` renders `failure_mode_deny: true`
/// and Envoy refuses (500, its `status_on_error`); `allow` lets requests pass.
#[test]
fn failure_mode_deny_both_ways_when_the_shim_is_down() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let deny = document(r#""failure_mode": "deny","#);
    let allow = document(r#""failure_mode": "allow","#);
    let mut shim = GrpcShim::start(&redis.url(), &allow).expect("shim");
    let closed = Envoy::start_rls(&deny, shim.grpc_port, upstream.port).expect("envoy deny");
    let open = Envoy::start_rls(&allow, shim.grpc_port, upstream.port).expect("envoy allow");
    assert_eq!(get(&closed, &[("x-client", "carol")]).status, 200, "the shim up: decided");
    shim.shim.kill();
    for _ in 0..3 {
        assert_eq!(get(&closed, &[("x-client", "carol")]).status, 500, "failure_mode_deny: true");
        assert_eq!(get(&open, &[("x-client", "carol")]).status, 200, "failure_mode_deny: false");
    }
}
