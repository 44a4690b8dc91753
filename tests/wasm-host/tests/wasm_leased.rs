//! Leased mode in the real `dist/sluice.wasm`, asking the real shim and
//! Redis: requests spend the pool in shared data with no call, the root
//! context asks for the next lease on its tick, a request that finds the
//! pool empty is checked exactly, and the window admits exactly its limit;
//! a leased bucket admits exactly its burst, and gives back the tokens left
//! at its period's end.

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

/// A request that finds the pool empty, admitted by the shim.
fn admitted_exactly(plugin: &Plugin) {
    let stream = checked(plugin);
    stream.shim_answers().resumes().done();
    stream.completes().done();
}

/// One exact check, two leases of 4, one exact check: 10 admitted, the
/// 11th refused by the shim; the leased ones made no call.
#[test]
fn the_pool_is_spent_locally_and_the_window_stays_exact() {
    let (_backend, plugin) = start();
    admitted_exactly(&plugin);

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
    admitted_exactly(&plugin);
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

/// A bucket of 10 a day (one token every 2.4 h), leased 4 at a time in
/// hour-long periods, with `RateLimit` headers on every admission. Over the
/// seconds the test lasts the bucket refills nothing, so it admits exactly
/// its burst. The first exact check's charge already reaches beyond any
/// period's end, so the leases' charge at their period's end costs nothing
/// here and every count is the same wherever in its hour the shim's clock is.
const BUCKET: &str = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 2000}, "failure_mode": "deny",
    "headers": "always",
    "policies": [{"name": "ingress", "match": {"path_prefix": "/api/"},
                  "leased": {"tokens": 4, "ttl": "1h"},
                  "limits": [{"type": "token_bucket", "rate": 10, "per": "1d", "burst": 10}]}]}"#;

/// One exact check, six tokens spent of two leases of 4, the two left
/// given back at the period's end, then exact checks: 10 admitted in all,
/// the 11th refused; the leased ones made no call and carried `RateLimit`
/// headers from the pool.
#[test]
fn a_bucket_is_spent_locally_and_given_back_at_its_periods_end() {
    inside_one_period(3_600);
    let backend = Backend::start().expect("starting redis-server and the shim");
    let plugin = Plugin::configured(BUCKET, SHIM, Route::Shim { port: backend.shim.port });
    admitted_exactly(&plugin);

    plugin.tick().asks_for_a_lease().done();
    plugin
        .shim_answers_background_call(Answer::Real)
        .increments_metric("sluice.ingress.lease_granted", 4)
        .done();
    // From the pool, with the pool's view: 3 held after this one, plus what
    // the bucket had left at the grant (10 - 1 - 4 = 5).
    let stream = plugin.stream();
    stream.request_headers(&GET).continues().increments_metric("sluice.ingress.leased", 1).done();
    stream.upstream_responds(200).continues().done();
    let headers = plugin.proxy().response_headers_of(stream.id()).expect("an open stream");
    assert_eq!(headers.get_str("ratelimit-policy").as_deref(), Some(r#""ingress";q=10;w=86400"#));
    let ratelimit = headers.get_str("ratelimit").expect("a RateLimit header");
    let t: u64 =
        ratelimit.strip_prefix(r#""ingress";r=8;t="#).and_then(|t| t.parse().ok()).expect(&ratelimit);
    assert!((1..=3_600).contains(&t), "to the period's end, at most an hour: {ratelimit}");
    stream.completes().done();
    spends(&plugin);
    plugin.tick().asks_for_a_lease().done();
    spends(&plugin);
    plugin
        .shim_answers_background_call(Answer::Real)
        .increments_metric("sluice.ingress.lease_granted", 4)
        .done();
    for _ in 0..3 {
        spends(&plugin);
    }
    // The period ends (the gateway's clock): the two tokens left are dead,
    // and the next tick gives them back; nobody asked since, so it asks for none.
    plugin.proxy().advance(std::time::Duration::from_secs(3_601));
    plugin.tick().asks_for_a_lease().done();
    plugin
        .shim_answers_background_call(Answer::Real)
        .increments_metric("sluice.ingress.lease_granted", 0)
        .done();
    assert_eq!(plugin.proxy().metric("sluice.ingress.lease_given_back"), Some(2));
    // 1 checked + 6 leased; the two given back and the one never leased
    // are left, for exact checks.
    for _ in 0..3 {
        admitted_exactly(&plugin);
    }
    let over = checked(&plugin);
    over.shim_answers().sends(429).done();
    over.completes().done();
    assert_eq!(plugin.proxy().metric("sluice.ingress.leased"), Some(6));
    assert_eq!(plugin.proxy().metric("sluice.ingress.allowed"), Some(10));
}

/// Lease periods are aligned to the epoch on the shim's clock (the real
/// one; the host's is its own): starts at least a minute before the end of
/// a period `secs` long, waiting for the next one if need be, so that no
/// lease of the test belongs to another period.
fn inside_one_period(secs: u64) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    let left = secs - now.as_secs() % secs;
    if left < 60 {
        std::thread::sleep(std::time::Duration::from_secs(left + 1));
    }
}
