//! What a client and an operator see of Sluice at the gateway, end to end
//! through real Envoy, `sluice.wasm`, the shim and Redis: the IETF RateLimit
//! headers, per-policy responses, shadow mode, the over-limit cache and the
//! stats in `/stats/prometheus`.

use sluice_harness::gateway::{prometheus, sample, send, Response};
use sluice_harness::Stack;

/// A one-limit policy named `name` on `/NAME/` per `x-api-key`, with `extra` fields.
fn policy(name: &str, limit: &str, extra: &str) -> String {
    format!(
        r#"{{"name": "{name}", "match": {{"path_prefix": "/{name}/"}}, "key": ["header:x-api-key"], {extra}
            "limits": [{limit}]}}"#
    )
}

fn document(top: &str, policies: &[String]) -> String {
    format!(
        r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", {top} "policies": [{}]}}"#,
        policies.join(",")
    )
}

fn get(stack: &Stack, path: &str, key: &str) -> Response {
    send(stack.envoy.port, "GET", path, &[("x-api-key", key)]).expect("request")
}

fn statuses(replies: &[Response]) -> Vec<u16> {
    replies.iter().map(|r| r.status).collect()
}

const TWO_PER_MINUTE: &str = r#"{"type": "sliding_window", "limit": 2, "window": "1m"}"#;

