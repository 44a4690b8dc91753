//! Leased mode's `/v1/lease` on a real Redis through the shim's `Limiter`:
//! what it grants, what it refuses, the TTL it leaves, and give-backs to a
//! window that has ended, which change nothing.

use std::time::Duration;

use redis::Commands;
use sluice_harness::Redis;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{GiveBack, LeaseRequest, LeaseResponse, WireLimit};
use sluice_shim::limiter::{CheckError, Limiter};
use sluice_shim::store::Target;

const WINDOW_MS: u64 = 10_000;
const KEY: &str = "sluice:{p:}:fw:10000";
/// The start of a window.
const T0: u64 = 1_700_000_000_000_000;

fn request(limit: WireLimit, want: u32, give_back: Option<GiveBack>, now_us: u64) -> LeaseRequest {
    LeaseRequest {
        policy: "p".into(),
        key: String::new(),
        limit,
        want,
        give_back,
        now_us: Some(Micros(now_us)),
    }
}

fn window(limit: u32) -> WireLimit {
    WireLimit::FixedWindow { limit, window_ms: Millis(WINDOW_MS) }
}

async fn lease(limiter: &Limiter, req: LeaseRequest) -> Result<LeaseResponse, CheckError> {
    limiter.lease(&req).await
}

fn refused(result: Result<LeaseResponse, CheckError>) -> String {
    match result {
        Err(CheckError::BadRequest(reason)) => reason,
        other => panic!("expected a 400, got {other:?}"),
    }
}

#[tokio::test]
async fn grants_give_backs_and_refusals() {
    let redis = Redis::start().expect("redis");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter");
    let index = T0 / (WINDOW_MS * 1000);

    // Up to `want`, then what is left, then nothing.
    let got = lease(&limiter, request(window(10), 6, None, T0)).await.expect("lease");
    assert_eq!(
        got,
        LeaseResponse { granted: 6, window: index, expires_in_ms: Millis(WINDOW_MS), remaining: 4 }
    );
    let got = lease(&limiter, request(window(10), 6, None, T0 + 1)).await.expect("lease");
    assert_eq!(
        (got.granted, got.remaining, got.expires_in_ms),
        (4, 0, Millis(WINDOW_MS - 1)),
        "rounded down"
    );
    let got = lease(&limiter, request(window(10), 6, None, T0 + 2)).await.expect("lease");
    assert_eq!(got.granted, 0);

    // The key lives no longer than its window and a second.
    let mut conn = redis.connection().expect("connection");
    let ttl: i64 = conn.pttl(KEY).expect("PTTL");
    assert!((1..=(WINDOW_MS as i64) + 1_000).contains(&ttl), "TTL {ttl} ms");

    // A give-back to the window before does nothing to this one; one to
    // this window comes back, the count never below 0. (The shim cannot
    // tell what a gateway holds: it trusts its gateways' give-backs as it
    // trusts their releases; mutual TLS keeps others out.)
    let before = Some(GiveBack { window: index - 1, tokens: 10 });
    assert_eq!(lease(&limiter, request(window(10), 0, before, T0 + 3)).await.expect("lease").remaining, 0);
    let back = Some(GiveBack { window: index, tokens: 3 });
    assert_eq!(lease(&limiter, request(window(10), 0, back, T0 + 4)).await.expect("lease").remaining, 3);
    let too_much = Some(GiveBack { window: index, tokens: 10 });
    assert_eq!(lease(&limiter, request(window(10), 0, too_much, T0 + 5)).await.expect("lease").remaining, 10);

    // At the window's end, the next window's tokens.
    let next = T0 + WINDOW_MS * 1000;
    let got = lease(&limiter, request(window(10), 2, None, next)).await.expect("lease");
    assert_eq!((got.granted, got.window, got.remaining), (2, index + 1, 8));

    // Refused: another limit type, more than the limit, a bad name or key.
    let bucket = WireLimit::TokenBucket { rate: 1, per_ms: Millis(1_000), burst: 5 };
    assert_eq!(
        refused(lease(&limiter, request(bucket, 1, None, T0)).await),
        "limit: only a fixed_window is leased"
    );
    assert!(refused(lease(&limiter, request(window(10), 11, None, T0)).await).starts_with("want: 11"));
    let mut bad = request(window(10), 1, None, T0);
    bad.policy = "a b".into();
    assert!(refused(lease(&limiter, bad).await).contains("invalid policy name"));
    let mut bad = request(window(10), 1, None, T0);
    bad.key = "{x}".into();
    assert_eq!(refused(lease(&limiter, bad).await), "not an encoded key");
}
