//! Shadow policies never refuse: the real `dist/sluice.wasm` in the wasm
//! host, with a scripted shim.

use sluice_wasm_host::{Answer, Plugin, Route};

const SHIM: &str = "sluice_shim";

/// Regression (issue item 4, a shadow policy could refuse real traffic): a
/// shadow policy with `on_missing_key: deny` and a request without its key.
/// Before, the filter answered 400; now the request goes on to the enforced
/// policy, the shadow policy counts a `shadow_denied`, and the response says
/// `x-sluice-shadow: would-deny; policy="trial"`. With no enforced policy at
/// all the request passes without a call, marked the same way.
#[test]
fn a_shadow_policy_missing_key_never_answers_400() {
    let doc = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 100}, "shadow_header": true,
        "policies": [
          {"name": "enforced", "match": {"path_prefix": "/both/"}, "limits": [{"type": "interval", "every": "1ms"}]},
          {"name": "trial", "shadow": true, "key": ["header:x-api-key"], "on_missing_key": "deny",
           "limits": [{"type": "interval", "every": "1s"}]}]}"#;
    let plugin = Plugin::configured(doc, SHIM, Route::Scripted);
    let note = r#"would-deny; policy="trial""#;

    let stream = plugin.stream();
    let headers: [(&str, &[u8]); 3] = [(":method", b"GET"), (":path", b"/both/a"), (":authority", b"api")];
    stream
        .request_headers(&headers)
        .calls_the_shim()
        .pauses()
        .increments_metric("sluice.trial.shadow_denied", 1)
        .done();
    stream.shim_replies(Answer::Allow).resumes().done();
    stream.upstream_responds(200).continues().done();
    let sent = plugin.proxy().response_headers_of(stream.id()).expect("open");
    assert_eq!(sent.get_str("x-sluice-shadow").as_deref(), Some(note));
    stream.completes().done();

    let stream = plugin.stream();
    let headers: [(&str, &[u8]); 3] = [(":method", b"GET"), (":path", b"/other"), (":authority", b"api")];
    stream.request_headers(&headers).continues().increments_metric("sluice.trial.shadow_denied", 1).done();
    stream.upstream_responds(200).continues().done();
    let sent = plugin.proxy().response_headers_of(stream.id()).expect("open");
    assert_eq!(sent.get_str("x-sluice-shadow").as_deref(), Some(note));
    stream.completes().done();
}
