//! Scenario 3, concurrency leases: the real `dist/sluice.wasm` in the wasm
//! host, the real shim and a real redis-server. A lease is taken when the
//! request is admitted and released exactly once when its stream ends (the
//! stream queues the release and the root context sends it on its next tick,
//! so the stream's end does not cancel it), after a normal response, an
//! upstream error, a client reset, or a reset while the check is in flight.
//! Redis is the judge: the lease set shows what is held.

use sluice_tests::host::{Answer, Plugin, Route, Stream};
use sluice_tests::Backend;

const SHIM: &str = "sluice_shim";
const POLICY: &str = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 2000}, "failure_mode": "deny",
    "policies": [{"name": "uploads", "key": ["header:x-api-key"],
                  "limits": [{"type": "concurrency", "limit": 2, "lease": "30s"}]}]}"#;

fn start() -> Backend {
    Backend::start().expect("starting redis-server and the shim")
}

fn plugin_of(backend: &Backend) -> Plugin {
    Plugin::configured(POLICY, SHIM, Route::Shim { port: backend.shim.port })
}

/// Leases held in Redis, over every key (this policy has only lease sets).
fn leases(backend: &Backend) -> u64 {
    let mut redis = backend.redis.connection().expect("connecting to Redis");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut redis).expect("KEYS");
    keys.iter().map(|key| redis::cmd("ZCARD").arg(key).query::<u64>(&mut redis).expect("ZCARD")).sum()
}

/// A request of alice's arrives; the filter asks the shim and waits.
fn asks(plugin: &Plugin) -> Stream {
    let stream = plugin.stream();
    let headers: [(&str, &[u8]); 4] =
        [(":method", b"PUT"), (":path", b"/upload"), (":authority", b"api"), ("x-api-key", b"alice")];
    stream.request_headers(&headers).calls_the_shim().pauses().done();
    stream
}

/// A request admitted with a lease.
fn admitted(backend: &Backend, plugin: &Plugin) -> Stream {
    let stream = asks(plugin);
    stream.shim_answers().resumes().done();
    assert!(leases(&backend) >= 1, "an admitted request holds a lease");
    stream
}

/// After a normal response the stream's end releases the lease, once: one
/// release call, and Redis holds no lease.
#[test]
fn a_lease_is_released_once_after_a_normal_response() {
    let backend = start();
    let plugin = plugin_of(&backend);
    let stream = admitted(&backend, &plugin);
    assert_eq!(leases(&backend), 1);
    stream.upstream_responds(200).continues().done();
    stream.completes().done();
    assert_eq!(leases(&backend), 1, "the release waits for the tick");
    plugin.tick().releases_the_lease().done();
    assert_eq!(leases(&backend), 0, "released");
    plugin.shim_answers_background_call(Answer::Real).done();
    plugin.tick().done();
}

/// After an upstream error (a 503) the lease is released once all the same.
#[test]
fn a_lease_is_released_once_after_an_upstream_error() {
    let backend = start();
    let plugin = plugin_of(&backend);
    let stream = admitted(&backend, &plugin);
    stream.upstream_responds(503).continues().done();
    stream.completes().done();
    plugin.tick().releases_the_lease().done();
    assert_eq!(leases(&backend), 0);
}

/// A client reset after admission releases the lease once.
#[test]
fn a_lease_is_released_once_after_a_client_reset() {
    let backend = start();
    let plugin = plugin_of(&backend);
    let stream = admitted(&backend, &plugin);
    stream.client_resets().done();
    plugin.tick().releases_the_lease().done();
    assert_eq!(leases(&backend), 0);
}

/// The limit holds while leases are held, and a released slot is reused:
/// two requests in flight, the third gets 429; once one ends, another is
/// admitted. A denied request takes no lease and releases nothing.
#[test]
fn the_limit_holds_while_leases_are_held_and_a_released_slot_is_reused() {
    let backend = start();
    let plugin = plugin_of(&backend);
    let (first, second) = (admitted(&backend, &plugin), admitted(&backend, &plugin));
    let third = asks(&plugin);
    third.shim_answers().sends(429).done();
    third.completes().done();
    assert_eq!(leases(&backend), 2);
    first.completes().done();
    plugin.tick().releases_the_lease().done();
    let fourth = admitted(&backend, &plugin);
    assert_eq!(leases(&backend), 2);
    second.completes().done();
    fourth.client_resets().done();
    plugin.tick().releases_the_lease().releases_the_lease().done();
    assert_eq!(leases(&backend), 0, "no lease leaks");
}

/// A client reset while the check is in flight: the shim has already taken
/// the lease, and Envoy cancels the call, so the filter never sees the
/// answer. It chose the lease id itself and sent it with the check, so it
/// releases the lease by that id on the next tick; nothing leaks. (Before,
/// the slot stayed taken until the lease expired.)
#[test]
fn a_reset_while_the_check_is_in_flight_leaks_no_lease() {
    let backend = start();
    let plugin = plugin_of(&backend);
    let stream = asks(&plugin);
    stream.client_resets().done();
    assert_eq!(leases(&backend), 1, "the shim took the lease before the reset");
    plugin.tick().releases_the_lease().done();
    assert_eq!(leases(&backend), 0, "the lease taken for a request that was reset is still held");
}
