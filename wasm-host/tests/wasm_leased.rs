//! Leased mode in the real `dist/sluice.wasm`, asking the real shim and
//! Redis: requests spend the pool in shared data with no call, the root
//! context asks for the next lease on its tick, a request that finds the
//! pool empty is checked exactly, and the window admits exactly its limit.

use sluice_harness::Backend;
use sluice_wasm_host::{Answer, Plugin, Route, Stream};

const SHIM: &str = "sluice_shim";

/// A window of 10 an hour, spent from leases of 4 tokens.
const DOC: &str = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 2000}, "failure_mode": "deny",
    "policies": [{"name": "ingress", "match": {"path_prefix": "/api/"},
                  "leased": {"tokens": 4, "ttl": "1h"},
                  "limits": [{"type": "fixed_window", "limit": 10, "window": "1h"}]}]}"#;

const GET: [(&str, &[u8]); 3] = [(":method", b"GET"), (":path", b"/api/items"), (":authority", b"api")];

fn start() -> (Backend, Plugin) {
    let backend = Backend::start().expect("starting redis-server and the shim");
    let plugin = Plugin::configured(DOC, SHIM, Route::Shim { port: backend.shim.port });
    (backend, plugin)
}

/// A request admitted from the pool: no call, no pause.
fn spends(plugin: &Plugin) {
    let stream = plugin.stream();
    stream.request_headers(&GET).continues().increments_metric("sluice.ingress.leased", 1).done();
    stream.completes().done();
}

/// A request that finds the pool empty: the shim checks it exactly.
fn checked(plugin: &Plugin) -> Stream {
    let stream = plugin.stream();
    stream
        .request_headers(&GET)
        .calls_the_shim()
        .pauses()
        .increments_metric("sluice.ingress.lease_empty", 1)
        .done();
    stream
}

/// One exact check, two leases of 4, one exact check: 10 admitted, the
/// 11th refused by the shim; the leased ones made no call.
#[test]
fn the_pool_is_spent_locally_and_the_window_stays_exact() {
    let (_backend, plugin) = start();
    let first = checked(&plugin);
    first.shim_answers().resumes().done();
    first.completes().done();

    plugin.tick().asks_for_a_lease().done();
    plugin.tick().done();
    plugin
        .shim_answers_background_call(Answer::Real)
        .increments_metric("sluice.ingress.lease_granted", 4)
        .done();
    spends(&plugin);
    spends(&plugin);
    // Half a lease left: the next tick asks for the next one, off the request path.
    plugin.tick().asks_for_a_lease().done();
    spends(&plugin);
    plugin
        .shim_answers_background_call(Answer::Real)
        .increments_metric("sluice.ingress.lease_granted", 4)
        .done();
    for _ in 0..5 {
        spends(&plugin);
    }
    // 1 checked + 8 leased; the window has 1 left, for an exact check.
    let last = checked(&plugin);
    last.shim_answers().resumes().done();
    last.completes().done();
    let over = checked(&plugin);
    over.shim_answers().sends(429).done();
    over.completes().done();

    // The spent window grants nothing; the pool stays quiet for a second.
    plugin.tick().asks_for_a_lease().done();
    plugin
        .shim_answers_background_call(Answer::Real)
        .increments_metric("sluice.ingress.lease_granted", 0)
        .done();
    plugin.tick().done();
    assert_eq!(plugin.proxy().metric("sluice.ingress.leased"), Some(8));
    assert_eq!(plugin.proxy().metric("sluice.ingress.allowed"), Some(10));
}

/// Refused by another policy after its token was taken, a request puts
/// the token back: all or nothing, as across the limits of one call.
#[test]
fn a_refused_request_puts_its_token_back() {
    let doc = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 2000}, "failure_mode": "deny",
        "policies": [{"name": "ingress", "leased": {"tokens": 2},
                      "limits": [{"type": "fixed_window", "limit": 2, "window": "1h"}]},
                     {"name": "strict", "limits": [{"type": "fixed_window", "limit": 1, "window": "1h"}]}]}"#;
    let backend = Backend::start().expect("starting redis-server and the shim");
    let plugin = Plugin::configured(doc, SHIM, Route::Shim { port: backend.shim.port });
    let stream = plugin.stream();
    stream.request_headers(&GET).calls_the_shim().pauses().done();
    stream.shim_answers().resumes().done();
    stream.completes().done();
    plugin.tick().asks_for_a_lease().done();
    plugin
        .shim_answers_background_call(Answer::Real)
        .increments_metric("sluice.ingress.lease_granted", 1)
        .done();
    // The lease's token is taken, the strict policy refuses (the shim, then
    // the over-limit cache): the token goes back each time.
    let stream = plugin.stream();
    stream.request_headers(&GET).calls_the_shim().pauses().done();
    stream.shim_answers().sends(429).done();
    stream.completes().done();
    for _ in 0..2 {
        let stream = plugin.stream();
        stream
            .request_headers(&GET)
            .sends(429)
            .pauses()
            .increments_metric("sluice.strict.cache_denied", 1)
            .done();
        stream.completes().done();
    }
    assert_eq!(plugin.proxy().metric("sluice.ingress.leased"), Some(0));
    assert_eq!(plugin.proxy().metric("sluice.ingress.lease_empty"), Some(1), "only the first found it empty");
}
