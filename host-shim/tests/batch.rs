//! Shared callouts, the shim's side, against real Redis: a batch of checks
//! (`POST /v1/checks`) is answered exactly as the same checks sent one by
//! one, in the batch's order, to a shim of its own: each check's status and
//! body byte for byte, with its own ids, leases, refusals and 400s.

use std::time::Duration;

use sluice_harness::Redis;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{
    Answered, BatchAnswer, Check, CheckBatch, CheckRequest, Encoding, WireLimit, BATCH_PATH, CHECK_PATH,
    PROTOCOL_VERSION,
};
use sluice_shim::limiter::Limiter;
use sluice_shim::store::Target;
#[path = "support/raw_post.rs"]
mod raw_post;

/// A call to `path` on a fresh connection: its status and body.
async fn post(port: u16, path: &str, encoding: Encoding, body: &[u8]) -> (u16, Vec<u8>) {
    let (status, _, body) = raw_post::post(port, path, encoding, PROTOCOL_VERSION, body).await;
    (status, body)
}

/// A shim in test-time mode on a Redis of its own; its port.
async fn shim(redis: &Redis) -> u16 {
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(sluice_shim::server::run(
        listener,
        limiter,
        sluice_shim::server::Options::default(),
        std::future::pending(),
    ));
    port
}

fn check(key: &str, limits: Vec<WireLimit>) -> Check {
    Check {
        policy: "p".into(),
        key: key.into(),
        limits,
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }
}

/// Forty requests on three keys, each with its own id and limits tight
/// enough that the order decides who is refused: windows, a bucket, a
/// concurrency limit (leases named by the id), two checks in one request
/// (all or nothing); and one body that is no check at all.
fn bodies(encoding: Encoding) -> Vec<Vec<u8>> {
    let hour = Millis(3_600_000);
    let mut out = Vec::new();
    for i in 0..40u64 {
        let key = ["a", "b", "c"][(i % 3) as usize];
        let checks = match i % 4 {
            0 => vec![check(key, vec![WireLimit::FixedWindow { limit: 2, window_ms: hour, cost: 1 }])],
            1 => vec![check(key, vec![WireLimit::TokenBucket { rate: 1, per_ms: hour, burst: 2 }])],
            2 => vec![check(key, vec![WireLimit::Concurrency { limit: 2, lease_ms: Millis(60_000) }])],
            _ => vec![
                check(key, vec![WireLimit::SlidingWindow { limit: 2, window_ms: hour, approximate: false }]),
                check("shared", vec![WireLimit::FixedWindow { limit: 7, window_ms: hour, cost: 1 }]),
            ],
        };
        let id = format!("req-{i}");
        let request = CheckRequest {
            checks: checks.into(),
            id: Some(id.as_str().into()),
            now_us: Some(Micros(1_800_000_000_000_000 + i * 1_000)),
            wait_ms: None,
            views: Default::default(),
        };
        out.push(encoding.encode(&request).expect("encodes"));
    }
    out.insert(17, b"not a check".to_vec());
    out
}

#[tokio::test]
async fn a_batch_answers_as_its_checks_sent_one_by_one_in_order() {
    for encoding in [Encoding::Binary, Encoding::Json] {
        let (batched, alone) = (Redis::start().expect("redis"), Redis::start().expect("redis"));
        let (batched, alone) = (shim(&batched).await, shim(&alone).await);
        let checks = bodies(encoding);

        let batch = encoding.encode(&CheckBatch { checks: checks.clone() }).expect("encodes");
        let (status, body) = post(batched, BATCH_PATH, encoding, &batch).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let answer: BatchAnswer = encoding.decode(&body).expect("a batch answer");

        let mut expected = Vec::new();
        for body in &checks {
            let (status, body) = post(alone, CHECK_PATH, encoding, body).await;
            expected.push(Answered { status, body });
        }
        assert_eq!(answer.answers.len(), expected.len());
        for (i, (got, want)) in answer.answers.iter().zip(&expected).enumerate() {
            assert_eq!(got, want, "{encoding:?} check {i}");
        }
        let statuses = |s: u16| expected.iter().filter(|a| a.status == s).count();
        assert_eq!((statuses(200), statuses(400)), (40, 1), "every check decided but the one that is none");
        let refused = expected
            .iter()
            .filter(|a| a.status == 200)
            .filter(|a| {
                !encoding.decode::<sluice_policies::wire::CheckResponse>(&a.body).expect("an answer").allowed
            })
            .count();
        assert!(refused >= 10, "the limits are tight enough that order matters: {refused} refused");
    }
}

/// A check that waits would hold the whole batch's answer until its slot:
/// it is refused in a batch (400), and its neighbours are decided.
#[tokio::test]
async fn a_waiting_check_is_refused_in_a_batch() {
    let redis = Redis::start().expect("redis");
    let port = shim(&redis).await;
    let limit = WireLimit::FixedWindow { limit: 5, window_ms: Millis(60_000), cost: 1 };
    let request = |wait_ms| CheckRequest {
        checks: vec![check("k", vec![limit])].into(),
        id: None,
        now_us: Some(Micros(1_800_000_000_000_000)),
        wait_ms,
        views: Default::default(),
    };
    let encoding = Encoding::Binary;
    let checks = vec![
        encoding.encode(&request(None)).expect("encodes"),
        encoding.encode(&request(Some(Millis(500)))).expect("encodes"),
        encoding.encode(&request(None)).expect("encodes"),
    ];
    let batch = encoding.encode(&CheckBatch { checks }).expect("encodes");
    let (status, body) = post(port, BATCH_PATH, encoding, &batch).await;
    assert_eq!(status, 200);
    let answer: BatchAnswer = encoding.decode(&body).expect("a batch answer");
    let statuses: Vec<u16> = answer.answers.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [200, 400, 200]);
    assert!(String::from_utf8_lossy(&answer.answers[1].body).contains("sent alone"));
}
