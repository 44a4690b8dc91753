//! The bounds of `sluice_policies::bounds` hold end to end: the largest
//! documents the parser accepts, applied to requests whose every key source
//! is at its longest, make check, release and adjust calls that the real
//! shim (in process, on a real Redis) accepts. Before the bounds, the parser
//! accepted documents whose every request the shim refused with 400, which
//! `failure_mode: allow` turned into no limit at all.

use std::time::Duration;

use sluice_harness::Redis;
use sluice_policies::bounds::{worst_case_body, MAX_BODY, MAX_CHECKS, MAX_KEY_SOURCES};
use sluice_policies::request::SimpleRequest;
use sluice_policies::units::Micros;
use sluice_policies::wire::{AdjustRequest, Adjustment, CheckRequest, Encoding, ReleaseRequest};
use sluice_policies::{parse, Document};
use sluice_shim::limiter::Limiter;
use sluice_shim::store::Target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A policy with `sources` header key sources and these limits.
fn policy(name: &str, sources: usize, limits: &str) -> String {
    let key: Vec<String> = (0..sources).map(|i| format!("\"header:x-k{i}\"")).collect();
    format!(r#"{{"name": "{name}", "key": [{}], "limits": [{limits}]}}"#, key.join(", "))
}

fn document(policies: &[String]) -> String {
    format!(r#"{{"policies": [{}]}}"#, policies.join(",\n"))
}

/// Adds policies made by `make` until the parser refuses the document for
/// its size (or the policy count), and returns the last one it accepted.
fn largest(make: impl Fn(usize) -> String) -> (String, Document) {
    let mut policies = Vec::new();
    let mut accepted = None;
    for i in 0..=MAX_CHECKS {
        policies.push(make(i));
        let text = document(&policies);
        match parse(&text) {
            Ok(doc) => accepted = Some((text, doc)),
            Err(err) => {
                let reason = err.to_string();
                assert!(
                    reason.contains("call to the shim") || reason.contains("can apply to one request"),
                    "refused for another reason: {reason}"
                );
                break;
            }
        }
    }
    accepted.expect("at least one policy fits")
}

/// A request whose every key source is as long as a kept value can be:
/// 255 bytes that each encode to 3, just under the hashing threshold.
fn longest_request() -> SimpleRequest {
    let long = "{".repeat(85);
    let mut req = SimpleRequest::new("GET", "/");
    for i in 0..MAX_KEY_SOURCES {
        req = req.header(&format!("x-k{i}"), &long);
    }
    req.header("x-cost", "1000000000")
}

async fn post(port: u16, path: &str, encoding: Encoding, body: &[u8]) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: shim\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        encoding.content_type(),
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("write head");
    stream.write_all(body).await.expect("write body");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read answer");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, answer)
}

/// The largest valid documents of three shapes (many key sources, many
/// limits, many points limits to adjust): each call the filter makes for
/// the longest request stays within `MAX_BODY`, and the shim answers 200;
/// the check in the binary wire too.
#[tokio::test]
async fn the_largest_valid_documents_make_calls_the_shim_accepts() {
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

    let windows: Vec<String> =
        (1..=32).map(|s| format!(r#"{{"type": "fixed_window", "limit": 1000, "window": "{s}s"}}"#)).collect();
    let points: Vec<String> = (1..=32)
        .map(|s| {
            format!(
                r#"{{"type": "points", "capacity": 1000000000, "refill": "{s}d", "cost": {{"header": "x-cost", "default": 1}}, "actual_cost_header": "x-actual"}}"#
            )
        })
        .collect();
    let shapes: [Box<dyn Fn(usize) -> String>; 3] = [
        Box::new(|i| {
            policy(&format!("keyed-{i}"), MAX_KEY_SOURCES, r#"{"type": "interval", "every": "1s"}"#)
        }),
        Box::new(|i| policy(&format!("windows-{i}"), 1, &windows.join(", "))),
        Box::new(|i| policy(&format!("points-{i}"), 2, &points.join(", "))),
    ];
    let req = longest_request();
    for shape in &shapes {
        let (text, doc) = largest(shape);
        let applied = doc.evaluate(&req).expect("every policy applies");
        assert_eq!(applied.len(), doc.policies.len());
        let checks: Vec<_> = applied.iter().map(|a| a.check(&req)).collect();
        let id = "i".repeat(64);
        let check = CheckRequest {
            checks: checks.clone().into(),
            id: Some(id.clone().into()),
            now_us: None,
            wait_ms: None,
            views: Default::default(),
        };
        let release = ReleaseRequest { lease: id, checks: checks.clone() };
        let adjustments: Vec<Adjustment> = checks
            .iter()
            .flat_map(|c| c.limits.iter().map(move |l| (c, l)))
            .filter(|(_, l)| matches!(l, sluice_policies::wire::WireLimit::Points { .. }))
            .map(|(c, l)| Adjustment {
                policy: c.policy.clone(),
                key: c.key.clone(),
                id: None,
                limit: *l,
                actual: 1,
                held_until_us: Some(Micros(u64::MAX / 2)),
                refunded_us: Micros(u64::MAX / 2),
                level: None,
            })
            .collect();
        let adjust = AdjustRequest { adjustments, now_us: None };
        let bound = worst_case_body(&doc.policies).total;
        assert!(bound <= MAX_BODY, "{bound}");
        for (path, encoding, body) in [
            ("/v1/check", Encoding::Json, serde_json::to_vec(&check).expect("json")),
            ("/v1/check", Encoding::Binary, Encoding::Binary.encode(&check).expect("binary")),
            ("/v1/release", Encoding::Json, serde_json::to_vec(&release).expect("json")),
            ("/v1/adjust", Encoding::Json, serde_json::to_vec(&adjust).expect("json")),
        ] {
            assert!(body.len() <= bound, "{path}: {} bytes, more than the bound {bound}", body.len());
            let (status, answer) = post(port, path, encoding, &body).await;
            // A release without a concurrency limit only ends a hold: 200 too.
            assert_eq!(status, 200, "{path} for a document of {} bytes: {answer}", text.len());
        }
    }
    server.abort();
}