/// By default (`on_deny`) only a denial carries the RateLimit headers: the
/// third request of a 2-per-minute policy gets 429 with
/// `RateLimit-Policy: "api";q=2;w=60`, `RateLimit: "api";r=0;t=<1..60>` and
/// a matching `retry-after`; the admitted ones carry none.
#[test]
fn a_denial_carries_the_ratelimit_headers_by_default() {
    let stack = Stack::start(&document("", &[policy("api", TWO_PER_MINUTE, "")])).expect("stack");
    let replies: Vec<Response> = (0..3).map(|_| get(&stack, "/api/x", "alice")).collect();
    assert_eq!(statuses(&replies), [200, 200, 429], "{}", stack.envoy.log());
    for ok in &replies[..2] {
        assert_eq!((ok.header("ratelimit"), ok.header("ratelimit-policy")), (None, None), "{ok:?}");
    }
    let denied = &replies[2];
    assert_eq!(denied.header("ratelimit-policy"), Some(r#""api";q=2;w=60"#));
    let ratelimit = denied.header("ratelimit").expect("RateLimit header");
    let t: u64 = ratelimit.strip_prefix(r#""api";r=0;t="#).and_then(|t| t.parse().ok()).expect(ratelimit);
    assert!((1..=60).contains(&t), "{ratelimit}");
    assert_eq!(denied.header("retry-after"), Some(t.to_string().as_str()));
    let body: serde_json::Value = serde_json::from_str(&denied.body).expect("JSON body");
    assert_eq!(body, serde_json::json!({"error": "rate_limited", "policy": "api", "retry_after": t}));
}

/// With `"headers": "always"` the upstream's responses carry them too, with
/// the remaining count going down; with `"off"` even a denial has none (but
/// still its `retry-after`).
#[test]
fn headers_always_and_off() {
    let doc = document(r#""headers": "always","#, &[policy("api", TWO_PER_MINUTE, "")]);
    let stack = Stack::start(&doc).expect("stack");
    let replies: Vec<Response> = (0..3).map(|_| get(&stack, "/api/x", "alice")).collect();
    assert_eq!(statuses(&replies), [200, 200, 429]);
    let remaining: Vec<Option<&str>> = replies.iter().map(|r| r.header("ratelimit")).collect();
    assert!(remaining[0].is_some_and(|h| h.starts_with(r#""api";r=1;t="#)), "{remaining:?}");
    assert!(remaining[1].is_some_and(|h| h.starts_with(r#""api";r=0;t="#)), "{remaining:?}");
    assert_eq!(replies[0].header("ratelimit-policy"), Some(r#""api";q=2;w=60"#));
    assert_eq!(replies[0].body, "ok\n", "the upstream's body");
    drop(stack);

    let doc = document(r#""headers": "off","#, &[policy("api", TWO_PER_MINUTE, "")]);
    let stack = Stack::start(&doc).expect("stack");
    let replies: Vec<Response> = (0..3).map(|_| get(&stack, "/api/x", "alice")).collect();
    assert_eq!(statuses(&replies), [200, 200, 429]);
    assert!(replies
        .iter()
        .all(|r| r.header("ratelimit").is_none() && r.header("ratelimit-policy").is_none()));
    assert!(replies[2].header("retry-after").is_some());
}

/// Of two limits the most restrictive is described: with 100 per minute and
/// 3 per 10 s, the headers name the 10 s one (fewest remaining).
#[test]
fn the_most_restrictive_limit_is_described() {
    let limits = r#"{"type": "fixed_window", "limit": 100, "window": "1m"},
                    {"type": "sliding_window", "limit": 3, "window": "10s"}"#;
    let doc = document(r#""headers": "always","#, &[policy("api", limits, "")]);
    let stack = Stack::start(&doc).expect("stack");
    let reply = get(&stack, "/api/x", "alice");
    assert_eq!(reply.header("ratelimit-policy"), Some(r#""api";q=3;w=10"#), "{reply:?}");
    assert!(reply.header("ratelimit").is_some_and(|h| h.starts_with(r#""api";r=2;t="#)), "{reply:?}");
}

/// A policy's own response: 503 with its body and extra header for load
/// shedding, still with `retry-after`; another policy keeps the default 429.
#[test]
fn a_policy_sets_its_own_status_body_and_headers() {
    let shed = policy(
        "shed",
        r#"{"type": "interval", "every": "1m"}"#,
        r#""response": {"status": 503, "body": "busy, come back later\n", "headers": {"x-shed": "yes"}},"#,
    );
    let api = policy("api", r#"{"type": "interval", "every": "1m"}"#, "");
    let stack = Stack::start(&document("", &[shed, api])).expect("stack");
    assert_eq!(get(&stack, "/shed/x", "k").status, 200);
    let denied = get(&stack, "/shed/x", "k");
    assert_eq!(denied.status, 503, "{denied:?}");
    assert_eq!(denied.body, "busy, come back later\n");
    assert_eq!(denied.header("x-shed"), Some("yes"));
    assert_eq!(denied.header("content-type"), Some("text/plain; charset=utf-8"));
    assert!(denied
        .header("retry-after")
        .is_some_and(|s| s.parse::<u64>().is_ok_and(|s| (1..=60).contains(&s))));
    assert_eq!(get(&stack, "/api/x", "k").status, 200);
    assert_eq!(get(&stack, "/api/x", "k").status, 429);
}

/// Shadow mode: a shadow policy of 2 per minute never refuses, but counts
/// for real: of 5 requests all pass, the last 3 carry
/// `x-sluice-shadow: would-deny; policy="trial"`, Redis holds exactly the 2
/// admitted ones, and the stats say 2 allowed and 3 shadow_denied.
#[test]
fn a_shadow_policy_counts_but_never_refuses() {
    let doc = document(r#""shadow_header": true,"#, &[policy("trial", TWO_PER_MINUTE, r#""shadow": true,"#)]);
    let stack = Stack::start(&doc).expect("stack");
    let replies: Vec<Response> = (0..5).map(|_| get(&stack, "/trial/x", "alice")).collect();
    assert_eq!(statuses(&replies), [200; 5], "{}", stack.envoy.log());
    let notes: Vec<Option<&str>> = replies.iter().map(|r| r.header("x-sluice-shadow")).collect();
    let would_deny = Some(r#"would-deny; policy="trial""#);
    assert_eq!(notes, [None, None, would_deny, would_deny, would_deny]);
    let mut redis = stack.redis.connection().expect("redis");
    let entries: u64 =
        redis::cmd("ZCARD").arg("sluice:{trial:alice}:sw:60000").query(&mut redis).expect("ZCARD");
    assert_eq!(entries, 2, "a shadow policy charges what it admits, nothing more");
    let page = prometheus(&stack.envoy).expect("stats");
    assert_eq!(sample(&page, r#"sluice_allowed{policy="trial"}"#), 2.0, "{page}");
    assert_eq!(sample(&page, r#"sluice_shadow_denied{policy="trial"}"#), 3.0);
    assert_eq!(sample(&page, r#"sluice_denied{policy="trial"}"#), 0.0);
}

/// A shadow policy's denial does not stop an enforced policy from charging:
/// both apply to `/both/`, the shadow one (1 per minute) would deny the
/// second request, the enforced one (3 per minute) admits and charges it.
#[test]
fn a_shadow_denial_does_not_affect_the_enforced_policies() {
    let shadow = r#"{"name": "trial", "shadow": true, "key": ["header:x-api-key"],
                     "limits": [{"type": "sliding_window", "limit": 1, "window": "1m"}]}"#;
    let enforced = r#"{"name": "real", "key": ["header:x-api-key"],
                       "limits": [{"type": "sliding_window", "limit": 3, "window": "1m"}]}"#;
    let stack = Stack::start(&document("", &[shadow.into(), enforced.into()])).expect("stack");
    let replies: Vec<Response> = (0..4).map(|_| get(&stack, "/both/x", "alice")).collect();
    assert_eq!(statuses(&replies), [200, 200, 200, 429]);
    let mut redis = stack.redis.connection().expect("redis");
    let real: u64 = redis::cmd("ZCARD").arg("sluice:{real:alice}:sw:60000").query(&mut redis).expect("ZCARD");
    let trial: u64 =
        redis::cmd("ZCARD").arg("sluice:{trial:alice}:sw:60000").query(&mut redis).expect("ZCARD");
    assert_eq!((real, trial), (3, 1));
}

/// The over-limit cache: once the shim denies alice on a 1-per-minute
/// window, the next 20 requests are denied by the filter itself, with the
/// same response, without a shim check (the shim decided 2 checks, the
/// stats say 1 denied and 20 cache_denied), whichever worker they land on.
/// The entry is keyed by policy and key: alice on another policy, and bob on
/// this one, still reach the shim and pass.
#[test]
fn the_over_limit_cache_denies_locally_until_the_retry_moment() {
    let one = r#"{"type": "sliding_window", "limit": 1, "window": "1m"}"#;
    let doc = document("", &[policy("api", one, ""), policy("other", one, "")]);
    let stack = Stack::start(&doc).expect("stack");
    let first: Vec<Response> = (0..2).map(|_| get(&stack, "/api/x", "alice")).collect();
    assert_eq!(statuses(&first), [200, 429]);
    let cached: Vec<Response> = (0..20).map(|_| get(&stack, "/api/x", "alice")).collect();
    assert_eq!(statuses(&cached), [429; 20]);
    for reply in &cached {
        let secs: u64 = reply.header("retry-after").and_then(|s| s.parse().ok()).expect("retry-after");
        assert!((1..=60).contains(&secs), "{reply:?}");
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""api";q=1;w=60"#));
        assert!(reply.body.contains(r#""policy":"api""#), "{reply:?}");
    }
    let page = prometheus(&stack.envoy).expect("stats");
    // The shim decided two checks; the cached denials reach it only as a
    // count in a worker's report, never as checks.
    let shim = stack.shim.metrics().expect("shim metrics");
    let decided = |result: &str| {
        sample(&shim, &format!(r#"sluice_decisions_total{{policy="api",result="{result}",face="filter"}}"#))
    };
    assert_eq!((decided("allowed"), decided("denied")), (1.0, 1.0));
    assert_eq!(
        (
            sample(&page, r#"sluice_denied{policy="api"}"#),
            sample(&page, r#"sluice_cache_denied{policy="api"}"#)
        ),
        (1.0, 20.0)
    );
    assert_eq!(get(&stack, "/other/x", "alice").status, 200, "another policy, same key");
    assert_eq!(get(&stack, "/api/x", "bob").status, 200, "same policy, another key");
}

/// The stats in `/stats/prometheus` add up to the traffic sent: 5 requests
/// on a 3-per-minute policy are 3 allowed, 1 denied by the shim and 1 from
/// the over-limit cache; the shim latency histogram holds exactly the 4
/// shim calls (histograms appear at Envoy's next stats flush, polled for).
#[test]
fn the_stats_match_the_traffic() {
    let three = r#"{"type": "sliding_window", "limit": 3, "window": "1m"}"#;
    let stack = Stack::start(&document("", &[policy("metered-api", three, "")])).expect("stack");
    let replies: Vec<Response> = (0..5).map(|_| get(&stack, "/metered-api/x", "alice")).collect();
    assert_eq!(statuses(&replies), [200, 200, 200, 429, 429]);
    let page = prometheus(&stack.envoy).expect("stats");
    let counts: Vec<f64> =
        ["allowed", "denied", "cache_denied", "shadow_denied", "failure_allowed", "failure_denied"]
            .iter()
            .map(|what| sample(&page, &format!(r#"sluice_{what}{{policy="metered-api"}}"#)))
            .collect();
    assert_eq!(counts, [3.0, 1.0, 1.0, 0.0, 0.0, 0.0], "{page}");
    let calls =
        || prometheus(&stack.envoy).map(|page| sample(&page, "sluice_shim_latency_ms_count")).unwrap_or(0.0);
    let flushed = sluice_harness::gateway::eventually(std::time::Duration::from_secs(20), || calls() == 4.0);
    assert!(flushed, "sluice_shim_latency_ms_count = {}, want 4", calls());
}

/// The rendered config's `stats_tags` make the policy a label: after 3
/// requests to `partner-api` (2 per minute) and 1 to `search`, Envoy's
/// Prometheus page has `sluice_allowed{policy="partner-api"} 2`,
/// `sluice_denied{policy="partner-api"} 1` and
/// `sluice_allowed{policy="search"} 1` (the label keeps the dash), no
/// per-policy stat under its old name, and the filter-wide breaker stats
/// under theirs.
#[test]
fn envoy_stats_carry_the_policy_as_a_label() {
    let doc =
        document("", &[policy("partner-api", TWO_PER_MINUTE, ""), policy("search", TWO_PER_MINUTE, "")]);
    let stack = Stack::start(&doc).expect("stack");
    let replies: Vec<Response> = (0..3).map(|_| get(&stack, "/partner-api/x", "alice")).collect();
    assert_eq!(statuses(&replies), [200, 200, 429]);
    assert_eq!(get(&stack, "/search/x", "alice").status, 200);
    let page = prometheus(&stack.envoy).expect("stats");
    assert_eq!(sample(&page, r#"sluice_allowed{policy="partner-api"}"#), 2.0, "{page}");
    assert_eq!(sample(&page, r#"sluice_denied{policy="partner-api"}"#), 1.0);
    assert_eq!(sample(&page, r#"sluice_allowed{policy="search"}"#), 1.0);
    assert!(page.contains("# TYPE sluice_allowed counter"), "{page}");
    let untagged: Vec<&str> =
        page.lines().filter(|l| l.starts_with("sluice_partner") || l.starts_with("sluice_search")).collect();
    assert!(untagged.is_empty(), "per-policy stats without the label: {untagged:?}");
    assert!(page.lines().any(|l| l == "sluice_breaker_opened{} 0"), "{page}");
}
