//! Scenario 4, failure modes: the real `dist/sluice.wasm` in the wasm host,
//! with a shim that is down, too slow, or answers nonsense. With
//! `failure_mode: allow` the request is resumed; with `deny` it gets a 503.
//! Either way it is never left paused, and the filter says why in a warning.
//!
//! The faults are scripted (Envoy hands the filter a response with no headers
//! for a refused, reset or timed-out call), except the last tests, which route
//! to a real dead port and a real server that never answers.

use std::net::TcpListener;

use serde_json::json;
use sluice_harness::free_port;
use sluice_wasm_host::{Answer, Fault, Plugin, Route, Step, Stream};

const SHIM: &str = "sluice_shim";
const NO_RESPONSE: &str = "no response from the shim";
const MALFORMED: &str = "malformed shim answer";

fn policy(failure_mode: &str, cluster: &str) -> String {
    format!(
        r#"{{"shim": {{"cluster": "{cluster}", "timeout_ms": 50}}, "failure_mode": "{failure_mode}",
            "policies": [{{"name": "p", "key": ["header:x-api-key"],
                           "limits": [{{"type": "sliding_window", "limit": 5, "window": "1s"}}]}}]}}"#
    )
}

fn request(stream: &Stream) -> Step {
    let headers: [(&str, &[u8]); 4] =
        [(":method", b"GET"), (":path", b"/a"), (":authority", b"api"), ("x-api-key", b"k")];
    stream.request_headers(&headers)
}

/// What the filter does once the shim failed, by failure mode.
fn fails_over(step: Step, failure_mode: &str) {
    match failure_mode {
        "allow" => step.resumes().done(),
        _ => step.sends(503).with_json_body(json!({"error": "rate_limiter_unavailable"})).done(),
    };
}

/// The request asks the shim, gets `fault`, and fails over; then completes.
fn story(fault: Fault, failure_mode: &str, warning: &str) {
    let plugin = Plugin::configured(&policy(failure_mode, SHIM), SHIM, Route::Scripted);
    let stream = plugin.stream();
    request(&stream).calls_the_shim().pauses().done();
    fails_over(stream.shim_replies(Answer::Fault(fault)).warns(warning), failure_mode);
    stream.completes().done();
}

/// Shim down (connection refused), fail open: resumed.
#[test]
fn shim_down_allow_resumes() {
    story(Fault::Refused, "allow", NO_RESPONSE);
}

/// Shim down (connection refused), fail closed: 503.
#[test]
fn shim_down_deny_answers_503() {
    story(Fault::Refused, "deny", NO_RESPONSE);
}

/// Shim timeout, fail open: resumed.
#[test]
fn shim_timeout_allow_resumes() {
    story(Fault::Timeout, "allow", NO_RESPONSE);
}

/// Shim timeout, fail closed: 503.
#[test]
fn shim_timeout_deny_answers_503() {
    story(Fault::Timeout, "deny", NO_RESPONSE);
}

/// The shim answers 500, fail open: resumed.
#[test]
fn shim_500_allow_resumes() {
    story(Fault::ServerError, "allow", "shim answered 500");
}

/// The shim answers 500, fail closed: 503.
#[test]
fn shim_500_deny_answers_503() {
    story(Fault::ServerError, "deny", "shim answered 500");
}

/// A 200 whose body is not JSON, fail open: resumed.
#[test]
fn garbage_body_allow_resumes() {
    story(Fault::Garbage, "allow", MALFORMED);
}

/// A 200 whose body is not JSON, fail closed: 503.
#[test]
fn garbage_body_deny_answers_503() {
    story(Fault::Garbage, "deny", MALFORMED);
}

/// A 200 whose JSON is cut off half way, fail open: resumed.
#[test]
fn body_cut_short_allow_resumes() {
    story(Fault::CutShort, "allow", MALFORMED);
}

/// A 200 whose JSON is cut off half way, fail closed: 503.
#[test]
fn body_cut_short_deny_answers_503() {
    story(Fault::CutShort, "deny", MALFORMED);
}

/// A cluster Envoy does not know makes `dispatch_http_call` fail at once
/// (BadArgument): no call, and the failure mode decides in
/// `on_request_headers` itself.
#[test]
fn an_unknown_cluster_fails_over_at_once() {
    let plugin = Plugin::configured(&policy("allow", "no_such_cluster"), SHIM, Route::Scripted);
    request(&plugin.stream()).warns("cannot call cluster").continues().done();
    let plugin = Plugin::configured(&policy("deny", "no_such_cluster"), SHIM, Route::Scripted);
    let step = request(&plugin.stream()).warns("cannot call cluster").pauses();
    step.sends(503).done();
}

/// Over real TCP: nothing listens on the shim's port, the call fails, and
/// each failure mode holds.
#[test]
fn a_real_dead_port_fails_over() {
    let port = free_port().expect("a free port");
    for mode in ["allow", "deny"] {
        let plugin = Plugin::configured(&policy(mode, SHIM), SHIM, Route::Shim { port });
        let stream = plugin.stream();
        request(&stream).calls_the_shim().pauses().done();
        fails_over(stream.shim_answers().warns(NO_RESPONSE), mode);
    }
}

/// Over real TCP: the shim accepts the connection and never answers; the
/// call times out after `timeout_ms`, and each failure mode holds.
#[test]
fn a_real_silent_shim_times_out_and_fails_over() {
    let silent = TcpListener::bind("127.0.0.1:0").expect("binding a silent listener");
    let port = silent.local_addr().expect("its address").port();
    for mode in ["allow", "deny"] {
        let plugin = Plugin::configured(&policy(mode, SHIM), SHIM, Route::Shim { port });
        let stream = plugin.stream();
        request(&stream).calls_the_shim().pauses().done();
        fails_over(stream.shim_answers().warns(NO_RESPONSE), mode);
    }
}
