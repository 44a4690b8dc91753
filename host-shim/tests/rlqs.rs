//! The RLQS face (`StreamRateLimitQuotas`) through a gRPC client, on an
//! in-process shim with a real Redis: a reported bucket's assignment (a
//! fresh token bucket of tokens charged to its window first), `allow_all`
//! for buckets no policy or an `unlimited` one governs, `deny_all` once
//! the window is spent, bad reports refused with a gRPC status, and the
//! reported usage counted as decisions labelled `face="rlqs"`.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Which;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use sluice_harness::client::http;
use sluice_harness::gateway::sample;
use sluice_harness::Redis;
use sluice_shim::grpc::{router, Faces};
use sluice_shim::limiter::Limiter;
use sluice_shim::server::{run_shared, serve, Options};
use sluice_shim::store::Target;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

const DOC: &str = r#"{
  "policies": [
    {"name": "per-client", "match": {"domain": "edge", "bucket": {"name": {"equals": "api"}}},
     "key": ["bucket:client"], "leased": {"tokens": 4, "ttl": "5s"},
     "limits": [{"type": "fixed_window", "limit": 6, "window": "1h"}]},
    {"name": "internal", "unlimited": true, "match": {"domain": "edge", "bucket": {"tier": {"equals": "internal"}}}},
    {"name": "descriptors", "match": {"domain": "edge", "entries": {"name": {"equals": "api"}}},
     "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]}
  ]
}"#;

struct Face {
    client: RateLimitQuotaServiceClient<Channel>,
    http_port: u16,
    redis: Redis,
    limiter: Arc<Limiter>,
}

