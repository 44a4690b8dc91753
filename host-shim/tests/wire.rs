//! The two encodings of the check call, against the real shim on a real
//! Redis: the same check in JSON and in the binary wire is one decision on
//! one counter, each answered in its own encoding; the protocol version is
//! checked for both; a binary body cut short is refused, never misread.

use std::time::Duration;

use sluice_harness::Redis;
use sluice_policies::units::Millis;
use sluice_policies::wire::{
    Check, CheckRequest, CheckResponse, Encoding, WireLimit, CHECK_PATH, PROTOCOL_VERSION,
};
use sluice_shim::limiter::Limiter;
use sluice_shim::store::Target;
#[path = "support/raw_post.rs"]
mod raw_post;

/// A check on a fresh connection, speaking protocol `version`.
async fn post(port: u16, encoding: Encoding, version: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    raw_post::post(port, CHECK_PATH, encoding, version, body).await
}

#[tokio::test]
async fn a_check_is_answered_in_its_own_encoding_and_decided_once() {
    let redis = Redis::start().expect("redis");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = tokio::spawn(sluice_shim::server::run(
        listener,
        limiter,
        sluice_shim::server::Options::default(),
        std::future::pending(),
    ));
    let limit = WireLimit::FixedWindow { limit: 10, window_ms: Millis(3_600_000), cost: 1 };
    let checks = vec![Check {
        policy: "p".into(),
        key: "k".into(),
        limits: vec![limit],
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }];
    let check = CheckRequest {
        checks: checks.into(),
        id: None,
        now_us: None,
        wait_ms: None,
        views: Default::default(),
    };

    let mut remaining = Vec::new();
    for encoding in [Encoding::Json, Encoding::Binary, Encoding::Json] {
        let body = encoding.encode(&check).expect("encodes");
        let (status, content_type, answer) = post(port, encoding, PROTOCOL_VERSION, &body).await;
        assert_eq!(status, 200, "{encoding:?}: {}", String::from_utf8_lossy(&answer));
        assert_eq!(content_type, encoding.content_type(), "answered in the call's encoding");
        let answer: CheckResponse = encoding.decode(&answer).expect("an answer in the call's encoding");
        assert!(answer.allowed, "{encoding:?}");
        remaining.push(answer.checks[0].limits[0].remaining);
    }
    assert_eq!(remaining, [9, 8, 7], "one counter, whichever the encoding");

    let binary = Encoding::Binary.encode(&check).expect("encodes");
    let (status, _, answer) = post(port, Encoding::Binary, "999", &binary).await;
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("protocol version mismatch"), "{answer}");

    let (status, _, answer) =
        post(port, Encoding::Binary, PROTOCOL_VERSION, &binary[..binary.len() - 1]).await;
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("malformed request"), "{answer}");
    let json = Encoding::Json.encode(&check).expect("encodes");
    let (status, _, _) = post(port, Encoding::Binary, PROTOCOL_VERSION, &json).await;
    assert_eq!(status, 400, "JSON sent as the binary wire is refused");
    server.abort();
}
