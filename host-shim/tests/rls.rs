//! The RLS face (`ShouldRateLimit`) through a gRPC client, on an in-process
//! shim with a real Redis: descriptors select policies and key them, the
//! whole answer (per descriptor and overall, current limit, remaining,
//! reset, the IETF headers), costs, shadow, unlimited, descriptors nobody
//! matches, bad requests, and the metrics labelled `face="rls"`; and the
//! peers' semantics on imported documents (`peer_*` tests): the most
//! specific rule of a descriptor tree, blocked values, month and year
//! windows, shadow answered with its limit, unnamed limits, `replaces`,
//! each descriptor charged on its own, a refused one's hits counted past
//! the limit (`charge: every_hit`), quota-mode descriptors, dynamic
//! metadata, Limitador's `descriptors[0]`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice_harness::client::http;
use sluice_harness::gateway::sample;
use sluice_harness::Redis;
use sluice_shim::grpc::{router, Faces};
use sluice_shim::limiter::Limiter;
use sluice_shim::server::{run_shared, serve, Options};
use sluice_shim::store::Target;
use tonic::transport::Channel;

const DOC: &str = r#"{
  "headers": "always",
  "policies": [
    {"name": "per-client", "match": {"domain": "edge", "entries": {"generic_key": {"equals": "api"}, "client": {"present": true}}},
     "key": ["entry:client"], "limits": [{"type": "fixed_window", "limit": 2, "window": "1m"}]},
    {"name": "global", "match": {"domain": "edge", "entries": {"generic_key": {"equals": "global"}}},
     "limits": [{"type": "sliding_window", "limit": 3, "window": "1h"}]},
    {"name": "tokens", "match": {"domain": "edge", "entries": {"generic_key": {"equals": "tokens"}}},
     "limits": [{"type": "points", "capacity": 10, "refill": "1h", "cost": 1}]},
    {"name": "gcra", "match": {"domain": "edge", "entries": {"generic_key": {"equals": "gcra"}}},
     "limits": [{"type": "token_bucket", "rate": 1, "per": "1h", "burst": 1}]},
    {"name": "every", "match": {"domain": "edge", "entries": {"generic_key": {"equals": "every"}}},
     "limits": [{"type": "interval", "every": "1h"}]},
    {"name": "trial", "shadow": true, "match": {"domain": "edge", "entries": {"generic_key": {"equals": "trial"}}},
     "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]},
    {"name": "internal", "unlimited": true, "match": {"domain": "edge", "entries": {"generic_key": {"equals": "internal"}}}},
    {"name": "http-only", "match": {"path_prefix": "/"}, "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]}
  ]
}"#;

struct Face {
    client: RateLimitServiceClient<Channel>,
    http_port: u16,
    _redis: Redis,
}

async fn start() -> Face {
    start_with(DOC).await
}

async fn start_with(doc: &str) -> Face {
    let redis = Redis::start().expect("redis");
    let limiter =
        Arc::new(Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter"));
    let document = Arc::new(sluice_policies::parse(doc).expect("the document"));
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let grpc_port = grpc.local_addr().expect("addr").port();
    let app = router(Faces::new(limiter.clone(), document));
    tokio::spawn(serve(grpc, app, Options::default(), std::future::pending(), limiter.drain().clone(), None));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let http_port = listener.local_addr().expect("addr").port();
    tokio::spawn(run_shared(listener, limiter, Options::default(), std::future::pending()));
    let client =
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}")).await.expect("connect");
    Face { client, http_port, _redis: redis }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() }).collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest { domain: domain.to_string(), descriptors, hits_addend: hits }
}

impl Face {
    async fn ask(&mut self, req: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        self.client.should_rate_limit(req).await.map(|r| r.into_inner())
    }

    async fn one(&mut self, entries: &[(&str, &str)]) -> RateLimitResponse {
        self.ask(request("edge", vec![descriptor(entries)], 0)).await.expect("an answer")
    }

    async fn metrics(&self) -> String {
        let (status, page) = http(self.http_port, "GET", "/metrics", "").await;
        assert_eq!(status, 200);
        page
    }
}