/// One open stream: what the test sends, and what Sluice answers.
struct Open {
    send: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

async fn start() -> Face {
    let redis = Redis::start().expect("redis");
    let limiter =
        Arc::new(Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter"));
    let document = Arc::new(sluice_policies::parse(DOC).expect("the document"));
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let grpc_port = grpc.local_addr().expect("addr").port();
    let app = router(Faces::new(limiter.clone(), document.clone()));
    tokio::spawn(serve(grpc, app, Options::default(), std::future::pending(), limiter.drain().clone(), None));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let http_port = listener.local_addr().expect("addr").port();
    let dashboard = sluice_shim::dashboard::Options { policies: Some(document).into(), playground: None };
    let options = Options { dashboard, ..Options::default() };
    tokio::spawn(run_shared(listener, limiter.clone(), options, std::future::pending()));
    let client =
        RateLimitQuotaServiceClient::connect(format!("http://127.0.0.1:{grpc_port}")).await.expect("connect");
    Face { client, http_port, redis, limiter }
}

fn id(pairs: &[(&str, &str)]) -> BucketId {
    BucketId { bucket: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
}

fn usage(pairs: &[(&str, &str)], allowed: u64, denied: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(id(pairs)),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
        ..BucketQuotaUsage::default()
    }
}

fn reports(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports { domain: domain.to_string(), bucket_quota_usages: usages }
}

impl Face {
    async fn open(&mut self) -> Open {
        let (send, receive) = mpsc::channel(16);
        let answers =
            self.client.stream_rate_limit_quotas(ReceiverStream::new(receive)).await.expect("a stream");
        Open { send, answers: answers.into_inner() }
    }

    async fn metrics(&self) -> String {
        let (status, page) = http(self.http_port, "GET", "/metrics", "").await;
        assert_eq!(status, 200);
        page
    }
}

impl Open {
    async fn report(&self, msg: RateLimitQuotaUsageReports) {
        self.send.send(msg).await.expect("the stream is open");
    }

    /// The next response, within a few seconds.
    async fn next(&mut self) -> Result<RateLimitQuotaResponse, tonic::Status> {
        let next = tokio::time::timeout(Duration::from_secs(10), self.answers.message())
            .await
            .expect("an answer in time");
        next.map(|m| m.expect("the stream goes on"))
    }
}

/// One action of a response: (bucket id's pairs, what it says, ttl).
type Action = (Vec<(String, String)>, String, i64);

/// Each action of a response.
fn actions(resp: &RateLimitQuotaResponse) -> Vec<Action> {
    resp.bucket_action
        .iter()
        .map(|a| {
            let mut pairs: Vec<(String, String)> =
                a.bucket_id.as_ref().map(|b| b.bucket.clone().into_iter().collect()).unwrap_or_default();
            pairs.sort();
            match &a.bucket_action {
                Some(Which::QuotaAssignmentAction(q)) => {
                    let ttl = q.assignment_time_to_live.map_or(-1, |d| d.seconds);
                    let what = match q.rate_limit_strategy.and_then(|s| s.strategy) {
                        Some(Strategy::TokenBucket(tb)) => {
                            let fill = tb.fill_interval.map_or(0, |d| d.seconds);
                            format!("token_bucket {} per {}s", tb.max_tokens, fill)
                        }
                        Some(Strategy::BlanketRule(r)) if r == BlanketRule::AllowAll as i32 => {
                            "allow_all".into()
                        }
                        Some(Strategy::BlanketRule(_)) => "deny_all".into(),
                        other => format!("{other:?}"),
                    };
                    (pairs, what, ttl)
                }
                other => (pairs, format!("{other:?}"), -1),
            }
        })
        .collect()
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    v.sort();
    v
}

/// A reported bucket gets a fresh token bucket (`deny_all`, then the token
/// bucket, in one response) of tokens its window in Redis counted first,
/// that refills a token a year and lives the policy's `ttl`.
#[tokio::test]
async fn a_bucket_gets_tokens_charged_to_its_window_first() {
    let mut face = start().await;
    let mut open = face.open().await;
    let bucket = [("name", "api"), ("client", "c1")];
    open.report(reports("edge", vec![usage(&bucket, 0, 1)])).await;
    let resp = open.next().await.expect("an assignment");
    assert_eq!(
        actions(&resp),
        [
            (pairs(&bucket), "deny_all".to_string(), 1),
            (pairs(&bucket), format!("token_bucket 4 per {}s", 365 * 24 * 3600), 5)
        ]
    );
    let client = redis::Client::open(face.redis.url()).expect("client");
    let mut redis = client.get_multiplexed_async_connection().await.expect("connection");
    let count: Option<u64> = redis::cmd("HGET")
        .arg("sluice:{per-client:c1}:fw:3600000")
        .arg("n")
        .query_async(&mut redis)
        .await
        .expect("hget");
    assert_eq!(count, Some(4), "charged before it was sent");
}

/// No policy, or an `unlimited` one: `allow_all`, counted.
#[tokio::test]
async fn unmatched_and_unlimited_buckets_are_allowed_all() {
    let mut face = start().await;
    let mut open = face.open().await;
    open.report(reports("edge", vec![usage(&[("name", "web")], 1, 0), usage(&[("tier", "internal")], 1, 0)]))
        .await;
    let resp = open.next().await.expect("assignments");
    let mut got = actions(&resp);
    got.sort();
    assert_eq!(
        got,
        [
            (pairs(&[("name", "web")]), "allow_all".to_string(), 60),
            (pairs(&[("tier", "internal")]), "allow_all".to_string(), 60)
        ]
    );
    let page = face.metrics().await;
    assert_eq!(sample(&page, r#"sluice_unmatched_descriptors_total{face="rlqs"}"#), 1.0);
    assert_eq!(
        sample(&page, r#"sluice_decisions_total{policy="internal",result="unlimited",face="rlqs"}"#),
        1.0
    );
}

/// Once the window is spent and the bucket's token bucket is empty (all it
/// had reported admitted): `deny_all`; the usage Envoy reported counts as
/// `face="rlqs"` decisions, and on the dashboard.
#[tokio::test]
async fn a_spent_window_denies_all_and_usage_is_counted() {
    let mut face = start().await;
    let mut open = face.open().await;
    let bucket = [("name", "api"), ("client", "c2")];
    open.report(reports("edge", vec![usage(&bucket, 0, 1)])).await;
    open.next().await.expect("the first assignment");
    // 4 admitted: the next lease gets the 2 left; 2 admitted and denials
    // after: the window is spent and the bucket empty.
    let mut seen = Vec::new();
    for round in 0..40 {
        let (allowed, denied) = match round {
            0 => (4, 0),
            1 => (2, 3),
            _ => (0, 3),
        };
        open.report(reports("", vec![usage(&bucket, allowed, denied)])).await;
        if let Ok(Ok(Some(resp))) =
            tokio::time::timeout(Duration::from_millis(600), open.answers.message()).await
        {
            seen.extend(actions(&resp).into_iter().map(|(_, what, _)| what));
            if seen.last().map(String::as_str) == Some("deny_all") && seen.len() % 2 == 1 {
                break;
            }
        }
    }
    assert_eq!(
        seen,
        ["deny_all", "token_bucket 2 per 31536000s", "deny_all"],
        "a fresh token bucket of the 2 left, then deny_all"
    );
    let page = face.metrics().await;
    assert_eq!(
        sample(&page, r#"sluice_decisions_total{policy="per-client",result="allowed",face="rlqs"}"#),
        6.0
    );
    assert!(
        sample(&page, r#"sluice_decisions_total{policy="per-client",result="denied",face="rlqs"}"#) >= 3.0
    );
    assert!(sample(&page, r#"sluice_rlqs_tokens_total{direction="granted"}"#) >= 6.0);
    // The dashboard shows the policy's traffic as the filter's, tagged with its face.
    let (status, body) = http(face.http_port, "GET", "/dashboard.json", "").await;
    assert_eq!(status, 200);
    let snapshot: serde_json::Value = serde_json::from_str(&body).expect("json");
    let policy = snapshot["policies"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "per-client"))
        .expect("per-client on the dashboard");
    assert_eq!(policy["face"], "rlqs");
    assert_eq!(policy["totals"]["allowed"], 6);
    assert!(policy["keys"].as_array().is_some_and(|keys| keys.iter().any(|k| k["key"] == "c2")), "{policy}");
}

/// Malformed and oversized reports end the stream with `INVALID_ARGUMENT`.
#[tokio::test]
async fn bad_reports_get_a_status() {
    let mut face = start().await;
    let many: Vec<BucketQuotaUsage> = (0..5_000).map(|i| usage(&[("n", &i.to_string())], 0, 0)).collect();
    let long = "x".repeat(2_000);
    let cases = [
        reports("", vec![usage(&[("name", "api")], 1, 0)]),
        reports("edge", many),
        reports("edge", vec![usage(&[], 1, 0)]),
        reports("edge", vec![usage(&[("", "x")], 1, 0)]),
        reports("edge", vec![usage(&[("name", &long)], 1, 0)]),
        reports("edge", vec![BucketQuotaUsage::default()]),
    ];
    for case in cases {
        let mut open = face.open().await;
        open.report(case).await;
        let status = open.next().await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    }
    let mut open = face.open().await;
    open.report(reports("edge", vec![usage(&[("name", "web")], 1, 0)])).await;
    open.next().await.expect("an answer");
    open.report(reports("other", vec![usage(&[("name", "web")], 1, 0)])).await;
    let status = open.next().await.expect_err("a domain cannot change");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}

/// A shim that closes (the drain of SIGTERM) ends its streams, so that
/// Envoy opens its next one to another shim.
#[tokio::test]
async fn a_closing_shim_ends_its_streams() {
    let mut face = start().await;
    let mut open = face.open().await;
    open.report(reports("edge", vec![usage(&[("name", "web")], 1, 0)])).await;
    open.next().await.expect("an answer");
    face.limiter.drain().close(std::time::Instant::now());
    let end = tokio::time::timeout(Duration::from_secs(10), open.answers.message()).await.expect("in time");
    assert!(matches!(end, Ok(None)), "the stream ends cleanly: {end:?}");
}
