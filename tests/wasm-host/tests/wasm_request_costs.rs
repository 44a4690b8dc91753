//! The host calls one request costs the real `dist/sluice.wasm`, counted
//! by the host (`sluice_wasm_host::costs`): counts, never timings. Each test
//! pins a cut that `benches/filter.rs` measured, so it cannot grow back
//! unnoticed; the figures are in `bench/README.md` ("The filter's cost per
//! request").

use sluice_wasm_host::shapes::{measure, Shape};
use sluice_wasm_host::Costs;

const N: u64 = 20;

fn per_request(shape: Shape) -> Costs {
    let costs = measure(shape, N).unwrap_or_else(|err| panic!("{shape:?}: {err:#}"));
    for (name, n) in &costs.calls {
        assert_eq!(n % N, 0, "{shape:?}: {name} is not the same for every request: {n} in {N}");
    }
    costs
}

fn calls(costs: &Costs, name: &str) -> u64 {
    costs.calls_of(name) / N
}

/// Each request header is read from the host once per request, however
/// many policies, conditions and keys read it (before: once per read, so a
/// header in a condition and a key was read twice), and one nothing reads
/// is never read (before: `:authority` always was). The three policies read
/// `:path`, `:method`, `x-api-key` and `x-tenant` (twice: a condition and a
/// key); the shim's answer adds its `:status`.
#[test]
fn each_request_header_is_read_once() {
    assert_eq!(calls(&per_request(Shape::ThreePolicies), "proxy_get_header_map_value"), 5);
    assert_eq!(calls(&per_request(Shape::Allow), "proxy_get_header_map_value"), 4);
    assert_eq!(calls(&per_request(Shape::NoMatch), "proxy_get_header_map_value"), 1, "the path alone");
}

/// The clock is read once per callback that needs it: never for a request
/// no policy matches, nor at a stream's end without a lease (before: twice
/// at every stream's end), and once when the shim answers (before: three
/// times).
#[test]
fn the_clock_is_read_once_per_callback_that_needs_it() {
    let clock = "proxy_get_current_time_nanoseconds";
    assert_eq!(calls(&per_request(Shape::NoMatch), clock), 0);
    assert_eq!(calls(&per_request(Shape::CachedDeny), clock), 1);
    assert_eq!(calls(&per_request(Shape::Allow), clock), 2);
    assert_eq!(calls(&per_request(Shape::ThreePolicies), clock), 2);
}

/// A denial from the over-limit cache asks the shim nothing: the denial
/// and its counter. Within one tick it reads no shared data either: the
/// worker's copy of the entry serves it (before: one read per request;
/// `tests/wasm_deny_floor.rs` shows the one read per tick).
#[test]
fn a_cached_denial_is_the_reply_and_no_shared_data_read_within_a_tick() {
    let costs = per_request(Shape::CachedDeny);
    assert_eq!(calls(&costs, "proxy_http_call"), 0);
    assert_eq!(calls(&costs, "proxy_get_shared_data"), 0);
    assert_eq!(calls(&costs, "proxy_send_local_response"), 1);
    assert_eq!(calls(&costs, "proxy_increment_metric"), 1);
    assert_eq!(costs.host_calls() / N, 6);
}

/// A request no policy matches costs one host call: its path.
#[test]
fn a_request_no_policy_matches_costs_one_host_call() {
    assert_eq!(per_request(Shape::NoMatch).host_calls() / N, 1);
}