fn header<'a>(resp: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    resp.response_headers_to_add.iter().find(|h| h.key == name).map(|h| h.value.as_str())
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn a_window_allows_then_denies_with_the_whole_answer() {
    let mut face = start().await;
    for remaining in [1, 0] {
        let resp = face.one(&[("generic_key", "api"), ("client", "a")]).await;
        assert_eq!(resp.overall_code, OK);
        let status = &resp.statuses[0];
        assert_eq!(status.code, OK);
        let limit = status.current_limit.as_ref().expect("current_limit");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("per-client", 2, Unit::Minute as i32)
        );
        assert_eq!(status.limit_remaining, remaining);
        let reset = status.duration_until_reset.as_ref().expect("duration_until_reset");
        assert!((0..=60).contains(&reset.seconds), "{reset:?}");
        assert_eq!(header(&resp, "ratelimit-policy"), Some(r#""per-client";q=2;w=60"#));
        assert!(header(&resp, "ratelimit")
            .is_some_and(|h| h.starts_with(&format!("\"per-client\";r={remaining};t="))));
    }
    let denied = face.one(&[("generic_key", "api"), ("client", "a")]).await;
    assert_eq!(denied.overall_code, OVER);
    assert_eq!(denied.statuses[0].code, OVER);
    assert_eq!(denied.statuses[0].limit_remaining, 0);
    // Another client has its own bucket.
    assert_eq!(face.one(&[("generic_key", "api"), ("client", "b")]).await.overall_code, OK);
    let page = face.metrics().await;
    assert_eq!(
        sample(&page, r#"sluice_decisions_total{policy="per-client",result="allowed",face="rls"}"#),
        3.0
    );
    assert_eq!(
        sample(&page, r#"sluice_decisions_total{policy="per-client",result="denied",face="rls"}"#),
        1.0
    );
}

/// Several descriptors: each answered, the request over limit if one is;
/// and a denied request charges none of its descriptors.
#[tokio::test]
async fn descriptors_are_decided_together_and_a_denial_charges_none() {
    let mut face = start().await;
    let both = || {
        request(
            "edge",
            vec![
                descriptor(&[("generic_key", "global")]),
                descriptor(&[("generic_key", "api"), ("client", "c")]),
            ],
            0,
        )
    };
    for _ in 0..2 {
        let resp = face.ask(both()).await.expect("answer");
        assert_eq!(resp.overall_code, OK);
        assert_eq!(resp.statuses.iter().map(|s| s.code).collect::<Vec<_>>(), [OK, OK]);
    }
    let resp = face.ask(both()).await.expect("answer");
    assert_eq!(resp.overall_code, OVER);
    assert_eq!(resp.statuses.iter().map(|s| s.code).collect::<Vec<_>>(), [OK, OVER]);
    // `global` (3 an hour) was charged twice, not three times.
    let alone = face.one(&[("generic_key", "global")]).await;
    assert_eq!(alone.overall_code, OK);
    assert_eq!(alone.statuses[0].limit_remaining, 0);
    assert_eq!(face.one(&[("generic_key", "global")]).await.overall_code, OVER);
}

#[tokio::test]
async fn hits_addend_is_a_points_cost_and_zero_means_one() {
    let mut face = start().await;
    let tokens = |hits| request("edge", vec![descriptor(&[("generic_key", "tokens")])], hits);
    let resp = face.ask(tokens(0)).await.expect("answer");
    assert_eq!(resp.statuses[0].limit_remaining, 9);
    let resp = face.ask(tokens(7)).await.expect("answer");
    assert_eq!((resp.overall_code, resp.statuses[0].limit_remaining), (OK, 2));
    let refused = face.ask(tokens(3)).await.expect("answer");
    assert_eq!(refused.overall_code, OVER);
    // r is what the bucket holds of the call's cost of 3: two points, the
    // third a refill away (regression: the fields were read at cost 1, r=0).
    let ratelimit = header(&refused, "ratelimit").expect("ratelimit");
    assert!(ratelimit.starts_with("\"tokens\";r=2;t="), "{ratelimit}");
    assert_eq!(face.ask(tokens(2)).await.expect("answer").overall_code, OK);
    // A sliding window counts requests: a cost it cannot charge is refused, not under-counted.
    let err = face
        .ask(request("edge", vec![descriptor(&[("generic_key", "global")])], 5))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("only a fixed_window or a points limit charges a cost"), "{err:?}");
}

/// envoyproxy/ratelimit adds `hits_addend` to every descriptor's window
/// (regression: a cost above 1 on a window was refused with
/// INVALID_ARGUMENT, which Envoy's filter passes unless
/// `failure_mode_deny`). Imported, each descriptor is charged on its own:
/// the month's 4 and the year's 3 of `mixed.yaml`; a cost that does not fit
/// is refused and counted anyway (`charge: every_hit`, the peer's
/// counter), and a cost above the limit never fits.
#[tokio::test]
async fn peer_hits_addend_is_counted_on_every_window() {
    let mut face = start_with(&imported("mixed.yaml")).await;
    let both =
        |hits| request("edge", vec![descriptor(&[("tenant", "t")]), descriptor(&[("org", "o")])], hits);
    let remaining = |r: &RateLimitResponse| r.statuses.iter().map(|s| s.limit_remaining).collect::<Vec<_>>();
    let resp = face.ask(both(2)).await.expect("answer");
    assert_eq!((codes(&resp), remaining(&resp)), (vec![OK, OK], vec![2, 1]));
    // The year has 1 left of the cost of 2: refused, and counted past its
    // limit; the month charged anyway. A refused descriptor says 0
    // remaining, as the peer's OVER_LIMIT status does.
    let resp = face.ask(both(2)).await.expect("answer");
    assert_eq!((codes(&resp), remaining(&resp)), (vec![OK, OVER], vec![0, 0]));
    let org = |hits| request("edge", vec![descriptor(&[("org", "o")])], hits);
    let resp = face.ask(org(1)).await.expect("answer");
    assert_eq!((resp.overall_code, resp.statuses[0].limit_remaining), (OVER, 0), "the refusal was counted");
    let fresh = face.ask(request("edge", vec![descriptor(&[("org", "new")])], 4)).await.expect("answer");
    assert_eq!((fresh.overall_code, fresh.statuses[0].limit_remaining), (OVER, 0), "above the limit");
}

/// envoyproxy/ratelimit adds a refused descriptor's hits to its counter,
/// past the limit: a limit of 10, a cost of 8 admitted, a cost of 5
/// refused, and then a cost of 1 refused too under `charge: every_hit`
/// (what `sluice import` writes for its configurations), where Sluice's
/// `each_descriptor` charges the refusal nothing and admits it. (A window
/// from the first hit, an hour long: no window ends during the test.)
#[tokio::test]
async fn peer_a_refused_hits_addend_is_counted_past_the_limit() {
    const DOC: &str = r#"{"charge": "CHARGE", "policies": [
        {"name": "api", "match": {"domain": "edge", "entries": {"user": {"present": true}}}, "key": ["entry:user"],
         "limits": [{"type": "fixed_window", "limit": 10, "window": "1h", "start": "first_hit"}]}
    ]}"#;
    for (charge, last) in [("every_hit", OVER), ("each_descriptor", OK)] {
        let mut face = start_with(&DOC.replace("CHARGE", charge)).await;
        let mut codes = Vec::new();
        for hits in [8, 5, 1] {
            let resp =
                face.ask(request("edge", vec![descriptor(&[("user", "u")])], hits)).await.expect("answer");
            codes.push(resp.overall_code);
        }
        assert_eq!(codes, [OK, OVER, last], "charge: {charge}");
    }
}

