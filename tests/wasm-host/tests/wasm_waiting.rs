//! Egress waiting, the filter's part: the real `dist/sluice.wasm` in the wasm
//! host, with a scripted shim, so each answer (held, refused, never) is
//! exact. The filter asks the shim to hold a request for the shortest
//! `wait.timeout` of its enforced policies (none if one of them has no
//! `wait`), gives the call that much more time, marks a held request's
//! response with `server-timing`, answers a refusal with the exact
//! `retry-after`, never serves a waiting policy from the over-limit cache,
//! never lets a shadow call wait, and counts each outcome.

use serde_json::{json, Value};
use sluice_policies::wire::CHECK_PATH;
use sluice_wasm_host::{Answer, Effect, HttpCall, MetricChange, Outcome, Plugin, Route, Stream};

const SHIM: &str = "sluice_shim";

/// A document of these policies, with a 100 ms shim timeout.
fn document(policies: &[&str]) -> String {
    format!(
        r#"{{"shim": {{"cluster": "sluice_shim", "timeout_ms": 100}}, "shadow_header": true,
            "policies": [{}]}}"#,
        policies.join(",")
    )
}

/// One call per 100 ms to the partner, held up to 2 s with a 5 ms margin.
const PARTNER: &str = r#"{"name": "partner", "wait": {"timeout": "2s", "margin": "5ms"},
    "limits": [{"type": "interval", "every": "100ms"}]}"#;

fn plugin(policies: &[&str]) -> Plugin {
    Plugin::configured(&document(policies), SHIM, Route::Scripted)
}

/// A request arrives and the filter sends its check (or checks); their calls.
fn asks(plugin: &Plugin) -> (Stream, Vec<HttpCall>) {
    let stream = plugin.stream();
    let headers: [(&str, &[u8]); 3] =
        [(":method", b"GET"), (":path", b"/v1/items"), (":authority", b"partner")];
    let outcome = stream.request_headers(&headers).calls_the_shim().pauses().done();
    (stream, checks(&outcome))
}

fn checks(outcome: &Outcome) -> Vec<HttpCall> {
    let calls = outcome.effects.iter().filter_map(|e| match e {
        Effect::HttpCall(call) if call.headers.get(":path") == Some(CHECK_PATH.as_bytes()) => {
            Some(call.clone())
        }
        _ => None,
    });
    calls.collect()
}

fn body(call: &HttpCall) -> Value {
    call.json_body().expect("a readable check")
}

/// What the histogram `name` recorded during a step.
fn recorded(outcome: &Outcome, name: &str) -> Vec<u64> {
    let records = outcome.effects.iter().filter_map(|e| match e {
        Effect::Metric { name: n, change: MetricChange::Record(v) } if n == name => Some(*v),
        _ => None,
    });
    records.collect()
}

/// A waiting request's check asks the shim to hold it for the policy's
/// timeout, carries the policy's margin, and may take the shim timeout on
/// top of the hold.
#[test]
fn a_waiting_check_carries_its_wait_and_margin_and_a_longer_timeout() {
    let plugin = plugin(&[PARTNER]);
    let (stream, calls) = asks(&plugin);
    let check = body(&calls[0]);
    assert_eq!(check["wait_ms"], json!(2000));
    assert_eq!(check["checks"][0]["margin_ms"], json!(5));
    assert_eq!(calls[0].timeout_ms, 2100, "the shim timeout on top of the wait");
    stream.shim_replies(Answer::Allow).resumes().done();
}

