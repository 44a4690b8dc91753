//! Scenarios 1 and 2: the real `dist/sluice.wasm`, in the wasm host, asking the
//! real shim (`dist/sluice serve`) backed by a real redis-server. The story
//! says when each answer arrives, so the order of events is exact.

use serde_json::json;
use sluice_harness::Backend;
use sluice_wasm_host::{Answer, Plugin, Route, Stream};

const SHIM: &str = "sluice_shim";

/// One policy on `/v42/`, keyed by `x-api-key`, with these limits.
fn policy(limits: &str) -> String {
    format!(
        r#"{{"shim": {{"cluster": "sluice_shim", "timeout_ms": 2000}}, "failure_mode": "deny",
            "policies": [{{"name": "partner-api", "match": {{"path_prefix": "/v42/"}},
                           "key": ["header:x-api-key"], "limits": [{limits}]}}]}}"#
    )
}

fn start() -> Backend {
    Backend::start().expect("starting redis-server and the shim")
}

fn route(backend: &Backend) -> Route {
    Route::Shim { port: backend.shim.port }
}

/// A GET of `/v42/orders` by `key` arrives; the filter asks the shim and waits.
fn asks(plugin: &Plugin, key: &str) -> Stream {
    let stream = plugin.stream();
    let headers: [(&str, &[u8]); 4] = [
        (":method", b"GET"),
        (":path", b"/v42/orders"),
        (":authority", b"api"),
        ("x-api-key", key.as_bytes()),
    ];
    stream.request_headers(&headers).calls_the_shim().pauses().done();
    stream
}

/// Allowed requests are resumed; once the limit is spent the next request gets
/// a 429 whose `retry-after` (whole seconds) matches the JSON body's
/// `retry_after` and lies within the window, and the body names the policy.
#[test]
fn allowed_requests_resume_and_the_fourth_gets_a_429() {
    let backend = start();
    let plugin = Plugin::configured(
        &policy(r#"{"type": "sliding_window", "limit": 3, "window": "1h"}"#),
        SHIM,
        route(&backend),
    );
    for _ in 0..3 {
        let stream = asks(&plugin, "alice");
        stream.shim_answers().resumes().done();
        stream.upstream_responds(200).continues().done();
        stream.completes().done();
    }
    let stream = asks(&plugin, "alice");
    let outcome = stream.shim_answers().sends(429).with_header("content-type", "application/json").done();
    let response = outcome.local_response().expect("the 429");
    let retry_after: u64 =
        response.headers.get_str("retry-after").expect("retry-after").parse().expect("whole seconds");
    assert!((1..=3600).contains(&retry_after), "retry-after {retry_after} outside the 1h window");
    let body: serde_json::Value = serde_json::from_slice(&response.body).expect("a JSON body");
    assert_eq!(body, json!({"error": "rate_limited", "policy": "partner-api", "retry_after": retry_after}));
    stream.completes().done();
}

/// Keys are independent: alice's spent limit does not touch bob.
#[test]
fn another_key_is_still_allowed() {
    let backend = start();
    let plugin = Plugin::configured(
        &policy(r#"{"type": "sliding_window", "limit": 1, "window": "1h"}"#),
        SHIM,
        route(&backend),
    );
    asks(&plugin, "alice").shim_answers().resumes().done();
    asks(&plugin, "alice").shim_answers().sends(429).done();
    asks(&plugin, "bob").shim_answers().resumes().done();
}

/// `retry-after` is the shim's wait rounded up to whole seconds (4001 ms is
/// 5 s, and never 0), in the header and in the body alike. Scripted answers
/// make the wait exact.
#[test]
fn retry_after_is_rounded_up_to_whole_seconds() {
    let plugin = Plugin::configured(
        &policy(r#"{"type": "sliding_window", "limit": 1, "window": "5s"}"#),
        SHIM,
        Route::Scripted,
    );
    for (wait_ms, secs) in [(4001, 5), (5000, 5), (1, 1), (0, 1)] {
        // A key of its own each time: a denied key's next request may be
        // denied from the filter's over-limit cache, without asking the shim.
        let stream = asks(&plugin, &format!("alice-{wait_ms}"));
        let body = json!({"error": "rate_limited", "policy": "partner-api", "retry_after": secs});
        stream
            .shim_replies(Answer::Deny { retry_after_ms: wait_ms })
            .sends(429)
            .with_header("retry-after", &secs.to_string())
            .with_json_body(body)
            .done();
        stream.completes().done();
    }
}

/// All or nothing across two windows (25 per minute and 300 per hour): 40
/// requests are in flight at once, their answers delivered in reverse order.
/// The first 25 dispatched are admitted, the other 15 get 429, and Redis then
/// holds exactly the 25 admitted requests in each window: a rejected request
/// is charged to neither.
#[test]
fn a_dual_window_charges_only_admitted_requests() {
    let backend = start();
    let limits = r#"{"type": "sliding_window", "limit": 25, "window": "1m"},
                    {"type": "sliding_window", "limit": 300, "window": "1h"}"#;
    let plugin = Plugin::configured(&policy(limits), SHIM, route(&backend));
    let streams: Vec<Stream> = (0..40).map(|_| asks(&plugin, "alice")).collect();
    for (n, stream) in streams.iter().enumerate().rev() {
        let step = stream.shim_answers();
        let step = if n < 25 { step.resumes() } else { step.sends(429) };
        step.done();
        stream.completes().done();
    }
    let mut redis = backend.redis.connection().expect("connecting to Redis");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut redis).expect("KEYS");
    assert_eq!(keys.len(), 2, "one key per window: {keys:?}");
    for key in keys {
        let entries: u64 = redis::cmd("ZCARD").arg(&key).query(&mut redis).expect("ZCARD");
        assert_eq!(entries, 25, "ZCARD {key}: only admitted requests are charged");
    }
}