/// Under `every_hit` a refusal from memory counts nothing where Redis
/// counts it. A check of one window may be refused so: its window is past
/// its limit until its end, so no decision reads the count skipped. A check
/// of two windows is never refused from memory: while its second's window
/// refuses, Redis counts every call in its hour's window too, and once the
/// second's window has passed the hour's refuses on that count.
#[tokio::test]
async fn every_hit_memory_skips_no_count_a_decision_reads() {
    const TWO: &str = r#"{"charge": "every_hit", "policies": [
        {"name": "two", "match": {"domain": "edge", "entries": {"user": {"present": true}}}, "key": ["entry:user"],
         "limits": [{"type": "fixed_window", "limit": 1, "window": "1s"},
                    {"type": "fixed_window", "limit": 3, "window": "1h"}]}
    ]}"#;
    // 2027-01-15T08:00:01.234Z: the second's window ends in 766 ms.
    const T0_MS: u64 = 1_800_000_001_234;
    let redis = Redis::start().expect("redis");
    let limiter =
        Arc::new(Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter"));
    let clock = Arc::new(AtomicU64::new(T0_MS));
    let document = Arc::new(sluice_policies::parse(TWO).expect("the document"));
    let faces = Faces::new(limiter.clone(), document).with_test_clock(clock.clone());
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = grpc.local_addr().expect("addr").port();
    let drain = limiter.drain().clone();
    tokio::spawn(serve(grpc, router(faces), Options::default(), std::future::pending(), drain, None));
    let client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}")).await.expect("connect");
    let ask_at = |ms: u64| {
        clock.store(ms, Ordering::Relaxed);
        let req = request("edge", vec![descriptor(&[("user", "u")])], 1);
        let mut client = client.clone();
        async move { client.should_rate_limit(req).await.expect("an answer").into_inner().overall_code }
    };
    // The second's 1 and the hour's first of 3.
    assert_eq!(ask_at(T0_MS).await, OK);
    // The second refuses; both windows count the call: the hour 2, then 3.
    assert_eq!(ask_at(T0_MS).await, OVER);
    assert_eq!(ask_at(T0_MS + 1).await, OVER);
    // The next second admits; the hour's 3 are counted, so it refuses.
    assert_eq!(ask_at(T0_MS + 800).await, OVER, "the hour counted every refused call");
}

/// Limitador reads a descriptor into a map, so a key given twice counts
/// its last value: an imported Limitador document says `repeated_entry:
/// last`. Sluice's own default reads the first.
#[tokio::test]
async fn peer_limitador_reads_the_last_value_of_a_repeated_key() {
    let doc = each_status(imported("limitador/examples.yaml"));
    assert!(doc.contains(r#""repeated_entry":"last""#), "{doc}");
    let mut face = start_with(&doc).await;
    let twice = |first: &str, last: &str| {
        request(
            "test_namespace",
            vec![descriptor(&[("req.method", first), ("user_id", "u"), ("req.method", last)])],
            0,
        )
    };
    // The POST limit (5 a minute per user) counts the call whose last method is POST.
    let posted = face.ask(twice("GET", "POST")).await.expect("answer");
    assert_eq!(posted.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit), Some(5), "{posted:?}");
    let got = face.ask(twice("POST", "GET")).await.expect("answer");
    assert_ne!(got.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit), Some(5), "{got:?}");
    let first = start_with(&doc.replace(r#""repeated_entry":"last""#, r#""repeated_entry":"first""#)).await;
    let mut first = first;
    let read_first = first.ask(twice("POST", "GET")).await.expect("answer");
    assert_eq!(read_first.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit), Some(5));
}

/// Limitador's `max_value` per `seconds` counts `hits_addend` too, and its
/// rule charges every matching limit of a call or none.
#[tokio::test]
async fn peer_limitador_counts_hits_addend_all_or_none() {
    let doc = r#"{"charge": "all_or_none", "headers": "off", "policies": [
      {"name": "a", "match": {"domain": "ns", "descriptor_index": 0, "entries": {"a": {"present": true}}},
       "key": ["entry:a"], "limits": [{"type": "fixed_window", "limit": 5, "window": "1h", "start": "first_hit"}]},
      {"name": "b", "match": {"domain": "ns", "descriptor_index": 0, "entries": {"b": {"present": true}}},
       "key": ["entry:b"], "limits": [{"type": "fixed_window", "limit": 3, "window": "1h", "start": "first_hit"}]}
    ]}"#;
    let mut face = start_with(doc).await;
    let call = |hits| request("ns", vec![descriptor(&[("a", "1"), ("b", "1")])], hits);
    assert_eq!(face.ask(call(2)).await.expect("answer").overall_code, OK);
    // b has 1 left: refused, and a is not charged either.
    assert_eq!(face.ask(call(2)).await.expect("answer").overall_code, OVER);
    let a = face.ask(request("ns", vec![descriptor(&[("a", "1")])], 3)).await.expect("answer");
    assert_eq!((a.overall_code, a.statuses[0].limit_remaining), (OK, 0), "a: 2 + 3 of 5");
}

