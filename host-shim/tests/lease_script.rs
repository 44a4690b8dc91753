//! Leased mode's `/v1/lease` on a real Redis through the shim's `Limiter`:
//! what it grants, what it refuses, the TTL it leaves, and give-backs to a
//! window that has ended, which change nothing; for a bucket, its grants
//! charged at their period's end, its give-backs and the TTLs of its keys.

use std::time::Duration;

use redis::Commands;
use sluice_harness::Redis;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{GiveBack, LeaseCall, LeaseRequest, LeaseResponse, WireLimit};
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
        ttl_ms: None,
        now_us: Some(Micros(now_us)),
        call: None,
    }
}

fn window(limit: u32) -> WireLimit {
    WireLimit::FixedWindow { limit, window_ms: Millis(WINDOW_MS), cost: 1 }
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
    let before = Some(GiveBack { window: index - 1, tokens: 10, charged: None });
    assert_eq!(lease(&limiter, request(window(10), 0, before, T0 + 3)).await.expect("lease").remaining, 0);
    let back = Some(GiveBack { window: index, tokens: 3, charged: None });
    assert_eq!(lease(&limiter, request(window(10), 0, back, T0 + 4)).await.expect("lease").remaining, 3);
    let too_much = Some(GiveBack { window: index, tokens: 10, charged: None });
    assert_eq!(lease(&limiter, request(window(10), 0, too_much, T0 + 5)).await.expect("lease").remaining, 10);

    // At the window's end, the next window's tokens.
    let next = T0 + WINDOW_MS * 1000;
    let got = lease(&limiter, request(window(10), 2, None, next)).await.expect("lease");
    assert_eq!((got.granted, got.window, got.remaining), (2, index + 1, 8));

    // Refused: another limit type, more than the limit, a bad name or key.
    let sliding = WireLimit::SlidingWindow { limit: 10, window_ms: Millis(1_000), approximate: false };
    assert_eq!(
        refused(lease(&limiter, request(sliding, 1, None, T0)).await),
        "limit: only a fixed_window, token_bucket or leaky_bucket is leased"
    );
    assert!(refused(lease(&limiter, request(window(10), 11, None, T0)).await).starts_with("want: 11"));
    let mut bad = request(window(10), 1, None, T0);
    bad.policy = "a b".into();
    assert!(refused(lease(&limiter, bad).await).contains("invalid policy name"));
    let mut bad = request(window(10), 1, None, T0);
    bad.key = "{x}".into();
    assert_eq!(refused(lease(&limiter, bad).await), "not an encoded key");
}

/// Lost answers on a real Redis: a call sent again with the same id gets
/// the grant it had and the window is charged once (its give-back taken
/// once); a late run of an older call grants and gives back nothing; the
/// calls' record is one field per gateway and lives no longer than the window.
#[tokio::test]
async fn a_call_sent_again_is_charged_once() {
    let redis = Redis::start().expect("redis");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter");
    let index = T0 / (WINDOW_MS * 1000);
    let with_id = |want, back, now, seq| LeaseRequest {
        call: Some(LeaseCall { gateway: 7, seq }),
        ..request(window(10), want, back, now)
    };

    let first = lease(&limiter, with_id(4, None, T0, 1)).await.expect("lease");
    assert_eq!((first.granted, first.remaining), (4, 6));
    // Its answer was lost: sent again, the same grant, charged once.
    let again = lease(&limiter, with_id(4, None, T0 + 100, 1)).await.expect("lease");
    assert_eq!((again.granted, again.window, again.remaining), (4, index, 6));
    assert_eq!(again.expires_in_ms, Millis(WINDOW_MS - 1), "to the same window's end, from now");
    // The next call gives 3 back and asks for 2; sent twice, counted once.
    let back = Some(GiveBack { window: index, tokens: 3, charged: None });
    let next = lease(&limiter, with_id(2, back, T0 + 200, 2)).await.expect("lease");
    assert_eq!((next.granted, next.remaining), (2, 7));
    let twice = lease(&limiter, with_id(2, back, T0 + 300, 2)).await.expect("lease");
    assert_eq!((twice.granted, twice.remaining), (2, 7), "the give-back is taken once too");
    // The first call, run late after the second: nothing.
    let late = lease(&limiter, with_id(4, None, T0 + 400, 1)).await.expect("lease");
    assert_eq!(late.granted, 0);
    let mut conn = redis.connection().expect("connection");
    let count: u64 = conn.hget(KEY, "n").expect("HGET");
    assert_eq!(count, 3, "4 granted, 3 back, 2 granted");
    let record: Vec<(String, String)> = conn.hgetall(format!("{KEY}:l")).expect("HGETALL");
    assert_eq!(record, vec![("7".to_string(), format!("2 {index} 2"))]);
    let ttl: i64 = conn.pttl(format!("{KEY}:l")).expect("PTTL");
    assert!((1..=(WINDOW_MS as i64) + 1_000).contains(&ttl), "TTL {ttl} ms");
    // A call without an id still works as before, and leaves no record of its own.
    let plain = lease(&limiter, request(window(10), 1, None, T0 + 500)).await.expect("lease");
    assert_eq!(plain.granted, 1);
}

