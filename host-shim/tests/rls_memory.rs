//! The RLS face's over-limit cache (`host-shim/src/grpc/memory.rs`, core's
//! `cache` in the shim's memory), on an in-process shim with a real Redis
//! and a test clock that the face and Redis's scripts share: a call over
//! its limit is answered from memory with no script call (counted in
//! Redis's `INFO commandstats`), with the same answer the Redis path gives
//! at the same moment, for every limit kind; after the wait the call
//! reaches Redis and is admitted; a policy that can be refunded or waits is
//! never answered from memory; a slot's collision never denies another key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice_harness::client::http;
use sluice_harness::gateway::sample;
use sluice_harness::Redis;
use sluice_policies::algorithm::Refusals;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{Check, CheckRequest, WireLimit};
use sluice_shim::grpc::memory::Memory;
use sluice_shim::grpc::{router, Faces};
use sluice_shim::limiter::Limiter;
use sluice_shim::server::{run_shared, serve, Options};
use sluice_shim::store::Target;
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// 2027-01-15T08:00:01.234Z: a minute's and an hour's window are 1.234 s old.
const T0_MS: u64 = 1_800_000_001_234;

/// One policy per limit kind, each on its own `generic_key`.
const KINDS: &[(&str, &str, u32)] = &[
    ("fixed", r#"{"type":"fixed_window","limit":2,"window":"1m"}"#, 1),
    ("first-hit", r#"{"type":"fixed_window","limit":2,"window":"10s","start":"first_hit"}"#, 1),
    ("sliding", r#"{"type":"sliding_window","limit":2,"window":"1m"}"#, 1),
    ("approx", r#"{"type":"sliding_window","limit":2,"window":"1m","approximate":true}"#, 1),
    ("bucket", r#"{"type":"token_bucket","rate":1,"per":"10s","burst":2}"#, 1),
    ("leaky", r#"{"type":"leaky_bucket","capacity":2,"drain":"20s"}"#, 1),
    ("every", r#"{"type":"interval","every":"7s"}"#, 1),
    ("points", r#"{"type":"points","capacity":10,"refill":"1m","cost":1}"#, 3),
    ("day", r#"{"type":"fixed_window","limit":2,"window":{"calendar":"day","zone":"UTC"}}"#, 1),
    ("day-points", r#"{"type":"points","capacity":10,"refill":{"calendar":"day","zone":"UTC"},"cost":1}"#, 3),
    (
        "two",
        r#"{"type":"fixed_window","limit":3,"window":"1m"},{"type":"token_bucket","rate":1,"per":"5s","burst":2}"#,
        1,
    ),
];

/// [`KINDS`], a shadow policy, and whatever `fields` adds at the top.
fn document(fields: &str) -> String {
    let mut policies: Vec<String> = KINDS
        .iter()
        .map(|(name, limits, _)| {
            format!(
                r#"{{"name": "{name}", "match": {{"domain": "edge", "entries": {{"generic_key": {{"equals": "{name}"}}}}}}, "limits": [{limits}]}}"#
            )
        })
        .collect();
    policies.push(
        r#"{"name": "trial", "shadow": true, "match": {"domain": "edge", "entries": {"generic_key": {"equals": "trial"}}},
            "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]}"#
            .to_string(),
    );
    policies.push(
        r#"{"name": "per-client", "match": {"domain": "edge", "entries": {"client": {"present": true}}},
            "key": ["entry:client"], "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]}"#
            .to_string(),
    );
    format!(r#"{{"headers": "always", {fields} "policies": [{}]}}"#, policies.join(",\n"))
}

/// Two faces on one shim and one Redis, at one test clock: `cached` with
/// the document's over-limit cache, `bare` with none (every call reaches
/// Redis: the Redis path's answer at the same moment).
struct Setup {
    cached: RateLimitServiceClient<Channel>,
    bare: RateLimitServiceClient<Channel>,
    clock: Arc<AtomicU64>,
    http_port: u16,
    redis: Redis,
}

async fn start(fields: &str) -> Setup {
    let redis = Redis::start().expect("redis");
    let limiter =
        Arc::new(Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter"));
    let clock = Arc::new(AtomicU64::new(T0_MS));
    let mut clients = Vec::new();
    for doc in [document(fields), document(r#""over_limit_cache_slots": 0,"#)] {
        let doc = Arc::new(sluice_policies::parse(&doc).expect("the document"));
        let faces = Faces::new(limiter.clone(), doc).with_test_clock(clock.clone());
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = grpc.local_addr().expect("addr").port();
        let drain = limiter.drain().clone();
        tokio::spawn(serve(grpc, router(faces), Options::default(), std::future::pending(), drain, None));
        clients.push(
            RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}")).await.expect("connect"),
        );
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let http_port = listener.local_addr().expect("addr").port();
    tokio::spawn(run_shared(listener, limiter, Options::default(), std::future::pending()));
    let bare = clients.pop().expect("bare");
    let cached = clients.pop().expect("cached");
    Setup { cached, bare, clock, http_port, redis }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() }).collect(),
        ..RateLimitDescriptor::default()
    }
}

fn call(names: &[&str], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".to_string(),
        descriptors: names.iter().map(|n| descriptor(&[("generic_key", n)])).collect(),
        hits_addend: hits,
    }
}

async fn ask(client: &mut RateLimitServiceClient<Channel>, req: RateLimitRequest) -> RateLimitResponse {
    client.should_rate_limit(req).await.expect("an answer").into_inner()
}

/// Script calls Redis has run (FCALL, EVALSHA, EVAL), from `INFO
/// commandstats`: each a decision the shim asked Redis for.
fn script_calls(redis: &Redis) -> u64 {
    let mut conn = redis.connection().expect("a connection");
    let info: String = redis::cmd("INFO").arg("commandstats").query(&mut conn).expect("INFO");
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
        .filter(|(name, _)| matches!(*name, "fcall" | "evalsha" | "eval"))
        .filter_map(|(_, stats)| {
            stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?.parse::<u64>().ok()
        })
        .sum()
}

impl Setup {
    fn advance(&self, ms: u64) {
        self.clock.fetch_add(ms, Ordering::Relaxed);
    }

    /// Calls `req` on the cached face, 100 ms apart, until it is over its
    /// limit: that refusal, from Redis.
    async fn exhaust(&mut self, req: &RateLimitRequest) -> RateLimitResponse {
        for _ in 0..20 {
            let before = script_calls(&self.redis);
            let resp = ask(&mut self.cached, req.clone()).await;
            if resp.overall_code == OVER {
                assert!(script_calls(&self.redis) > before, "the first refusal comes from Redis: {resp:?}");
                return resp;
            }
            self.advance(100);
        }
        panic!("never over its limit: {req:?}");
    }

    async fn metrics(&self) -> String {
        let (status, page) = http(self.http_port, "GET", "/metrics", "").await;
        assert_eq!(status, 200);
        page
    }
}

/// The whole seconds each refusing status of an answer says it lasts.
fn waits_s(resp: &RateLimitResponse) -> impl Iterator<Item = u64> + '_ {
    let over = resp.statuses.iter().filter(|s| s.code == OVER);
    over.map(|s| s.duration_until_reset.as_ref().map_or(0, |d| d.seconds as u64))
}

/// The longest: the call is admitted after it.
fn wait_s(resp: &RateLimitResponse) -> u64 {
    waits_s(resp).max().expect("a status over its limit")
}

/// Once the shim refused a call, the same call is refused from memory with
/// no script call, until the window's end; each counts as a denial of the
/// face, and as answered from the cache.
#[tokio::test]
async fn a_key_over_its_limit_is_answered_from_memory_with_no_redis_call() {
    let mut s = start("").await;
    let fixed = || call(&["fixed"], 0);
    for _ in 0..2 {
        assert_eq!(ask(&mut s.cached, fixed()).await.overall_code, OK);
    }
    let first = s.exhaust(&fixed()).await;
    let before = script_calls(&s.redis);
    for _ in 0..5 {
        s.advance(1_000);
        let resp = ask(&mut s.cached, fixed()).await;
        assert_eq!(resp.overall_code, OVER);
        assert_eq!(resp.statuses[0].limit_remaining, 0);
    }
    assert_eq!(script_calls(&s.redis), before, "five refusals, no script call");
    assert_eq!(wait_s(&first), 59, "the window ends 58.766 s after the first refusal");
    let page = s.metrics().await;
    let denied = r#"sluice_decisions_total{policy="fixed",result="denied",face="rls"}"#;
    assert_eq!(sample(&page, denied), 6.0, "a denial from memory is a denial");
    assert_eq!(sample(&page, r#"sluice_cache_denied_total{policy="fixed",face="rls"}"#), 5.0);
    let (status, body) = http(s.http_port, "GET", "/dashboard.json", "").await;
    assert_eq!(status, 200);
    let board: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let fixed =
        board["policies"].as_array().and_then(|p| p.iter().find(|p| p["name"] == "fixed")).expect("fixed");
    assert_eq!(
        (fixed["totals"]["denied"].as_u64(), fixed["totals"]["cache_denied"].as_u64()),
        (Some(6), Some(5))
    );
}

/// For every limit kind (and two limits in one policy, several descriptors
/// in one call, a shadow policy), the answer from memory is the Redis
/// path's at the same moment, field for field: codes, `current_limit`,
/// `limit_remaining`, `duration_until_reset` and the RateLimit headers, at
/// the refusal and halfway through its wait. After the wait, the call
/// reaches Redis and is admitted.
#[tokio::test]
async fn the_answer_from_memory_is_the_redis_paths_for_every_kind() {
    let mut s = start("").await;
    let mut cases: Vec<(String, RateLimitRequest)> =
        KINDS.iter().map(|(name, _, hits)| (name.to_string(), call(&[name], *hits))).collect();
    cases.push(("two descriptors".into(), call(&["fixed", "bucket"], 0)));
    cases.push(("shadow".into(), call(&["trial", "fixed"], 0)));
    for (name, req) in cases {
        let first = s.exhaust(&req).await;
        let before = script_calls(&s.redis);
        let memory = ask(&mut s.cached, req.clone()).await;
        assert_eq!(script_calls(&s.redis), before, "{name}: answered from memory");
        let redis_path = ask(&mut s.bare, req.clone()).await;
        assert_eq!(memory, redis_path, "{name}: at the refusal");
        assert_eq!(memory, first, "{name}: as the refusal itself");
        // Each wait is over (its seconds - 1) s: halfway through the
        // shortest one's whole seconds, every entry of the call lives.
        let (shortest_ms, wait_ms) = (waits_s(&first).min().unwrap_or(0) * 1000, wait_s(&first) * 1000);
        assert!(shortest_ms >= 2000, "{name}: waits {shortest_ms} ms");
        s.advance(shortest_ms / 2);
        let before = script_calls(&s.redis);
        let memory = ask(&mut s.cached, req.clone()).await;
        assert_eq!(script_calls(&s.redis), before, "{name}: halfway, from memory");
        let redis_path = ask(&mut s.bare, req.clone()).await;
        assert_eq!(memory, redis_path, "{name}: halfway");
        assert_eq!(memory.overall_code, OVER, "{name}: halfway");
        s.advance(wait_ms - shortest_ms / 2);
        let before = script_calls(&s.redis);
        let admitted = ask(&mut s.cached, req.clone()).await;
        assert!(script_calls(&s.redis) > before, "{name}: after the wait, Redis decides");
        assert_eq!(admitted.overall_code, OK, "{name}: after the wait: {admitted:?}");
    }
}

/// A slot that two keys share: one slot for every check. A key's entry
/// never refuses another key: the other key's call reaches Redis and is
/// admitted; when its own refusal overwrites the slot, the first key is
/// asked of Redis again, which still refuses it.
#[tokio::test]
async fn a_collision_never_denies_another_key() {
    let mut s = start(r#""over_limit_cache_slots": 1,"#).await;
    let client = |c: &str| RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor(&[("client", c)])],
        hits_addend: 0,
    };
    assert_eq!(ask(&mut s.cached, client("a")).await.overall_code, OK);
    s.exhaust(&client("a")).await;
    let before = script_calls(&s.redis);
    assert_eq!(ask(&mut s.cached, client("a")).await.overall_code, OVER);
    assert_eq!(script_calls(&s.redis), before, "a from memory");
    assert_eq!(ask(&mut s.cached, client("b")).await.overall_code, OK, "b is not refused for a");
    assert_eq!(script_calls(&s.redis), before + 1, "b reached Redis");
    assert_eq!(ask(&mut s.cached, client("a")).await.overall_code, OVER);
    assert_eq!(script_calls(&s.redis), before + 1, "a's entry stands");
    assert_eq!(ask(&mut s.cached, client("b")).await.overall_code, OVER, "b's own refusal, from Redis");
    assert_eq!(script_calls(&s.redis), before + 2);
    assert_eq!(ask(&mut s.cached, client("a")).await.overall_code, OVER, "a, from Redis again");
    assert_eq!(script_calls(&s.redis), before + 3, "b's entry took the slot: a is a miss");
}

/// A policy that can be refunded (`points` with an `actual_cost_header`,
/// or in `llm_tokens`) or that waits is never answered from memory: the
/// RLS face refuses such policies at load time, and the store follows
/// core's rules whatever reaches it. Their refusals, from the real
/// scripts, are offered to it and never served back.
#[tokio::test]
async fn a_policy_that_can_be_refunded_or_waits_is_never_answered_from_memory() {
    let redis = Redis::start().expect("redis");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter");
    let doc = sluice_policies::parse(
        r#"{"policies": [
          {"name": "settles", "limits": [{"type": "points", "capacity": 10, "refill": "1h", "cost": 10, "actual_cost_header": "x-cost"}]},
          {"name": "tokens", "llm": {"api": "openai_chat"}, "limits": [{"type": "points", "capacity": 10, "refill": "1h", "cost": "llm_tokens"}]},
          {"name": "waits", "wait": {"timeout": "2s"}, "limits": [{"type": "fixed_window", "limit": 1, "window": "1h"}]},
          {"name": "plain", "limits": [{"type": "fixed_window", "limit": 1, "window": "1h"}]}
        ]}"#,
    )
    .expect("the document");
    let memory = Memory::default();
    let now_ms = T0_MS;
    let mut served = Vec::new();
    for policy in doc.policies.iter() {
        let limits = policy.limits.iter().map(|l| WireLimit::with_cost(l, 10)).collect();
        let check = Check {
            policy: policy.name.as_str().into(),
            key: "k".into(),
            limits,
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        };
        let checks = vec![check];
        let req = CheckRequest {
            checks: checks.as_slice().into(),
            id: None,
            now_us: Some(Micros(now_ms * 1000)),
            wait_ms: None,
            views: Default::default(),
        };
        assert!(limiter.check(&req).await.expect("admitted").allowed, "{}", policy.name);
        let refused = limiter.check(&req).await.expect("refused");
        assert!(!refused.allowed && refused.retry_after_ms > Some(Millis(0)), "{}: {refused:?}", policy.name);
        memory.record(1024, &[policy], &checks, &refused, now_ms, Refusals::Uncharged);
        if memory.deny(1024, &[policy], &checks, now_ms + 1).is_some() {
            served.push(policy.name.as_str());
        }
    }
    assert_eq!(served, ["plain"], "only the plain window's refusal is served from memory");
}