/// A held request that passes gets `server-timing: sluice;dur=<ms held>`,
/// after the upstream's own metrics, and counts as `waited`.
#[test]
fn a_held_request_passes_with_server_timing() {
    let plugin = plugin(&[PARTNER]);
    let (stream, _) = asks(&plugin);
    let outcome = stream
        .shim_replies(Answer::Held { waited_ms: 1500 })
        .resumes()
        .increments_metric("sluice.partner.waited", 1)
        .done();
    assert_eq!(recorded(&outcome, "sluice.partner.wait_ms"), [1500]);
    stream.upstream_responds_with(200, &[("server-timing", "db;dur=53")]).continues().done();
    let headers = plugin.proxy().response_headers_of(stream.id()).expect("open");
    assert_eq!(headers.get_str("server-timing").as_deref(), Some("db;dur=53, sluice;dur=1500"));
    stream.completes().done();

    let (stream, _) = asks(&plugin);
    let outcome =
        stream.shim_replies(Answer::Allow).resumes().increments_metric("sluice.partner.immediate", 1).done();
    assert_eq!(recorded(&outcome, "sluice.partner.wait_ms"), [0]);
    stream.upstream_responds(200).continues().done();
    let headers = plugin.proxy().response_headers_of(stream.id()).expect("open");
    assert_eq!(headers.get_str("server-timing"), None, "not held, no server-timing");
}

/// A waiting request whose slot lies beyond its wait is refused at once with
/// the exact retry-after, counted as `wait_timeout`; the refusal is not
/// cached, so the next request asks the shim again.
#[test]
fn a_refused_waiting_request_gets_429_and_is_not_cached() {
    let plugin = plugin(&[PARTNER]);
    let (stream, _) = asks(&plugin);
    stream
        .shim_replies(Answer::Deny { retry_after_ms: 4200 })
        .sends(429)
        .with_header("retry-after", "5")
        .increments_metric("sluice.partner.wait_timeout", 1)
        .done();
    stream.completes().done();
    let (stream, _) = asks(&plugin);
    stream.shim_replies(Answer::Allow).resumes().done();
}

/// The request waits for the shortest timeout of its enforced policies, and
/// not at all if one of them has no `wait`; a shadow call never waits.
#[test]
fn the_request_waits_for_its_shortest_timeout_and_shadow_never_waits() {
    let short =
        r#"{"name": "short", "wait": {"timeout": "300ms"}, "limits": [{"type": "interval", "every": "1s"}]}"#;
    let plugin_short = plugin(&[PARTNER, short]);
    let (stream, calls) = asks(&plugin_short);
    assert_eq!(body(&calls[0])["wait_ms"], json!(300));
    assert_eq!(
        body(&calls[0])["checks"][1]["margin_ms"],
        json!(sluice_policies::wait::DEFAULT_MARGIN_MS),
        "the default margin"
    );
    stream.shim_replies(Answer::Allow).resumes().done();

    let plain = r#"{"name": "plain", "limits": [{"type": "interval", "every": "1s"}]}"#;
    let plugin_plain = plugin(&[PARTNER, plain]);
    let (stream, calls) = asks(&plugin_plain);
    assert_eq!(body(&calls[0]).get("wait_ms"), None, "a policy without wait: decided now");
    assert_eq!(calls[0].timeout_ms, 100);
    stream.shim_replies(Answer::Allow).resumes().done();

    let shadow = r#"{"name": "trial", "shadow": true, "limits": [{"type": "interval", "every": "1s"}]}"#;
    let plugin_shadow = plugin(&[PARTNER, shadow]);
    let stream = plugin_shadow.stream();
    let headers: [(&str, &[u8]); 3] = [(":method", b"GET"), (":path", b"/"), (":authority", b"partner")];
    let outcome = stream.request_headers(&headers).calls_the_shim().calls_the_shim().pauses().done();
    let calls = checks(&outcome);
    assert_eq!(body(&calls[0])["wait_ms"], json!(2000));
    assert_eq!(body(&calls[1]).get("wait_ms"), None, "the shadow call never waits");
    assert_eq!(calls[1].timeout_ms, 100);
    stream.shim_replies(Answer::Allow).done();
    stream.shim_replies(Answer::Allow).resumes().done();
}

/// A stream that ends while its request is held counts as `wait_cancelled`
/// (Envoy cancels the call; the shim gives the slot back).
#[test]
fn a_stream_that_ends_while_held_counts_as_cancelled() {
    let plugin = plugin(&[PARTNER]);
    let (stream, _) = asks(&plugin);
    // The root is woken to send the cancel of the held call's slot.
    stream.client_resets().increments_metric("sluice.partner.wait_cancelled", 1).wakes_the_root().done();
}
