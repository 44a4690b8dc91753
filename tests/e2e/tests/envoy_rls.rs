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

// ---- The peers' configurations, imported and served behind unchanged Envoys.

/// A peer's configuration (`host-shim/tests/fixtures/import/FILE`) through the
/// real `sluice import` (`--accept-losses` when `accept`).
fn import(file: &str, accept: bool) -> String {
    let path = sluice_harness::workspace_root().join("host-shim/tests/fixtures/import").join(file);
    let sluice = sluice_harness::dist("sluice").expect("dist/sluice");
    let mut cmd = std::process::Command::new(sluice);
    cmd.arg("import");
    if accept {
        cmd.arg("--accept-losses");
    }
    let out = cmd.arg(&path).output().expect("sluice import");
    assert!(out.status.success(), "{file}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The request header that carries descriptor entry `key`.
fn carrier(key: &str) -> String {
    format!("x-{}", key.replace(['_', '.'], "-"))
}

/// An Envoy as its team configured it for the peer: the native filter with
/// `domain`, and one `rate_limits` entry per descriptor, each entry from
/// its request header (a descriptor is not sent when one is missing).
fn peer_envoy(domain: &str, descriptors: &[&[&str]], shim: u16, upstream: u16) -> Envoy {
    peer_envoy_from(domain, descriptors, shim, upstream, None)
}

/// [`peer_envoy`], with a filter before the rate-limit filter that sets
/// each request's `hits_addend` from its `x-hits` header (the filter state
/// `envoy.ratelimit.hits_addend`, which Envoy's filter sends as the
/// request's `hits_addend`).
fn peer_envoy_with_hits(domain: &str, descriptors: &[&[&str]], shim: u16, upstream: u16) -> Envoy {
    const SET_HITS: &str = r#"          - name: envoy.filters.http.set_filter_state
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.set_filter_state.v3.Config
              on_request_headers:
              - object_key: envoy.ratelimit.hits_addend
                format_string:
                  text_format_source: {inline_string: "%REQ(x-hits)%"}
"#;
    peer_envoy_from(domain, descriptors, shim, upstream, Some(SET_HITS))
}

/// [`peer_envoy`], with the filter `before` (its YAML) before the
/// rate-limit filter.
fn peer_envoy_from(
    domain: &str,
    descriptors: &[&[&str]],
    shim: u16,
    upstream: u16,
    before: Option<&str>,
) -> Envoy {
    let rate_limits: Vec<serde_json::Value> = descriptors
        .iter()
        .map(|keys| {
            let actions: Vec<serde_json::Value> = keys
                .iter()
                .map(|k| serde_json::json!({"request_headers": {"header_name": carrier(k), "descriptor_key": k}}))
                .collect();
            serde_json::json!({ "actions": actions })
        })
        .collect();
    let values = [
        ("DOMAIN", serde_json::to_string(domain).expect("json")),
        ("RATE_LIMITS", serde_json::to_string(&rate_limits).expect("json")),
        ("FAILURE_MODE_DENY", "false".to_string()),
        ("TIMEOUT", "5s".to_string()),
        ("UPSTREAM_PORT", upstream.to_string()),
        ("SHIM_PORT", shim.to_string()),
    ];
    let template = sluice_harness::workspace_root().join("envoy/rls.yaml");
    let Some(before) = before else {
        return Envoy::start_template(&template, &values, 2).expect("envoy");
    };
    const RATELIMIT: &str = "          - name: envoy.filters.http.ratelimit\n";
    let text = std::fs::read_to_string(&template).expect("envoy/rls.yaml");
    assert!(text.contains(RATELIMIT), "the template's rate-limit filter");
    let dir = std::env::temp_dir().join(format!("sluice-rls-before-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let path = dir.join(format!("rls-before-{upstream}-{shim}.yaml"));
    std::fs::write(&path, text.replace(RATELIMIT, &format!("{before}{RATELIMIT}"))).expect("write");
    Envoy::start_template(&path, &values, 2).expect("envoy")
}

/// A request whose headers carry `entries`.
fn ask(envoy: &Envoy, entries: &[(&str, &str)]) -> Response {
    let headers: Vec<(String, &str)> = entries.iter().map(|(k, v)| (carrier(k), *v)).collect();
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    send(envoy.port, "GET", "/api", &headers).expect("request")
}

fn statuses(envoy: &Envoy, entries: &[(&str, &str)], n: usize) -> Vec<u16> {
    (0..n).map(|_| ask(envoy, entries).status).collect()
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs()
}

/// Waits, if need be, so that the next `seconds` stay inside one window of
/// `window` seconds (aligned to the epoch): counts then do not depend on
/// when the test runs.
fn inside_one_window(window: u64, seconds: u64) {
    let left = window - now_s() % window;
    if left <= seconds {
        std::thread::sleep(std::time::Duration::from_secs(left + 1));
    }
}

/// The issue's case, through two Envoys sharing the counters: value-specific
/// and bare rules, an unlimited tier, a blocklist, month and year units, a
/// middle wildcard and a shadow rule, decided as envoyproxy/ratelimit's
/// documented rules say, with its `x-ratelimit-*` headers.
#[test]
fn peer_a_mixed_configuration_through_two_envoys() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let doc = import("mixed.yaml", false);
    let shim = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let keys: &[&[&str]] = &[&["plan"], &["client_ip"], &["tenant"], &["org"], &["path"], &["trial"]];
    let a = peer_envoy("edge", keys, shim.grpc_port, upstream.port);
    let b = peer_envoy("edge", keys, shim.grpc_port, upstream.port);
    let both = |entries: &[(&str, &str)], n: usize| -> Vec<u16> {
        (0..n).map(|i| ask(if i % 2 == 0 { &a } else { &b }, entries).status).collect()
    };
    inside_one_window(60, 20);
    let pro = both(&[("plan", "pro")], 14);
    assert_eq!(pro.iter().filter(|s| **s == 200).count(), 12, "{pro:?}");
    let first = ask(&a, &[("plan", "enterprise")]);
    assert_eq!(first.header("x-ratelimit-limit"), Some("7, 7;w=60;name=\"plan\""), "{:?}", first.headers);
    assert_eq!(first.header("ratelimit"), None, "headers: off, as the peer");
    let internal = ask(&a, &[("plan", "internal")]);
    assert_eq!(internal.status, 200);
    assert_eq!(internal.header("x-ratelimit-limit"), None, "unlimited has no current_limit");
    assert_eq!(both(&[("plan", "internal")], 10), [200; 10]);
    assert_eq!(both(&[("plan", "free")], 8), [200, 200, 200, 200, 200, 200, 200, 429]);
    let blocked = ask(&b, &[("client_ip", "10.0.0.66")]);
    assert_eq!(blocked.status, 429);
    assert_eq!(
        blocked.header("x-ratelimit-limit"),
        Some("0, 0;w=60;name=\"blocked\""),
        "{:?}",
        blocked.headers
    );
    assert_eq!(both(&[("client_ip", "10.0.0.66")], 3), [429; 3]);
    assert_eq!(both(&[("client_ip", "10.0.0.1")], 6), [200, 200, 200, 200, 200, 429]);
    let tenant = ask(&a, &[("tenant", "acme")]);
    assert_eq!(tenant.header("x-ratelimit-remaining"), Some("3"), "{:?}", tenant.headers);
    let limit = tenant.header("x-ratelimit-limit").unwrap_or_default();
    assert!(limit.starts_with("4, 4;w=") && !limit.contains("name"), "a month, no invented name: {limit}");
    let reset: u64 = tenant.header("x-ratelimit-reset").and_then(|r| r.parse().ok()).expect("reset");
    let month = 30 * 86_400;
    assert!(reset.abs_diff(month - now_s() % month) <= 2, "{reset}");
    assert_eq!(both(&[("tenant", "acme")], 4), [200, 200, 200, 429]);
    assert_eq!(both(&[("org", "o")], 4), [200, 200, 200, 429]);
    assert_eq!(both(&[("path", "/api/7/action")], 3), [200, 200, 429]);
    assert_eq!(both(&[("path", "/api/7/other")], 3), [200; 3], "no rule");
    let trial: Vec<Response> = (0..3).map(|_| ask(&b, &[("trial", "t")])).collect();
    assert!(trial.iter().all(|r| r.status == 200), "shadow never refuses");
    assert_eq!(trial[2].header("x-ratelimit-remaining"), Some("0"), "{:?}", trial[2].headers);
    assert_eq!(
        trial[2].header("x-ratelimit-limit"),
        Some("1, 1;w=60;name=\"trial\""),
        "{:?}",
        trial[2].headers
    );
}

/// envoyproxy/ratelimit adds the call's `hits_addend` to every
/// descriptor's window: Envoy's filter sends it from the filter state
/// `envoy.ratelimit.hits_addend` (here set from a request header), and an
/// imported configuration charges every descriptor of the call its cost,
/// a refused one's too, past its limit (`charge: every_hit`), so a smaller
/// cost after it is refused as by the peer. Regression: a cost above 1 on a
/// window was answered INVALID_ARGUMENT, which the filter (no
/// `failure_mode_deny`) let through, so nothing was ever refused.
#[test]
fn peer_hits_addend_is_counted_on_every_window_through_envoy() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let shim = GrpcShim::start(&redis.url(), &import("mixed.yaml", false)).expect("shim");
    let keys: &[&[&str]] = &[&["tenant"], &["org"]];
    let a = peer_envoy_with_hits("edge", keys, shim.grpc_port, upstream.port);
    let b = peer_envoy_with_hits("edge", keys, shim.grpc_port, upstream.port);
    let ask_hits = |envoy: &Envoy, entries: &[(&str, &str)], n: &str| {
        let mut headers: Vec<(String, &str)> = entries.iter().map(|(k, v)| (carrier(k), *v)).collect();
        headers.push(("x-hits".to_string(), n));
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        send(envoy.port, "GET", "/api", &headers).expect("request")
    };
    // The month's 4 and the year's 3 (`mixed.yaml`), both charged 2.
    let both = [("tenant", "acme"), ("org", "o")];
    let first = ask_hits(&a, &both, "2");
    assert_eq!(first.status, 200, "{}\n{}", a.log(), shim.shim.log());
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"), "the year's: {:?}", first.headers);
    // The year has 1 left of a cost of 2: refused, and counted past its
    // limit; the month is charged anyway.
    let second = ask_hits(&b, &both, "2");
    assert_eq!(
        (second.status, second.header("x-ratelimit-remaining")),
        (429, Some("0")),
        "{:?}",
        second.headers
    );
    assert_eq!(ask_hits(&a, &[("tenant", "acme")], "1").status, 429, "the month's 4 are spent");
    assert_eq!(ask_hits(&b, &[("org", "o")], "1").status, 429, "the refused cost took the year's last");
    assert_eq!(ask_hits(&b, &[("org", "other")], "4").status, 429, "a cost above the limit never fits");
    assert_eq!(ask_hits(&a, &[("org", "other")], "3").status, 429, "and is counted too");
}

/// The examples of envoyproxy/ratelimit's README, converted by `sluice
/// import`, served, and driven through Envoy, with the decisions the README
/// states.
#[test]
fn peer_the_ratelimit_readme_examples_through_envoy() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let serve = |file: &str, accept: bool, domain: &str, keys: &[&[&str]]| {
        let shim = GrpcShim::start(&redis.url(), &import(file, accept)).expect("shim");
        let envoy = peer_envoy(domain, keys, shim.grpc_port, upstream.port);
        (shim, envoy)
    };
    let limit = |r: &Response| r.header("x-ratelimit-limit").map(str::to_string);

    // 1: each value its limit; another value none.
    let (_s, e) = serve("readme/example1.yaml", false, "mongo_cps", &[&["database"]]);
    assert_eq!(limit(&ask(&e, &[("database", "users")])).as_deref(), Some("500, 500;w=1"));
    assert_eq!(limit(&ask(&e, &[("database", "other")])), None);

    // 2: 5 marketing messages a day to a number, and 100 to any number;
    // both descriptors of a call charged.
    inside_one_window(86_400, 30);
    let (_s, e) =
        serve("readme/example2.yaml", false, "messaging", &[&["message_type", "to_number"], &["to_number"]]);
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    assert_eq!(statuses(&e, &marketing, 6), [200, 200, 200, 200, 200, 429]);
    let alone = ask(&e, &[("to_number", "2061111111")]);
    assert_eq!(
        (alone.status, alone.header("x-ratelimit-remaining")),
        (200, Some("93")),
        "{:?}",
        alone.headers
    );

    // 3: the specific value first: the blocklisted address is refused.
    let (_s, e) = serve("readme/example3.yaml", false, "edge_proxy_per_ip", &[&["remote_address"]]);
    assert_eq!(statuses(&e, &[("remote_address", "50.0.0.5")], 3), [429; 3]);
    assert_eq!(limit(&ask(&e, &[("remote_address", "50.0.0.1")])).as_deref(), Some("10, 10;w=1"));

    // 4: the depth must match.
    let two = [("key", "value"), ("subkey", "subvalue")];
    let (_s, e) = serve("readme/example4a.yaml", false, "example4", &[&["key", "subkey"]]);
    assert_eq!(limit(&ask(&e, &two)), None);
    let (_s, e) = serve("readme/example4b.yaml", false, "example4", &[&["key", "subkey"]]);
    assert_eq!(limit(&ask(&e, &two)).as_deref(), Some("300, 300;w=1"));

    // 5: unlimited.
    let (_s, e) = serve("readme/example5.yaml", false, "internal", &[&["ldap"], &["azure"]]);
    assert_eq!(statuses(&e, &[("ldap", "x")], 3), [200; 3]);
    assert_eq!(limit(&ask(&e, &[("ldap", "x")])), None);
    assert_eq!(limit(&ask(&e, &[("azure", "x")])).as_deref(), Some("100, 100;w=60"));

    // 6: user-a in shadow mode is never limited; user-b has 20 a second.
    let (_s, e) = serve("readme/example6.yaml", false, "example6", &[&["service", "user"]]);
    assert_eq!(statuses(&e, &[("service", "auth-service"), ("user", "user-a")], 15), [200; 15]);
    assert_eq!(
        limit(&ask(&e, &[("service", "auth-service"), ("user", "user-b")])).as_deref(),
        Some("20, 20;w=1")
    );

    // 7: with both descriptors the replacing limit (10/s) answers alone.
    let keys: &[&[&str]] = &[&["key_1", "user"], &["key_2", "user"]];
    let (_s, e) = serve("readme/example7.yaml", false, "example7", keys);
    let both = ask(&e, &[("key_1", "value_1"), ("key_2", "value_2"), ("user", "bkthomps")]);
    assert_eq!(limit(&both).as_deref(), Some("10, 10;w=1"), "{:?}", both.headers);
    let first = ask(&e, &[("key_1", "value_1"), ("user", "bkthomps")]);
    assert_eq!(limit(&first).as_deref(), Some("5, 5;w=1;name=\"specific_limit\""));

    // 8: an unlisted value gets the bare key's limit, a listed one its own.
    let (_s, e) = serve("readme/example8.yaml", true, "example8", &[&["key1"]]);
    assert_eq!(limit(&ask(&e, &[("key1", "unspecified")])).as_deref(), Some("10, 10;w=60"));
    assert_eq!(limit(&ask(&e, &[("key1", "value1")])).as_deref(), Some("20, 20;w=60"));

    // 9: wildcards at the end, in the middle, several.
    let (_s, e) = serve("readme/example9.yaml", false, "example9", &[&["key1"], &["path"], &["route"]]);
    for (key, value, limited) in [
        ("key1", "valueXYZ", true),
        ("path", "/api/user-id/action", true),
        ("path", "/api/123/other", false),
        ("route", "/api/v2/resource/456/action", true),
    ] {
        assert_eq!(limit(&ask(&e, &[(key, value)])).is_some(), limited, "{key}={value}");
    }

    // 11: files/* share one threshold of 10 an hour; files_no_share/* do not.
    inside_one_window(3_600, 30);
    let (_s, e) = serve("readme/example11.yaml", false, "example11", &[&["files"], &["files_no_share"]]);
    assert_eq!(statuses(&e, &[("files", "files/a.pdf")], 5), [200; 5]);
    assert_eq!(statuses(&e, &[("files", "files/b.csv")], 5), [200; 5]);
    assert_eq!(ask(&e, &[("files", "files/c.txt")]).status, 429);
    assert_eq!(statuses(&e, &[("files_no_share", "files_no_share/a.pdf")], 11).last(), Some(&429));
    assert_eq!(ask(&e, &[("files_no_share", "files_no_share/b.csv")]).status, 200);
}

#[path = "../../../host-shim/tests/peers/ratelimit.rs"]
#[allow(dead_code)]
mod ratelimit_model;

/// The differential test's wiring through Envoy: random requests whose
/// headers Envoy turns into descriptors, through the model of
/// envoyproxy/ratelimit (`host-shim/tests/peers/ratelimit.rs`) and through
/// Envoy and the face on the imported configuration: every request gets
/// the status the model's answer means.
#[test]
fn peer_random_requests_through_envoy_decide_as_the_ratelimit_model() {
    inside_one_window(86_400, 120);
    let dir = sluice_harness::scratch_dir("rls-model").expect("scratch dir");
    let file = dir.join("ratelimit.yaml");
    std::fs::write(&file, ratelimit_model::RATELIMIT).expect("write");
    let out = std::process::Command::new(sluice_harness::dist("sluice").expect("dist/sluice"))
        .arg("import")
        .arg(&file)
        .output()
        .expect("sluice import");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = String::from_utf8(out.stdout).expect("utf-8");
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let shim = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let keys: &[&[&str]] =
        &[&["plan"], &["ip"], &["path"], &["org", "user"], &["team"], &["quota"], &["credits"]];
    let envoy = peer_envoy("edge", keys, shim.grpc_port, upstream.port);
    let mut model = ratelimit_model::Ratelimit::new(ratelimit_model::RATELIMIT);
    let values: &[(&str, &[&str])] = &[
        ("plan", &["pro", "basic", "internal", "free"]),
        ("ip", &["10.0.0.66", "10.0.0.1"]),
        ("path", &["/api/7/action", "/api/9", "/web"]),
        ("org", &["x", "acme"]),
        ("user", &["u1", "vip", "alice"]),
        ("team", &["t1"]),
        ("quota", &["q1", "q2", "shadow"]),
        ("credits", &["c"]),
    ];
    let mut state = 0x5eed_u64;
    let mut below = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut denied = 0;
    for i in 0..120 {
        let mut entries: Vec<(&str, &str)> = Vec::new();
        for (k, vs) in values {
            // The quota-mode keys (`quota`, `credits`) in a quarter of the
            // requests, the others in two thirds: a call's quota
            // descriptors all over refuse it.
            let present = if ["quota", "credits"].contains(k) { below(4) == 0 } else { below(3) != 0 };
            if present {
                entries.push((k, vs[below(vs.len())]));
            }
        }
        // The descriptors Envoy sends: each rate_limits entry whose headers are all there.
        let call: ratelimit_model::Call = keys
            .iter()
            .filter_map(|ks| {
                ks.iter()
                    .map(|k| {
                        entries.iter().find(|(e, _)| e == k).map(|(k, v)| (k.to_string(), v.to_string()))
                    })
                    .collect::<Option<Vec<_>>>()
            })
            .collect();
        let status = ask(&envoy, &entries).status;
        let want =
            if call.is_empty() { ratelimit_model::OK } else { model.decide_hits(&call, now_s(), 1).overall };
        let want = if want == ratelimit_model::OVER { 429 } else { 200 };
        assert_eq!(status, want, "request {i}: {entries:?} -> {call:?}");
        denied += usize::from(status == 429);
    }
    assert!((10..110).contains(&denied), "the stream reaches both answers: {denied} denied");
}

/// envoyproxy/ratelimit: a descriptor's own `limit`, which Envoy's native
/// filter sends from the route's `rate_limits[].limit.dynamic_metadata`
/// (here set by a Lua filter from an `x-limit: N/UNIT` header), limits the
/// descriptor alone: a value's own rule and an unlimited one alike,
/// unnamed; without it the rule decides. (Imported documents honour it.)
#[test]
fn peer_a_descriptors_own_limit_through_envoy() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let shim = GrpcShim::start(&redis.url(), &import("mixed.yaml", false)).expect("shim");
    let envoy = override_envoy(shim.grpc_port, upstream.port);
    let ask_limit = |plan: &str, limit: Option<&str>| {
        let mut headers = vec![("x-plan", plan)];
        headers.extend(limit.map(|l| ("x-limit", l)));
        send(envoy.port, "GET", "/api", &headers).expect("request")
    };
    let first = ask_limit("pro", Some("3/HOUR"));
    assert_eq!(first.status, 200, "{}\n{}", envoy.log(), shim.shim.log());
    assert_eq!(first.header("x-ratelimit-limit"), Some("3, 3;w=3600"), "unnamed: {:?}", first.headers);
    let rest: Vec<u16> = (0..3).map(|_| ask_limit("pro", Some("3/HOUR")).status).collect();
    assert_eq!(rest, [200, 200, 429], "pro's rule is 12 a minute; its override 3 an hour");
    assert_eq!(ask_limit("pro", None).status, 200, "without it, the rule decides");
    let internal: Vec<u16> = (0..2).map(|_| ask_limit("internal", Some("1/HOUR")).status).collect();
    assert_eq!(internal, [200, 429], "an unlimited rule, limited by the override");
    assert_eq!(ask_limit("internal", None).status, 200);
}