/// A bucket of 10 tokens, one every 100 ms, leased in periods of 1 s.
#[tokio::test]
async fn a_bucket_is_leased_by_periods() {
    let redis = Redis::start().expect("redis");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter");
    let bucket = WireLimit::TokenBucket { rate: 10, per_ms: Millis(1_000), burst: 10 };
    let key = "sluice:{p:}:gcra:100000";
    let with = |want, back, now, seq| LeaseRequest {
        ttl_ms: Some(Millis(1_000)),
        call: Some(LeaseCall { gateway: 3, seq }),
        ..request(bucket, want, back, now)
    };
    let period = T0 / 1_000_000;

    // Six of ten, charged at the period's end; the rest, then nothing.
    let got = lease(&limiter, with(6, None, T0 + 200_000, 1)).await.expect("lease");
    assert_eq!(got, LeaseResponse { granted: 6, window: period, expires_in_ms: Millis(800), remaining: 0 });
    let mut conn = redis.connection().expect("connection");
    let tat: u64 = conn.get(key).expect("GET");
    assert_eq!(tat, T0 + 1_000_000 + 600_000, "six tokens from the period's end");
    // The bucket holds 10 - 6 = 4 at the grant, but its tat is 1.6 s ahead
    // of 0.2 s: the exact path sees none left until its charges pass.
    let got = lease(&limiter, with(6, None, T0 + 300_000, 2)).await.expect("lease");
    assert_eq!(got.granted, 0, "the charge at the end holds the tokens from now");
    // The keys live no longer than their charges and a second; the calls'
    // record a period beyond the one it ran in.
    let ttl: i64 = conn.pttl(key).expect("PTTL");
    assert!((1..=1_400 + 1_000).contains(&ttl), "tat TTL {ttl} ms");
    let ttl: i64 = conn.pttl(format!("{key}:h")).expect("PTTL");
    assert!((1..=800 + 1_000).contains(&ttl), "horizon TTL {ttl} ms");
    let ttl: i64 = conn.pttl(format!("{key}:l")).expect("PTTL");
    assert!((1_000..=1_700 + 1_000).contains(&ttl), "record TTL {ttl} ms");

    // At the period's end, 2 unspent of the 6 charged come back at once.
    let back = Some(GiveBack { window: period, tokens: 2, charged: Some(6) });
    let got = lease(&limiter, with(0, back, T0 + 1_000_000, 3)).await.expect("lease");
    let tat: u64 = conn.get(key).expect("GET");
    assert_eq!(tat, T0 + 1_000_000 + 400_000);
    assert_eq!((got.granted, got.window), (0, period + 1));
    // Sent again (its answer lost): the give-back is taken once.
    lease(&limiter, with(0, back, T0 + 1_000_000, 3)).await.expect("lease");
    assert_eq!(conn.get::<_, u64>(key).expect("GET"), T0 + 1_000_000 + 400_000);

    // Refused: no period, more than the burst.
    let mut bad = with(1, None, T0, 4);
    bad.ttl_ms = None;
    assert_eq!(
        refused(lease(&limiter, bad).await),
        "ttl_ms: a bucket's lease needs its period, the policy's `leased.ttl`"
    );
    assert!(refused(lease(&limiter, with(11, None, T0, 4)).await).starts_with("want: 11"));
}
