//! Leased mode end to end: two Envoys (two workers each), one shim, one
//! Redis, one leased policy. Each Envoy's workers spend their leases
//! locally, yet the window's limit holds across both: bursts at both
//! gateways admit at most the limit together, most of it without a shim
//! call, and once idle leases have gone back, a drain admits exactly what
//! is left, so the two admitted exactly the limit in all.

use std::thread::sleep;
use std::time::Duration;

use sluice_harness::client::count;
use sluice_harness::gateway::{prometheus, sample};
use sluice_harness::{burst, Envoy, Redis, Shim, Upstream};

const LIMIT: usize = 400;
const TOKENS: usize = 20;

/// One window far longer than the test (aligned to the epoch, so a test
/// never straddles two), leased 20 tokens at a time, idle ones back after 2 s.
fn document() -> String {
    format!(
        r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "policies": [{{"name": "ingress",
            "leased": {{"tokens": {TOKENS}, "ttl": "2s"}},
            "limits": [{{"type": "fixed_window", "limit": {LIMIT}, "window": "365d"}}]}}]}}"#
    )
}

fn admitted(envoys: &[&Envoy], rounds: usize, each: usize) -> usize {
    let mut ok = 0;
    for _ in 0..rounds {
        for envoy in envoys {
            let replies = burst(envoy.port, "GET", "/api/items", None, each).expect("burst");
            assert_eq!(count(&replies, 200) + count(&replies, 429), each, "only 200 and 429: {replies:?}");
            ok += count(&replies, 200);
        }
        // A tick or two: the pools ask for their next leases.
        sleep(Duration::from_millis(40));
    }
    ok
}

/// Two gateways share one window exactly, spending it mostly from leases.
/// Gateway A takes a lease and goes quiet; B is hammered past the limit:
/// A's unspent tokens are the under-admission, within the bound, until A
/// gives them back after its ttl and B's drain admits them.
#[test]
fn two_gateways_share_one_leased_window() {
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let upstream = Upstream::start().expect("upstream");
    let a = Envoy::start(&document(), shim.port, upstream.port).expect("envoy a");
    let b = Envoy::start(&document(), shim.port, upstream.port).expect("envoy b");

    let quiet = admitted(&[&a], 2, 5);
    let hammered = admitted(&[&b], 45, 10);
    let burst = quiet + hammered;
    let stats = |envoy: &Envoy, name: &str| {
        let page = prometheus(envoy).expect("stats");
        sample(&page, &format!(r#"sluice_{name}{{policy="ingress"}}"#))
    };
    let held_by_a = stats(&a, "lease_granted") - stats(&a, "leased") - stats(&a, "lease_given_back");
    // Idle leases go back after their ttl; then drain what is left.
    sleep(Duration::from_millis(2_200));
    let drained = admitted(&[&b, &a], 4, 20);
    sleep(Duration::from_millis(2_200));
    let last = admitted(&[&a, &b], 2, 20);
    let total = burst + drained + last;

    let leased = [stats(&a, "leased"), stats(&b, "leased")];
    let empty = [stats(&a, "lease_empty"), stats(&b, "lease_empty")];
    let given_back = [stats(&a, "lease_given_back"), stats(&b, "lease_given_back")];
    println!(
        "LEASED burst {burst} (A held {held_by_a} unspent), drained {drained}, last {last}: {total} of {LIMIT}; \
         leased {leased:?}, found empty {empty:?}, given back {given_back:?}"
    );
    assert!(burst <= LIMIT, "{burst} admitted over the limit of {LIMIT}");
    assert!(total <= LIMIT, "{total} admitted over the limit of {LIMIT}");
    let bound = 2 * (TOKENS + TOKENS / 2);
    assert!(
        burst >= LIMIT - bound,
        "{burst} admitted in the burst: more under-admitted than the bound {bound}"
    );
    assert!(given_back[0] > 0.0, "A gave its idle tokens back");
    // Every token back and spent, unless a lease's answer was lost (one lease at most here).
    assert!(total >= LIMIT - TOKENS, "{total} admitted in all");
    for (gateway, n) in leased.iter().enumerate() {
        assert!(*n > 0.0, "gateway {gateway} spent no lease");
    }
    let all_leased: f64 = leased.iter().sum();
    assert!(all_leased > total as f64 / 2.0, "most admissions came from leases: {all_leased} of {total}");
}