/// An Envoy whose route sends `plan` from `x-plan` with the override read
/// from dynamic metadata, which a Lua filter before the rate-limit filter
/// sets from `x-limit` (`N/UNIT`, e.g. `3/HOUR`) when the request has one.
fn override_envoy(shim: u16, upstream: u16) -> Envoy {
    let rate_limits = serde_json::json!([{
        "actions": [{"request_headers": {"header_name": "x-plan", "descriptor_key": "plan"}}],
        "limit": {"dynamic_metadata": {"metadata_key": {"key": "sluice.override", "path": [{"key": "limit"}]}}}
    }]);
    let values = [
        ("DOMAIN", "\"edge\"".to_string()),
        ("RATE_LIMITS", rate_limits.to_string()),
        ("FAILURE_MODE_DENY", "true".to_string()),
        ("TIMEOUT", "5s".to_string()),
        ("UPSTREAM_PORT", upstream.to_string()),
        ("SHIM_PORT", shim.to_string()),
    ];
    const RATELIMIT: &str = "          - name: envoy.filters.http.ratelimit\n";
    const LUA: &str = r#"          - name: envoy.filters.http.lua
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
              default_source_code:
                inline_string: |
                  function envoy_on_request(request)
                    local limit = request:headers():get("x-limit")
                    if limit == nil then return end
                    local n, unit = string.match(limit, "^(%d+)/(%u+)$")
                    if n == nil then return end
                    request:streamInfo():dynamicMetadata():set("sluice.override", "limit",
                      {requests_per_unit = tonumber(n), unit = unit})
                  end
"#;
    let template = sluice_harness::workspace_root().join("envoy/rls.yaml");
    let text = std::fs::read_to_string(&template).expect("envoy/rls.yaml");
    assert!(text.contains(RATELIMIT), "the template's rate-limit filter");
    let dir = std::env::temp_dir().join(format!("sluice-rls-override-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let path = dir.join(format!("rls-override-{upstream}-{shim}.yaml"));
    std::fs::write(&path, text.replace(RATELIMIT, &format!("{LUA}{RATELIMIT}"))).expect("write");
    Envoy::start_template(&path, &values, 2).expect("envoy")
}

/// envoyproxy/ratelimit's `quota_mode` through Envoy (imported as
/// `quota`): a request is refused only when every quota descriptor of it
/// is over, or when a descriptor that is not a quota one is; a quota
/// descriptor over alone lets it through. Windows of a year.
#[test]
fn peer_quota_mode_through_envoy() {
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let shim = GrpcShim::start(&redis.url(), &import("quota.yaml", false)).expect("shim");
    let keys: &[&[&str]] = &[&["a"], &["b"], &["r"]];
    let envoy = peer_envoy("edge", keys, shim.grpc_port, upstream.port);
    // a=1 has 1 a year, b=1 2: a over, then both.
    assert_eq!(statuses(&envoy, &[("a", "1"), ("b", "1")], 3), [200, 200, 429]);
    // A quota descriptor within its quota beside a rate limit: the rate
    // limit over refuses.
    assert_eq!(statuses(&envoy, &[("b", "2"), ("r", "1")], 2), [200, 429]);
    // The quota descriptor over alone: refused, being every quota one.
    assert_eq!(statuses(&envoy, &[("a", "1")], 1), [429]);
}

/// envoyproxy/ratelimit's `metadata` through Envoy, with the document's
/// `dynamic_metadata` on (the peer's `RESPONSE_DYNAMIC_METADATA`): Envoy's
/// filter puts the answer's struct in the request's dynamic metadata
/// (`envoy.filters.http.ratelimit`), read here by a Lua filter into
/// response headers: the domain, and the first passing descriptor's
/// `team`. Without the setting (the imported default) there is none.
#[test]
fn peer_dynamic_metadata_through_envoy() {
    const LUA: &str = r#"          - name: envoy.filters.http.lua
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
              default_source_code:
                inline_string: |
                  function envoy_on_response(response)
                    local md = response:streamInfo():dynamicMetadata():get("envoy.filters.http.ratelimit")
                    if md == nil then return end
                    response:headers():add("x-rl-domain", md["domain"])
                    if md["metadata"] ~= nil then
                      response:headers():add("x-rl-team", md["metadata"]["team"])
                    end
                  end
"#;
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let doc = import("metadata.yaml", false);
    let keys: &[&[&str]] = &[&["a"], &["b"]];
    let off = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let envoy = peer_envoy_from("edge", keys, off.grpc_port, upstream.port, Some(LUA));
    let plain = ask(&envoy, &[("a", "0"), ("b", "0")]);
    assert_eq!((plain.status, plain.header("x-rl-domain")), (200, None), "off by default");
    let on = doc.replacen('{', r#"{"dynamic_metadata": true, "#, 1);
    let shim = GrpcShim::start(&redis.url(), &on).expect("shim");
    let envoy = peer_envoy_from("edge", keys, shim.grpc_port, upstream.port, Some(LUA));
    let first = ask(&envoy, &[("a", "1"), ("b", "1")]);
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-rl-domain"), Some("edge"), "{:?}", first.headers);
    assert_eq!(first.header("x-rl-team"), Some("payments"), "the first descriptor's key stays");
    // `a` (1 a year) is over: only `b` passed.
    let second = ask(&envoy, &[("a", "1"), ("b", "1")]);
    assert_eq!((second.status, second.header("x-rl-team")), (429, Some("search")), "{:?}", second.headers);
}

/// Limitador's server setting `--rate-limit-headers DRAFT_VERSION_03`,
/// given to `sluice import`: through Envoy, every response, admitted or
/// refused, carries draft 03's `X-RateLimit-*` over every limit the call
/// met, the one with the fewest remaining leading, as Limitador's server
/// writes them. Envoy's own `x-ratelimit-*` (from the statuses) stay out:
/// Limitador answers none.
#[test]
fn peer_limitadors_rate_limit_headers_through_envoy() {
    const LIMITS: &str = r#"
- namespace: shop
  max_value: 2
  seconds: 3600
  name: per-user
  conditions: []
  variables: ["descriptors[0]['user']"]
- namespace: shop
  max_value: 5
  seconds: 60
  conditions: []
  variables: []
"#;
    let dir = sluice_harness::scratch_dir("limitador-headers").expect("a scratch dir");
    let path = dir.join("limits.yaml");
    std::fs::write(&path, LIMITS).expect("the limits file");
    let sluice = sluice_harness::dist("sluice").expect("dist/sluice");
    let out = std::process::Command::new(sluice)
        .args(["import", "--rate-limit-headers", "DRAFT_VERSION_03"])
        .arg(&path)
        .output()
        .expect("sluice import");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = String::from_utf8(out.stdout).expect("utf-8");
    let redis = Redis::start().expect("redis");
    let upstream = Upstream::start().expect("upstream");
    let shim = GrpcShim::start(&redis.url(), &doc).expect("shim");
    let envoy = peer_envoy("shop", &[&["user"]], shim.grpc_port, upstream.port);
    const BOTH: &str = r#"2, 2;w=3600;name="per-user", 5;w=60"#;
    for (user, status, remaining, reset) in
        [("a", 200, "1", 3600_u64), ("a", 200, "0", 3600), ("a", 429, "0", 3600), ("b", 200, "1", 3600)]
    {
        let resp = ask(&envoy, &[("user", user)]);
        let at = format!("{user}: {:?}\n{}", resp.headers, shim.shim.log());
        assert_eq!(resp.status, status, "{at}");
        assert_eq!(resp.header("x-ratelimit-limit"), Some(BOTH), "{at}");
        assert_eq!(resp.header("x-ratelimit-remaining"), Some(remaining), "{at}");
        let shown: u64 = resp.header("x-ratelimit-reset").and_then(|r| r.parse().ok()).expect(&at);
        assert!(reset.abs_diff(shown) <= 2, "{at}");
    }
    // The shop's minute counts every admitted call (a refusal counts
    // none): after the fifth it leads, at 0, and refuses the sixth.
    assert_eq!(ask(&envoy, &[("user", "c")]).status, 200);
    for (user, status) in [("d", 200), ("e", 429)] {
        let resp = ask(&envoy, &[("user", user)]);
        assert_eq!(resp.status, status, "{user}: {:?}", resp.headers);
        assert_eq!(resp.header("x-ratelimit-limit"), Some(r#"5, 5;w=60, 2;w=3600;name="per-user""#));
        assert_eq!(resp.header("x-ratelimit-remaining"), Some("0"));
        let shown: u64 = resp.header("x-ratelimit-reset").and_then(|r| r.parse().ok()).expect("a reset");
        assert!(shown <= 60, "{:?}", resp.headers);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
