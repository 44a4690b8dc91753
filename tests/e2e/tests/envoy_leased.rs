//! Leased mode end to end: two Envoys (two workers each), one shim, one
//! Redis, one leased policy. Each Envoy's workers spend their leases
//! locally, yet the window's limit holds across both: bursts at both
//! gateways admit at most the limit together, most of it without a shim
//! call, and once idle leases have gone back, a drain admits exactly what
//! is left, so the two admitted exactly the limit in all. The same for a
//! leased token bucket, whose burst holds across both, and whose leased
//! admissions carry `RateLimit` headers from the pool.

use std::thread::sleep;
use std::time::{Duration, Instant};

use sluice_harness::client::count;
use sluice_harness::gateway::{prometheus, sample, send};
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

/// The policy's counter `name` at `envoy`.
fn stats(envoy: &Envoy, name: &str) -> f64 {
    let page = prometheus(envoy).expect("stats");
    sample(&page, &format!(r#"sluice_{name}{{policy="ingress"}}"#))
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

/// What two gateways admitted: A quiet (`quiet` admitted already), B
/// hammered past the limit (the burst), then, once idle leases (a
/// bucket's: a period's) have gone back, two drains at both.
struct Shared {
    burst: usize,
    /// The tokens A held unspent after the burst.
    held_by_a: f64,
    drained: usize,
    last: usize,
    total: usize,
}

fn hammer_and_drain(a: &Envoy, b: &Envoy, quiet: usize) -> Shared {
    let burst = quiet + admitted(&[b], 45, 10);
    let held_by_a = stats(a, "lease_granted") - stats(a, "leased") - stats(a, "lease_given_back");
    sleep(Duration::from_millis(2_200));
    let drained = admitted(&[b, a], 4, 20);
    sleep(Duration::from_millis(2_200));
    let last = admitted(&[a, b], 2, 20);
    Shared { burst, held_by_a, drained, last, total: burst + drained + last }
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
    let Shared { burst, held_by_a, drained, last, total } = hammer_and_drain(&a, &b, quiet);

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

/// A bucket of 400 refilling one token a minute, leased 20 at a time in
/// periods of 2 s, with `RateLimit` headers.
fn bucket_document() -> String {
    format!(
        r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "headers": "always",
            "policies": [{{"name": "ingress", "leased": {{"tokens": {TOKENS}, "ttl": "2s"}},
            "limits": [{{"type": "token_bucket", "rate": 1, "per": "1m", "burst": {LIMIT}}}]}}]}}"#
    )
}

/// Two gateways share one bucket exactly, spending it mostly from leases,
/// as [`two_gateways_share_one_leased_window`]: A takes a lease and goes
/// quiet; B is hammered past the burst; A's unspent tokens go back at
/// their period's end and a drain admits them. Never more than the burst
/// and the minutes' refill; at most the held tokens less (and a lease lost
/// to a period's end) before the drain, and at most a lease less after it.
#[test]
fn two_gateways_share_one_leased_bucket() {
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let upstream = Upstream::start().expect("upstream");
    let a = Envoy::start(&bucket_document(), shim.port, upstream.port).expect("envoy a");
    let b = Envoy::start(&bucket_document(), shim.port, upstream.port).expect("envoy b");
    // The most the bucket may admit from now on: its burst, and a token
    // for each minute begun since.
    let start = Instant::now();
    let most = || LIMIT + 1 + (start.elapsed().as_secs() / 60) as usize;

    let quiet = admitted(&[&a], 2, 5);
    // A leased admission: the pool's view, the bucket's policy.
    let reply = send(a.port, "GET", "/api/items", &[]).expect("request");
    let quiet = quiet + usize::from(reply.status == 200);
    assert_eq!(reply.header("ratelimit-policy"), Some(r#""ingress";q=400;w=24000"#), "{reply:?}");
    let ratelimit = reply.header("ratelimit").expect("a RateLimit header");
    let r: usize = ratelimit
        .strip_prefix(r#""ingress";r="#)
        .and_then(|rest| rest.split(';').next())
        .and_then(|r| r.parse().ok())
        .expect(ratelimit);
    assert!(r < LIMIT, "{ratelimit}");

    let Shared { burst, held_by_a, drained, last, total } = hammer_and_drain(&a, &b, quiet);

    let leased = [stats(&a, "leased"), stats(&b, "leased")];
    let given_back = [stats(&a, "lease_given_back"), stats(&b, "lease_given_back")];
    println!(
        "LEASED BUCKET burst {burst} (A held {held_by_a} unspent), drained {drained}, last {last}: {total} of \
         {LIMIT}; leased {leased:?}, given back {given_back:?}"
    );
    assert!(burst <= most(), "{burst} admitted over the bucket's {}", most());
    assert!(total <= most(), "{total} admitted over the bucket's {}", most());
    let bound = 2 * (TOKENS + TOKENS / 2) + TOKENS;
    assert!(burst >= LIMIT - bound, "{burst} admitted in the burst: more under-admitted than {bound}");
    assert!(given_back[0] > 0.0, "A gave its unspent tokens back");
    assert!(total >= LIMIT - TOKENS, "{total} admitted in all");
    let all_leased: f64 = leased.iter().sum();
    assert!(all_leased > total as f64 / 2.0, "most admissions came from leases: {all_leased} of {total}");
}
