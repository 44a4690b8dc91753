//! The wasm host's lifecycle, with the real `dist/sluice.wasm`: streams that
//! overlap, stream ends driven by the story (normal end, client reset), and
//! the host's own guarantees (a guest panic is a clear failure, a story that
//! is not played or meets an unexpected effect fails).
//! Scenario 3, leases released at these stream ends, is `wasm_concurrency.rs`.

use sluice_wasm_host::{Answer, End, HostConfig, Plugin, Proxy, Route, Stream};

const SHIM: &str = "sluice_shim";

const POLICY: &str = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 50}, "failure_mode": "deny",
    "policies": [{"name": "p", "match": {"path_prefix": "/v42/"}, "key": ["header:x-api-key"],
                  "limits": [{"type": "sliding_window", "limit": 5, "window": "1s"}]}]}"#;

fn get(stream: &Stream, path: &str) -> sluice_wasm_host::Step {
    let headers: [(&str, &[u8]); 4] =
        [(":method", b"GET"), (":path", path.as_bytes()), (":authority", b"api"), ("x-api-key", b"k")];
    stream.request_headers(&headers)
}

/// A request no policy matches continues at once, with no call to the shim.
#[test]
fn a_request_outside_every_policy_continues_without_a_call() {
    let plugin = Plugin::configured(POLICY, SHIM, Route::Scripted);
    let stream = plugin.stream();
    get(&stream, "/health").continues().done();
    stream.upstream_responds(200).continues().done();
    stream.completes().done();
}

/// Overlapping streams each get their own answer: answers delivered out of
/// order reach the stream that asked.
#[test]
fn overlapping_streams_get_their_own_answers() {
    let plugin = Plugin::configured(POLICY, SHIM, Route::Scripted);
    let (a, b) = (plugin.stream(), plugin.stream());
    get(&a, "/v42/a").calls_the_shim().pauses().done();
    get(&b, "/v42/b").calls_the_shim().pauses().done();
    b.shim_replies(Answer::Deny { retry_after_ms: 300 }).sends(429).with_header("retry-after", "1").done();
    a.shim_replies(Answer::Allow).resumes().done();
    b.completes().done();
    a.upstream_responds(200).continues().done();
    a.completes().done();
}

/// A client reset while the filter waits for the shim cancels the call (no
/// callback, as in Envoy) and ends the stream cleanly: `on_log`, `on_done`,
/// `on_delete` run without a crash, and the late answer has nowhere to go.
#[test]
fn a_client_reset_while_waiting_cancels_the_call() {
    let config = HostConfig::new(POLICY).cluster(SHIM, Route::Scripted);
    let mut proxy = Proxy::boot(config).expect("booting sluice.wasm");
    assert_eq!(proxy.configure().expect("configuring").returned, sluice_wasm_host::Returned::Bool(true));
    let id = proxy.open().expect("a stream");
    let headers = [(":method", "GET"), (":path", "/v42/a"), (":authority", "api")].into_iter().collect();
    proxy.request_headers(id, headers, true).expect("request headers");
    let token = *proxy.pending_calls(id).first().expect("a pending call");
    let ended = proxy.end(id, End::Reset).expect("the stream ends cleanly");
    assert!(ended.effects.is_empty(), "nothing to do at the end: {:?}", ended.effects);
    let late = proxy.deliver(token, Answer::Allow).expect_err("the call was cancelled");
    assert!(format!("{late:#}").contains("no http call"), "{late:#}");
}

/// A guest panic surfaces as a clear failure naming the callback and the
/// panic message, never as a hang; and the VM stays dead afterwards, as in
/// Envoy. (The SDK panics on a call response for a token it never issued.)
#[test]
fn a_guest_panic_is_a_clear_failure_and_kills_the_vm() {
    let config = HostConfig::new(POLICY).cluster(SHIM, Route::Scripted);
    let mut proxy = Proxy::boot(config).expect("booting sluice.wasm");
    proxy.configure().expect("configuring");
    let id = proxy.open().expect("a stream");
    let crash = proxy.deliver_unsolicited(id, 999).expect_err("the SDK panics on an unknown token");
    let message = format!("{crash:#}");
    assert!(message.contains("panicked in proxy_on_http_call_response"), "{message}");
    assert!(message.contains("invalid token_id"), "{message}");
    assert!(proxy.open().is_err(), "a crashed VM takes no more streams");
}

/// A step that is built but never played fails the test.
#[test]
#[should_panic(expected = "was never played")]
fn an_unplayed_step_fails_the_test() {
    let plugin = Plugin::configured(POLICY, SHIM, Route::Scripted);
    let _step = get(&plugin.stream(), "/v42/a").calls_the_shim().pauses();
}

/// An expectation the filter does not meet fails the test.
#[test]
#[should_panic(expected = "which did not happen")]
fn an_unmet_expectation_fails_the_test() {
    let plugin = Plugin::configured(POLICY, SHIM, Route::Scripted);
    get(&plugin.stream(), "/health").continues().calls_the_shim().done();
}

/// Something the filter does that the story does not mention fails the test.
#[test]
#[should_panic(expected = "unexpected: HttpCall")]
fn an_unexpected_effect_fails_the_test() {
    let plugin = Plugin::configured(POLICY, SHIM, Route::Scripted);
    get(&plugin.stream(), "/v42/a").pauses().done();
}