#[tokio::test]
async fn gcra_and_interval_answer_too() {
    let mut face = start().await;
    for key in ["gcra", "every"] {
        assert_eq!(face.one(&[("generic_key", key)]).await.overall_code, OK, "{key}");
        let denied = face.one(&[("generic_key", key)]).await;
        assert_eq!(denied.overall_code, OVER, "{key}");
        let reset = denied.statuses[0].duration_until_reset.as_ref().expect("reset");
        assert!(reset.seconds > 3000, "{key}: {reset:?}");
    }
}

#[tokio::test]
async fn shadow_counts_but_answers_ok_unlimited_and_unmatched_pass() {
    let mut face = start().await;
    for _ in 0..3 {
        let resp = face.one(&[("generic_key", "trial")]).await;
        assert_eq!((resp.overall_code, resp.statuses[0].code), (OK, OK));
        assert_eq!(face.one(&[("generic_key", "internal")]).await.overall_code, OK);
        assert_eq!(face.one(&[("generic_key", "nobody")]).await.overall_code, OK);
    }
    // An HTTP policy that matches every path never sees a descriptor.
    assert_eq!(
        face.ask(request("other", vec![descriptor(&[("generic_key", "api")])], 0))
            .await
            .expect("answer")
            .overall_code,
        OK
    );
    let page = face.metrics().await;
    assert_eq!(sample(&page, r#"sluice_decisions_total{policy="trial",result="allowed",face="rls"}"#), 1.0);
    assert_eq!(sample(&page, r#"sluice_decisions_total{policy="trial",result="denied",face="rls"}"#), 2.0);
    assert_eq!(
        sample(&page, r#"sluice_decisions_total{policy="internal",result="unlimited",face="rls"}"#),
        3.0
    );
    assert_eq!(sample(&page, r#"sluice_unmatched_descriptors_total{face="rls"}"#), 4.0);
    assert_eq!(
        sample(&page, r#"sluice_decisions_total{policy="http-only",result="allowed",face="rls"}"#),
        0.0
    );
}

#[tokio::test]
async fn malformed_and_oversized_requests_get_invalid_argument() {
    let mut face = start().await;
    let bad = [
        request("", vec![descriptor(&[("generic_key", "api")])], 0),
        request("edge", vec![], 0),
        request("edge", vec![descriptor(&[("", "x")])], 0),
        request("edge", (0..65).map(|i| descriptor(&[("generic_key", &i.to_string())])).collect(), 0),
        request("edge", vec![descriptor(&[("generic_key", &"v".repeat(2000))])], 0),
    ];
    for req in bad {
        let err = face.ask(req).await.expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    }
    // The face still answers.
    assert_eq!(face.one(&[("generic_key", "api"), ("client", "z")]).await.overall_code, OK);
}

/// An imported configuration's document (`sluice import`, losses accepted).
fn imported(file: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/import").join(file);
    let text = std::fs::read_to_string(&path).expect("fixture");
    let imported = sluice_cli::import::convert(&text, None).expect("converts");
    imported.document.to_string()
}

fn codes(resp: &RateLimitResponse) -> Vec<i32> {
    resp.statuses.iter().map(|s| s.code).collect()
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs()
}

/// envoyproxy/ratelimit's README, example 3, and the issue's case: beside a
/// bare `plan` rule of 7 a minute, `plan=pro` (12) and `plan=internal`
/// (unlimited) answer alone.
#[tokio::test]
async fn peer_the_most_specific_rule_answers() {
    let mut face = start_with(&imported("mixed.yaml")).await;
    let mut admitted = 0;
    for _ in 0..14 {
        let resp = face.one(&[("plan", "pro")]).await;
        admitted += usize::from(resp.overall_code == OK);
        let limit = resp.statuses[0].current_limit.as_ref().expect("current_limit");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("pro", 12, Unit::Minute as i32)
        );
    }
    assert_eq!(admitted, 12);
    for _ in 0..10 {
        let resp = face.one(&[("plan", "internal")]).await;
        assert_eq!(resp.overall_code, OK);
        assert_eq!(resp.statuses[0].current_limit, None);
        assert_eq!(resp.statuses[0].limit_remaining, u32::MAX, "unlimited: all it wants");
    }
    let free: Vec<i32> = futures_codes(&mut face, &[("plan", "free")], 8).await;
    assert_eq!(free, [OK, OK, OK, OK, OK, OK, OK, OVER]);
}

async fn futures_codes(face: &mut Face, entries: &[(&str, &str)], n: usize) -> Vec<i32> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(face.one(entries).await.overall_code);
    }
    out
}

/// `requests_per_unit: 0`: always refused, answered as a limit of 0.
#[tokio::test]
async fn peer_a_blocked_value_is_refused_with_a_limit_of_zero() {
    let mut face = start_with(&imported("mixed.yaml")).await;
    for _ in 0..3 {
        let resp = face.one(&[("client_ip", "10.0.0.66")]).await;
        assert_eq!(resp.overall_code, OVER);
        let status = &resp.statuses[0];
        let limit = status.current_limit.as_ref().expect("current_limit");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("blocked", 0, Unit::Minute as i32)
        );
        assert_eq!(status.limit_remaining, 0);
        let reset = status.duration_until_reset.as_ref().expect("reset").seconds;
        assert!((1..=60).contains(&reset), "{reset}");
    }
    assert_eq!(futures_codes(&mut face, &[("client_ip", "10.0.0.1")], 6).await, [OK, OK, OK, OK, OK, OVER]);
    let page = face.metrics().await;
    assert_eq!(sample(&page, r#"sluice_decisions_total{policy="blocked",result="denied",face="rls"}"#), 3.0);
}

/// `month` is 30 days and `year` 365, windows aligned to the epoch: the
/// reset is what is left of the window, in whole seconds rounded up.
#[tokio::test]
async fn peer_month_and_year_are_epoch_aligned_windows() {
    let mut face = start_with(&imported("mixed.yaml")).await;
    for (key, quota, unit, divider) in
        [("tenant", 4, Unit::Month, 30 * 86_400), ("org", 3, Unit::Year, 365 * 86_400)]
    {
        let before = now_s();
        let resp = face.one(&[(key, "acme")]).await;
        let after = now_s();
        let status = &resp.statuses[0];
        let limit = status.current_limit.as_ref().expect("current_limit");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("", quota, unit as i32),
            "{key}"
        );
        assert_eq!(status.limit_remaining, quota - 1);
        let reset = status.duration_until_reset.as_ref().expect("reset").seconds as u64;
        let (low, high) = (divider - after % divider, divider - before % divider);
        assert!((low..=high).contains(&reset) || reset == divider, "{key}: {reset} not in {low}..={high}");
        let rest = futures_codes(&mut face, &[(key, "acme")], quota as usize).await;
        assert_eq!(rest.last(), Some(&OVER), "{key}: {rest:?}");
    }
}

/// A shadow limit over its quota: OK, with its `current_limit` and 0 left.
#[tokio::test]
async fn peer_shadow_answers_ok_with_its_current_limit() {
    let mut face = start_with(&imported("mixed.yaml")).await;
    for remaining in [0, 0, 0] {
        let resp = face.one(&[("trial", "t1")]).await;
        assert_eq!((resp.overall_code, codes(&resp)), (OK, vec![OK]));
        let limit = resp.statuses[0].current_limit.as_ref().expect("a shadow limit answers its limit");
        assert_eq!((limit.name.as_str(), limit.requests_per_unit), ("trial", 1));
        assert_eq!(resp.statuses[0].limit_remaining, remaining);
    }
}

/// Each descriptor is decided and charged on its own, in order: a call
/// over on one descriptor still charges the others (and a descriptor twice
/// in a call is charged twice).
#[tokio::test]
async fn peer_each_descriptor_is_charged_on_its_own() {
    let mut face = start_with(&imported("mixed.yaml")).await;
    let both = || request("edge", vec![descriptor(&[("plan", "x")]), descriptor(&[("org", "o")])], 0);
    for want in [[OK, OK], [OK, OK], [OK, OK], [OK, OVER]] {
        let resp = face.ask(both()).await.expect("answer");
        assert_eq!(codes(&resp), want);
    }
    // `plan=x` was charged 4 times of 7: 3 left.
    assert_eq!(futures_codes(&mut face, &[("plan", "x")], 4).await, [OK, OK, OK, OVER]);
    let twice = request("edge", vec![descriptor(&[("tenant", "t")]), descriptor(&[("tenant", "t")])], 0);
    let resp = face.ask(twice).await.expect("answer");
    assert_eq!(resp.statuses.iter().map(|s| s.limit_remaining).collect::<Vec<_>>(), [3, 2]);
}

/// Sluice's own rule, `charge: all_or_none`: a denied call charges nothing.
#[tokio::test]
async fn all_or_none_stays_a_setting() {
    let doc = imported("mixed.yaml").replace("\"every_hit\"", "\"all_or_none\"");
    let mut face = start_with(&doc).await;
    let both = || request("edge", vec![descriptor(&[("plan", "x")]), descriptor(&[("org", "o")])], 0);
    for want in [OK, OK, OK, OVER] {
        assert_eq!(face.ask(both()).await.expect("answer").overall_code, want);
    }
    assert_eq!(futures_codes(&mut face, &[("plan", "x")], 5).await, [OK, OK, OK, OK, OVER]);
}

/// README example 7: the replacing limit drops the replaced one for the
/// call, which is not charged.
#[tokio::test]
async fn peer_replaces_drops_the_named_limit_for_the_call() {
    let mut face = start_with(&imported("readme/example7.yaml")).await;
    let first = || descriptor(&[("key_1", "value_1"), ("user", "bkthomps")]);
    let second = || descriptor(&[("key_2", "value_2"), ("user", "bkthomps")]);
    for _ in 0..6 {
        let resp = face.ask(request("example7", vec![first(), second()], 0)).await.expect("answer");
        assert_eq!(resp.statuses[0].current_limit, None, "replaced");
        let limit = resp.statuses[1].current_limit.as_ref().expect("the replacing limit");
        assert_eq!((limit.name.as_str(), limit.requests_per_unit), ("", 10));
    }
    // specific_limit (5 a second) was never charged: 5 in a row pass, if
    // within one second.
    let start = now_s();
    let alone = futures_codes(&mut face, &[("key_1", "value_1"), ("user", "bkthomps")], 5).await;
    if now_s() == start {
        assert_eq!(alone, [OK; 5]);
    }
}

/// Limitador reads `descriptors[0]` once per call: a second descriptor
/// with the same entries is not limited again.
#[tokio::test]
async fn peer_limitador_reads_the_first_descriptor_only() {
    let mut face = start_with(&each_status(imported("limitador/configuration.yaml"))).await;
    let d = || descriptor(&[("KEY_A", "VALUE_A")]);
    let resp = face.ask(request("example.org", vec![d(), d()], 0)).await.expect("answer");
    assert_eq!(codes(&resp), [OK, OK]);
    assert!(resp.statuses[1].current_limit.is_none());
    let resp =
        face.ask(request("example.org", vec![descriptor(&[("other", "x")]), d()], 0)).await.expect("answer");
    assert_eq!(resp.overall_code, OK, "descriptors[1] is not read");
    assert_eq!(face.ask(request("example.org", vec![d()], 0)).await.expect("answer").overall_code, OVER);
}

/// The shim trusts no caller: a counted refusal (`charge: every_hit`)
/// beside a limit that is not a window, or on a waiting request, is a bad
/// request (the document refuses such policies first).
#[tokio::test]
async fn a_counted_refusal_takes_windows_only_decided_at_once() {
    use sluice_policies::algorithm::Refusals;
    use sluice_policies::units::Millis;
    use sluice_policies::wire::{Check, CheckRequest, WireLimit};
    use sluice_shim::limiter::CheckError;
    let redis = Redis::start().expect("redis");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter");
    let window = WireLimit::FixedWindow { limit: 1, window_ms: Millis(60_000), cost: 1 };
    let bucket = WireLimit::TokenBucket { rate: 1, per_ms: Millis(1_000), burst: 1 };
    let request = |limits: Vec<WireLimit>, wait_ms| CheckRequest {
        checks: vec![Check {
            policy: "p".into(),
            key: "k".into(),
            limits,
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        }]
        .into(),
        now_us: None,
        id: None,
        wait_ms,
        views: Default::default(),
    };
    for bad in [request(vec![window, bucket], None), request(vec![window], Some(Millis(100)))] {
        let err = limiter.check_charging(&bad, Refusals::Counted).await.expect_err("refused");
        assert!(matches!(err, CheckError::BadRequest(_)), "{err:?}");
    }
    let good = limiter.check_charging(&request(vec![window], None), Refusals::Counted).await;
    assert!(good.expect("decided").allowed);
}

fn overridden(entries: &[(&str, &str)], requests_per_unit: u32, unit: RateLimitUnit) -> RateLimitDescriptor {
    RateLimitDescriptor {
        limit: Some(RateLimitOverride { requests_per_unit, unit: unit as i32 }),
        ..descriptor(entries)
    }
}

async fn overridden_codes(face: &mut Face, d: RateLimitDescriptor, n: usize) -> Vec<i32> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(face.ask(request("edge", vec![d.clone()], 0)).await.expect("an answer").overall_code);
    }
    out
}

/// envoyproxy/ratelimit: a descriptor's own `limit` (Envoy's override)
/// limits it alone, whatever rule it reaches (a value's own, `unlimited`,
/// a blocked value, shadow, none), unnamed, on the descriptor's counter of
/// that unit (the one its rule of the same unit counts on too); in a
/// domain with no rules it is ignored; 0 refuses. Imported documents
/// honour it; Sluice's own ignore it unless they say `honour`.
#[tokio::test]
async fn peer_a_descriptors_own_limit_overrides_the_rule() {
    let mut face = start_with(&imported("mixed.yaml")).await;
    // A lower limit than the value's rule (pro: 12 a minute), unnamed.
    let pro = overridden(&[("plan", "pro")], 3, RateLimitUnit::Day);
    assert_eq!(overridden_codes(&mut face, pro.clone(), 4).await, [OK, OK, OK, OVER]);
    let resp = face.ask(request("edge", vec![pro], 0)).await.expect("an answer");
    let limit = resp.statuses[0].current_limit.as_ref().expect("current_limit");
    assert_eq!((limit.name.as_str(), limit.requests_per_unit, limit.unit), ("", 3, Unit::Day as i32));
    // The rule's counter of the same unit: two by the rule, then the
    // override of 3 a month has one left.
    assert_eq!(futures_codes(&mut face, &[("tenant", "acme")], 2).await, [OK, OK]);
    let tenant = overridden(&[("tenant", "acme")], 3, RateLimitUnit::Month);
    assert_eq!(overridden_codes(&mut face, tenant, 2).await, [OK, OVER]);
    // Unlimited, blocked and shadow rules, and no rule at all, limited by it.
    for (entries, quota) in [
        (&[("plan", "internal")], 1),
        (&[("client_ip", "10.0.0.66")], 2),
        (&[("trial", "t1")], 1),
        (&[("nobody", "x")], 1),
    ] {
        let d = overridden(entries, quota, RateLimitUnit::Hour);
        let mut want = vec![OK; quota as usize];
        want.push(OVER);
        assert_eq!(overridden_codes(&mut face, d, quota as usize + 1).await, want, "{entries:?}");
    }
    // 0 refuses, with a limit of 0.
    let resp = face.ask(request("edge", vec![overridden(&[("plan", "free")], 0, RateLimitUnit::Minute)], 0));
    let resp = resp.await.expect("an answer");
    assert_eq!(resp.overall_code, OVER);
    assert_eq!(resp.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit), Some(0));
    // A domain with no rules: no limit.
    let elsewhere = request("nowhere", vec![overridden(&[("plan", "pro")], 1, RateLimitUnit::Hour)], 0);
    for _ in 0..2 {
        assert_eq!(face.ask(elsewhere.clone()).await.expect("an answer").overall_code, OK);
    }
    // An unknown unit is an invalid call (the peer fails it too).
    let unknown = overridden(&[("plan", "pro")], 1, RateLimitUnit::Unknown);
    let err = face.ask(request("edge", vec![unknown], 0)).await.expect_err("invalid");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    // Sluice's own documents: the policies hold the limits.
    let doc = imported("mixed.yaml").replace("\"honour\"", "\"ignore\"");
    let mut face = start_with(&doc).await;
    let d = overridden(&[("plan", "internal")], 1, RateLimitUnit::Hour);
    assert_eq!(overridden_codes(&mut face, d, 3).await, [OK, OK, OK]);
}

/// envoyproxy/ratelimit's `detailed_metric` (README example 8) and
/// `value_to_metric` (example 10) name the stats after the descriptor's
/// values: the face counts the decisions of those rules per descriptor in
/// `sluice_descriptor_decisions_total`, labelled with that name.
#[tokio::test]
async fn peer_detailed_metric_and_value_to_metric_label_the_descriptor() {
    let mut face = start_with(&imported("readme/example8.yaml")).await;
    for value in ["unspecified_value", "unspecified_value2", "unspecified_value2", "value1"] {
        let resp = face.ask(request("example8", vec![descriptor(&[("key1", value)])], 0)).await;
        assert_eq!(resp.expect("an answer").overall_code, OK);
    }
    let page = face.metrics().await;
    let count = |descriptor: &str| {
        sample(
            &page,
            &format!(
                r#"sluice_descriptor_decisions_total{{policy="example8_key1",descriptor="{descriptor}",result="allowed",face="rls"}}"#
            ),
        )
    };
    assert_eq!(count("example8.key1_unspecified_value"), 1.0);
    assert_eq!(count("example8.key1_unspecified_value2"), 2.0);
    assert!(!page.contains("example8.key1_value1"), "the value's own rule is named by its path");

    let mut face = start_with(&imported("readme/example10.yaml")).await;
    let entries = [("route", "api"), ("http_method", "GET"), ("subject_id", "123")];
    let resp = face.ask(request("example10", vec![descriptor(&entries)], 0)).await;
    assert_eq!(resp.expect("an answer").overall_code, OK);
    let page = face.metrics().await;
    assert!(
        page.contains(
            r#"descriptor="example10.route_api.http_method_GET.subject_id",result="allowed",face="rls"} 1"#
        ),
        "{page}"
    );
}

/// An imported Limitador document with a status per descriptor (`statuses:
/// each`), for the tests that read which limit answered.
fn each_status(doc: String) -> String {
    assert!(doc.contains(r#""statuses":"overall""#), "{doc}");
    doc.replace(r#""statuses":"overall""#, r#""statuses":"each""#)
}

/// Limitador answers the overall code alone: no statuses, and no headers
/// with its rate-limit headers off (their default). An imported Limitador
/// document says `statuses: overall` (and `headers: off`), so the whole
/// answer is Limitador's; `statuses: each` gives Sluice's statuses back.
#[tokio::test]
async fn peer_limitador_answers_the_overall_code_alone() {
    let doc = imported("limitador/examples.yaml");
    let mut face = start_with(&doc).await;
    let post = || request("test_namespace", vec![descriptor(&[("req.method", "POST"), ("user_id", "u")])], 0);
    let only = |code| RateLimitResponse { overall_code: code, ..RateLimitResponse::default() };
    // The POST limit: 5 a minute per user.
    for i in 0..5 {
        assert_eq!(face.ask(post()).await.expect("answer"), only(OK), "call {i}");
    }
    assert_eq!(face.ask(post()).await.expect("answer"), only(OVER));
    let mut each = start_with(&each_status(doc)).await;
    let resp = each.ask(post()).await.expect("answer");
    assert_eq!(codes(&resp), [OK]);
    assert_eq!(resp.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit), Some(5), "{resp:?}");
}

/// Envoy sends a descriptor with no entries, in its place, where every
/// action of a rate limit was skipped (`skip_if_absent`, as `sluice
/// envoy-config --face rls` renders the entries of a `descriptor_index`).
/// Both peers answer it: envoyproxy/ratelimit finds no rule (OK, no
/// limit); Limitador reads an empty `descriptors[N]`, so its limits
/// without conditions or variables apply. The face answered
/// INVALID_ARGUMENT (regression), which Envoy turns into its failure mode:
/// nothing was charged, or every request refused.
#[tokio::test]
async fn peer_an_empty_descriptor_keeps_its_place() {
    let doc = r#"{"policies": [
      {"name": "a", "match": {"domain": "d", "descriptor_index": 0, "entries": {"x-a": {"present": true}}},
       "limits": [{"type": "fixed_window", "limit": 7, "window": "1m"}]},
      {"name": "b", "match": {"domain": "d", "descriptor_index": 1, "entries": {"x-b": {"present": true}}},
       "limits": [{"type": "fixed_window", "limit": 9, "window": "1m"}]}
    ]}"#;
    let mut face = start_with(doc).await;
    let resp =
        face.ask(request("d", vec![descriptor(&[]), descriptor(&[("x-b", "1")])], 0)).await.expect("answer");
    assert_eq!(codes(&resp), [OK, OK]);
    assert!(resp.statuses[0].current_limit.is_none(), "no rule for an empty descriptor: {resp:?}");
    assert_eq!(resp.statuses[1].current_limit.as_ref().map(|l| l.requests_per_unit), Some(9), "b at index 1");
    let mut limitador = start_with(&each_status(imported("limitador/examples.yaml"))).await;
    let resp = limitador.ask(request("test_namespace", vec![descriptor(&[])], 0)).await.expect("answer");
    let limit = resp.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit);
    assert_eq!((resp.overall_code, limit), (OK, Some(1_000_000)), "the limit without conditions applies");
}

/// envoyproxy/ratelimit's `quota_mode`, imported as `quota`: a quota
/// descriptor over is answered over, but the call is refused only when
/// every quota descriptor of it is over, or when a descriptor that is not
/// a quota one is over. A shadow quota descriptor is never over; an
/// unlimited one is no quota descriptor.
#[tokio::test]
async fn peer_quota_mode_refuses_only_when_every_quota_descriptor_is_over() {
    let mut face = start_with(&imported("quota.yaml")).await;
    let mut call = async |ds: &[(&str, &str)]| {
        let descriptors = ds.iter().map(|e| descriptor(&[*e])).collect();
        face.ask(request("edge", descriptors, 0)).await
    };
    let both = [("a", "1"), ("b", "1")];
    let resp = call(&both).await.expect("answer");
    assert_eq!((resp.overall_code, codes(&resp)), (OK, vec![OK, OK]));
    let resp = call(&both).await.expect("answer");
    assert_eq!((resp.overall_code, codes(&resp)), (OK, vec![OVER, OK]), "one quota of two over");
    let resp = call(&both).await.expect("answer");
    assert_eq!((resp.overall_code, codes(&resp)), (OVER, vec![OVER, OVER]), "every quota over");
    // A quota descriptor within its quota, a rate limit over: refused.
    let mixed = [("a", "2"), ("r", "1")];
    let resp = call(&mixed).await.expect("answer");
    assert_eq!((resp.overall_code, codes(&resp)), (OK, vec![OK, OK]));
    let resp = call(&[("b", "2"), ("r", "1")]).await.expect("answer");
    assert_eq!((resp.overall_code, codes(&resp)), (OVER, vec![OK, OVER]), "the rate limit refuses");
    // A shadow quota passes: the quota over alone does not refuse.
    let resp = call(&[("a", "1"), ("s", "1")]).await.expect("answer");
    assert_eq!((resp.overall_code, codes(&resp)), (OK, vec![OVER, OK]));
    // An unlimited descriptor is no quota one: the only quota is over.
    let resp = call(&[("a", "1"), ("u", "x")]).await.expect("answer");
    assert_eq!((resp.overall_code, codes(&resp)), (OVER, vec![OVER, OK]));
}

/// A protobuf `Struct` value as JSON, to compare.
fn json(v: &envoy_types::pb::google::protobuf::Value) -> serde_json::Value {
    use envoy_types::pb::google::protobuf::value::Kind;
    match &v.kind {
        Some(Kind::StringValue(s)) => serde_json::json!(s),
        Some(Kind::NumberValue(n)) => serde_json::json!(n),
        Some(Kind::BoolValue(b)) => serde_json::json!(b),
        Some(Kind::ListValue(l)) => l.values.iter().map(json).collect(),
        Some(Kind::StructValue(s)) => s.fields.iter().map(|(k, v)| (k.clone(), json(v))).collect(),
        Some(Kind::NullValue(_)) | None => serde_json::Value::Null,
    }
}

/// envoyproxy/ratelimit's `metadata`, imported as the policy's
/// `metadata`: no `dynamic_metadata` by default (the peer's
/// `RESPONSE_DYNAMIC_METADATA` is off by default); with the document's
/// `dynamic_metadata`, the peer's struct: the domain, each descriptor's
/// entries (and its own `hitsAddend`), the call's `hitsAddend`, and the
/// metadata of the descriptors that passed, the first one's keys kept.
#[tokio::test]
async fn peer_metadata_is_answered_as_dynamic_metadata_when_asked() {
    let call = || {
        let mut a = descriptor(&[("a", "1")]);
        a.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 1 });
        request("edge", vec![a, descriptor(&[("b", "1")]), descriptor(&[("u", "x")])], 0)
    };
    let doc = imported("metadata.yaml");
    let mut off = start_with(&doc).await;
    assert_eq!(off.ask(call()).await.expect("answer").dynamic_metadata, None, "off by default");
    let on = doc.replacen('{', r#"{"dynamic_metadata": true, "#, 1);
    let mut face = start_with(&on).await;
    let metadata = |resp: RateLimitResponse| {
        let fields = resp.dynamic_metadata.expect("dynamic_metadata").fields;
        fields.iter().map(|(k, v)| (k.clone(), json(v))).collect::<serde_json::Value>()
    };
    let descriptors = serde_json::json!([{"entries": ["a=1"], "hitsAddend": 1.0}, {"entries": ["b=1"]}, {"entries": ["u=x"]}]);
    let first = metadata(face.ask(call()).await.expect("answer"));
    assert_eq!(
        first,
        serde_json::json!({"domain": "edge", "descriptors": descriptors,
            "metadata": {"team": "payments", "tags": {"tier": "gold", "zone": "eu"}, "weight": 2.0}})
    );
    // `a` is over: only `b` passed (an unlimited descriptor adds nothing).
    let mut second = call();
    second.hits_addend = 2;
    let resp = face.ask(second).await.expect("answer");
    assert_eq!(codes(&resp), [OVER, OK, OK]);
    assert_eq!(
        metadata(resp),
        serde_json::json!({"domain": "edge", "descriptors": descriptors, "hitsAddend": 2.0,
            "metadata": {"team": "search", "tags": {"zone": "eu"}, "weight": 2.0}})
    );
}
