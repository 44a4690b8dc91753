//! Shared callouts in the real `dist/sluice.wasm`, asking the real shim on a
//! real redis-server: a lone request's check is sent at once; checks that
//! come while the worker's calls are out wait, go out together from the
//! root context in one batch, and that one answer resumes (or refuses) each
//! of their requests with its own decision. The story says when each answer
//! arrives, so the order is exact and nothing here is timed.

use sluice_harness::Backend;
use sluice_wasm_host::{Answer, Plugin, Route, Stream};

const SHIM: &str = "sluice_shim";

/// One policy keyed by `x-api-key`, 2 requests an hour; the worker keeps
/// `shared_calls` check calls out at most.
fn policy(shared_calls: u32) -> String {
    format!(
        r#"{{"shim": {{"cluster": "sluice_shim", "timeout_ms": 2000, "shared_calls": {shared_calls}}},
            "failure_mode": "deny",
            "policies": [{{"name": "partner-api", "key": ["header:x-api-key"],
                           "limits": [{{"type": "fixed_window", "limit": 2, "window": "1h"}}]}}]}}"#
    )
}

fn headers(key: &str) -> [(&str, &[u8]); 4] {
    [(":method", b"GET"), (":path", b"/orders"), (":authority", b"api"), ("x-api-key", key.as_bytes())]
}

fn configured(backend: &Backend, shared_calls: u32) -> Plugin {
    Plugin::configured(&policy(shared_calls), SHIM, Route::Shim { port: backend.shim.port })
}

/// A request whose check waits in the worker's queue: held, no call.
fn queued(plugin: &Plugin, key: &str) -> Stream {
    let stream = plugin.stream();
    stream.request_headers(&headers(key)).pauses().done();
    stream
}

/// With no call out, a request's check goes at once, from its own stream,
/// as a plain check: no wait for company.
#[test]
fn a_lone_request_is_sent_at_once() {
    let backend = Backend::start().expect("starting redis-server and the shim");
    let plugin = configured(&backend, 2);
    let stream = plugin.stream();
    stream.request_headers(&headers("alice")).calls_the_shim().pauses().done();
    stream.shim_answers().resumes().done();
    // A second lone request, after the first returned: at once again.
    let stream = plugin.stream();
    stream.request_headers(&headers("alice")).calls_the_shim().pauses().done();
    stream.shim_answers().resumes().done();
}

/// One call out (the most allowed): three more requests wait; when the call
/// returns, its stream wakes the root at once (the VM's wake-up queue, not
/// the next tick), the root sends their checks as one batch, and its one
/// answer resumes the two that fit and refuses the third (429), in order.
#[test]
fn one_batch_answer_resumes_each_of_its_requests() {
    let backend = Backend::start().expect("starting redis-server and the shim");
    let plugin = configured(&backend, 1);
    let first = plugin.stream();
    first.request_headers(&headers("bob")).calls_the_shim().pauses().done();
    let waiting: Vec<Stream> = ["alice", "alice", "alice"].iter().map(|k| queued(&plugin, k)).collect();
    for stream in &waiting {
        assert!(plugin.proxy().paused(stream.id()), "held while its check waits");
        assert!(plugin.proxy().pending_calls(stream.id()).is_empty(), "no call of its own");
    }

    first.shim_answers().resumes().wakes_the_root().done();
    plugin.root_wakes().calls_the_shim_with_a_batch().done();

    plugin.shim_answers_background_call(Answer::Real).resumes().resumes().sends(429).done();
    assert!(!plugin.proxy().paused(waiting[0].id()));
    assert!(!plugin.proxy().paused(waiting[1].id()));
    assert_eq!(plugin.proxy().answered(waiting[2].id()), Some(429), "the third is over the limit of 2");
    assert_eq!(plugin.proxy().answered(waiting[0].id()), None);
}

/// A stream that ends while its check waits leaves the queue: the batch
/// carries only the others, and the shim never counts it.
#[test]
fn a_stream_that_ends_while_queued_is_never_sent() {
    let backend = Backend::start().expect("starting redis-server and the shim");
    let plugin = configured(&backend, 1);
    let first = plugin.stream();
    first.request_headers(&headers("carol")).calls_the_shim().pauses().done();
    let gone = queued(&plugin, "dave");
    let kept = [queued(&plugin, "dave"), queued(&plugin, "dave")];
    gone.client_resets().done();

    first.shim_answers().resumes().wakes_the_root().done();
    plugin.root_wakes().calls_the_shim_with_a_batch().done();
    // Both fit the limit of 2: the one that left took nothing.
    plugin.shim_answers_background_call(Answer::Real).resumes().resumes().done();
    for stream in &kept {
        assert!(!plugin.proxy().paused(stream.id()));
    }
}

/// A request with an enforced and a shadow policy sends two checks, both
/// alone while calls are free: each counts as out until its own answer.
/// Regression: the stream kept only its last lone check, so the first one's
/// answer never freed its place; the worker's calls out leaked until every
/// check waited in the queue for a call that never returned.
#[test]
fn a_requests_enforced_and_shadow_checks_each_free_their_place() {
    let backend = Backend::start().expect("starting redis-server and the shim");
    let document = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 2000, "shared_calls": 2},
        "failure_mode": "deny",
        "policies": [
          {"name": "enforced", "key": ["header:x-api-key"],
           "limits": [{"type": "fixed_window", "limit": 100, "window": "1h"}]},
          {"name": "trial", "shadow": true, "key": ["header:x-api-key"],
           "limits": [{"type": "fixed_window", "limit": 100, "window": "1h"}]}]}"#;
    let plugin = Plugin::configured(document, SHIM, Route::Shim { port: backend.shim.port });
    for _ in 0..3 {
        let stream = plugin.stream();
        stream.request_headers(&headers("erin")).calls_the_shim().calls_the_shim().pauses().done();
        stream.shim_answers().done();
        stream.shim_answers().resumes().done();
        assert!(!plugin.proxy().paused(stream.id()));
    }
}
