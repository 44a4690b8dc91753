//! Points costs read by the real `dist/sluice.wasm` are clamped to the
//! capacity (`sluice_policies::cost`), with the real shim and Redis as the
//! judge (here 10 points refilled in 10 s: a second per point). Before, the
//! filter sent a request cost of `4294967295` as it was (denied for ever)
//! and an actual cost of `4294967295` too, which the shim charged: 136
//! years of lockout.

use redis::Commands;
use sluice_harness::Backend;
use sluice_wasm_host::{Answer, Plugin, Route, Stream};

const POLICY: &str = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 2000}, "failure_mode": "deny",
    "policies": [{"name": "gql", "key": ["header:x-api-key"],
                  "limits": [{"type": "points", "capacity": 10, "refill": "10s",
                              "cost": {"header": "x-cost", "default": 1}, "actual_cost_header": "x-actual"}]}]}"#;

fn pttl(backend: &Backend, who: &str) -> i64 {
    let key = format!("sluice:{{gql:{who}}}:gcra:1000000");
    backend.redis.connection().expect("redis").pttl(key).expect("PTTL")
}

/// A request of `who` costing `cost`, admitted.
fn admitted(plugin: &Plugin, who: &str, cost: &str) -> Stream {
    let stream = plugin.stream();
    let headers: [(&str, &[u8]); 5] = [
        (":method", b"POST"),
        (":path", b"/graphql"),
        (":authority", b"api"),
        ("x-api-key", who.as_bytes()),
        ("x-cost", cost.as_bytes()),
    ];
    stream.request_headers(&headers).calls_the_shim().pauses().done();
    stream.shim_answers().resumes().done();
    stream
}

/// A request cost of `u32::MAX` counts as the capacity: it passes the full
/// bucket and empties it, so the key's TTL is one refill (plus a second).
#[test]
fn a_hostile_request_cost_counts_as_the_capacity() {
    let backend = Backend::start().expect("starting redis-server and the shim");
    let plugin = Plugin::configured(POLICY, "sluice_shim", Route::Shim { port: backend.shim.port });
    let stream = admitted(&plugin, "alice", " 4294967295 ");
    let ttl = pttl(&backend, "alice");
    assert!((9_000..=11_000).contains(&ttl), "PTTL {ttl}");
    stream.upstream_responds(200).continues().done();
    stream.completes().done();
}

/// An actual cost of `u32::MAX`, or beyond any integer, charges the
/// capacity and no more: the key's TTL is one refill, not 136 years.
#[test]
fn a_hostile_actual_cost_charges_at_most_the_capacity() {
    let backend = Backend::start().expect("starting redis-server and the shim");
    let plugin = Plugin::configured(POLICY, "sluice_shim", Route::Shim { port: backend.shim.port });
    for (who, actual) in [("bob", "4294967295"), ("carol", "99999999999999999999")] {
        let stream = admitted(&plugin, who, "1");
        let ttl = pttl(&backend, who);
        assert!((1..=2_000).contains(&ttl), "{who}: one point charged, PTTL {ttl}");
        stream.upstream_responds_with(200, &[("x-actual", actual)]).continues().wakes_the_root().done();
        stream.completes().done();
        plugin.root_wakes().adjusts_points().done();
        plugin.shim_answers_background_call(Answer::Real).done();
        let ttl = pttl(&backend, who);
        assert!((9_000..=11_000).contains(&ttl), "{who}: actual {actual}: PTTL {ttl}");
    }
}
