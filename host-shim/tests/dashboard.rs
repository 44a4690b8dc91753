//! `GET /dashboard.json`, read back after real checks: shims in process on
//! real sockets, in front of one real redis-server. The dashboard lists
//! every policy of its document before any traffic, with its limits; after
//! checks, its rates and totals, its busiest keys, and each key's state as
//! Redis holds it: remaining for a window and a bucket, leases held for a
//! concurrency limit, charged by any shim of the fleet. The last minutes
//! of each policy, with the failure-mode passes the filters report at
//! `POST /v1/report`, and the reports it refuses.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sluice_harness::client::http;
use sluice_harness::Redis;
use sluice_policies::units::Millis;
use sluice_policies::wire::{
    Check, CheckRequest, CheckResponse, ReleaseRequest, WireLimit, MAX_REPORT_BODY, MAX_REPORT_ENTRIES,
    REPORT_PATH,
};
use sluice_shim::dashboard;
use sluice_shim::limiter::Limiter;
use sluice_shim::server::{run, Options};
use sluice_shim::store::Target;

const DOCUMENT: &str = r#"{"policies": [
  {"name": "partner-api", "key": ["header:x-api-key"],
   "limits": [{"type": "sliding_window", "limit": 5, "window": "1m"},
              {"type": "token_bucket", "rate": 1, "per": "1h", "burst": 10}]},
  {"name": "erp", "key": ["header:x-tenant"], "limits": [{"type": "concurrency", "limit": 4, "lease": "1m"}]},
  {"name": "quiet", "limits": [{"type": "interval", "every": "1s"}]}
]}"#;

fn partner_limits() -> Vec<WireLimit> {
    vec![
        WireLimit::SlidingWindow { limit: 5, window_ms: Millis(60_000), approximate: false },
        WireLimit::TokenBucket { rate: 1, per_ms: Millis(3_600_000), burst: 10 },
    ]
}

/// A shim with the dashboard on a free port until the test ends; its port.
async fn serve(redis: &Redis, document: Option<&str>) -> u16 {
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter");
    let policies = document.map(|d| Arc::new(sluice_policies::parse(d).expect("the document parses")));
    let options = Options {
        dashboard: dashboard::Options { policies: policies.into(), playground: None },
        ..Options::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(run(listener, limiter, options, std::future::pending()));
    port
}

/// Posts one check; its answer.
async fn check(port: u16, id: &str, policy: &str, key: &str, limits: Vec<WireLimit>) -> CheckResponse {
    let check = Check {
        policy: policy.into(),
        key: key.into(),
        limits,
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    };
    let req = CheckRequest {
        checks: vec![check].into(),
        id: Some(id.to_string().into()),
        now_us: None,
        wait_ms: None,
        views: Default::default(),
    };
    let (status, body) = http(port, "POST", "/v1/check", &serde_json::to_string(&req).expect("json")).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("a check answer")
}

async fn dashboard(port: u16) -> Value {
    let (status, body) = http(port, "GET", "/dashboard.json", "").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

fn policy<'a>(board: &'a Value, name: &str) -> &'a Value {
    board["policies"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no policy {name} in {board:#}"))
}

fn key<'a>(policy: &'a Value, key: &str) -> &'a Value {
    policy["keys"]
        .as_array()
        .and_then(|all| all.iter().find(|k| k["key"] == key))
        .unwrap_or_else(|| panic!("no key {key} in {policy:#}"))
}

/// Before any traffic, every policy of the document shows with its limits,
/// in the document's order, and nothing counted.
#[tokio::test]
async fn the_document_shows_every_policy_before_traffic() {
    let redis = Redis::start().expect("redis");
    let port = serve(&redis, Some(DOCUMENT)).await;
    let board = dashboard(port).await;
    let names: Vec<&str> =
        board["policies"].as_array().expect("policies").iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, ["partner-api", "erp", "quiet"]);
    assert!(board["now_ms"].as_u64().is_some_and(|ms| ms > 0), "Redis's clock: {board:#}");
    let partner = policy(&board, "partner-api");
    assert_eq!(partner["source"], "document");
    let texts: Vec<&str> =
        partner["limits"].as_array().expect("limits").iter().filter_map(|l| l["text"].as_str()).collect();
    assert_eq!(texts, ["5 per 1m", "1 per 1h, burst 10"]);
    assert_eq!(policy(&board, "erp")["limits"][0]["capacity"], 4);
    assert_eq!(partner["totals"]["allowed"], 0);
    assert_eq!(partner["keys"], Value::Array(Vec::new()));
}

/// Checks through two shims of one fleet: the busiest keys are the first
/// shim's, their state is Redis's (what both shims charged), and a denial,
/// held leases, a release and a policy only seen in traffic all show.
#[tokio::test]
async fn busy_keys_show_their_state_from_redis() {
    let redis = Redis::start().expect("redis");
    let port = serve(&redis, Some(DOCUMENT)).await;
    let other = serve(&redis, None).await;

    for i in 0..3 {
        let resp = check(port, &format!("a{i}"), "partner-api", "alice", partner_limits()).await;
        assert!(resp.allowed);
    }
    check(port, "b0", "partner-api", "bob", partner_limits()).await;
    // Another gateway's shim charges alice twice more: her window is full.
    for i in 0..2 {
        check(other, &format!("o{i}"), "partner-api", "alice", partner_limits()).await;
    }
    let resp = check(port, "a3", "partner-api", "alice", partner_limits()).await;
    assert!(!resp.allowed, "the sixth of 5 per minute");
    let erp = || vec![WireLimit::Concurrency { limit: 4, lease_ms: Millis(60_000) }];
    for i in 0..3 {
        assert!(check(port, &format!("e{i}"), "erp", "acme", erp()).await.allowed);
    }
    let release = ReleaseRequest {
        lease: "e0".into(),
        checks: vec![Check {
            policy: "erp".into(),
            key: "acme".into(),
            limits: erp(),
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        }],
    };
    let (status, body) =
        http(port, "POST", "/v1/release", &serde_json::to_string(&release).expect("json")).await;
    assert_eq!(status, 200, "{body}");
    let fixed = vec![WireLimit::FixedWindow { limit: 100, window_ms: Millis(86_400_000), cost: 1 }];
    check(port, "u0", "unlisted", "k", fixed).await;

    let board = dashboard(port).await;
    let partner = policy(&board, "partner-api");
    assert_eq!(partner["totals"]["allowed"], 4, "this shim's admissions: {partner:#}");
    assert_eq!(partner["totals"]["denied"], 1);
    assert_eq!(partner["keys"][0]["key"], "alice", "the busiest first");
    let alice = key(partner, "alice");
    assert_eq!(alice["checks"], 4, "this shim's checks of alice");
    assert_eq!(alice["state"][0]["remaining"], 0, "5 per minute, all 5 taken by both shims: {alice:#}");
    assert!(alice["state"][0]["reset_ms"].as_u64().is_some_and(|ms| ms > 0 && ms <= 60_000));
    assert_eq!(alice["state"][1]["remaining"], 5, "10 tokens, 5 taken: {alice:#}");
    let bob = key(partner, "bob");
    assert_eq!(
        (&bob["state"][0]["remaining"], &bob["state"][1]["remaining"]),
        (&Value::from(4), &Value::from(9))
    );

    let acme = key(policy(&board, "erp"), "acme");
    assert_eq!(acme["state"][0]["held"], 2, "three leases, one released: {acme:#}");
    assert_eq!(acme["state"][0]["remaining"], 2);
    assert_eq!(acme["state"][0]["waiters"], 0);

    let unlisted = policy(&board, "unlisted");
    assert_eq!(unlisted["source"], "traffic");
    assert_eq!(unlisted["limits"][0]["text"], "100 per 1d");
    assert_eq!(key(unlisted, "k")["state"][0]["remaining"], 99);
    // The other shim's own dashboard saw only its own checks.
    let theirs = dashboard(other).await;
    assert_eq!(policy(&theirs, "partner-api")["totals"]["allowed"], 2);
    assert_eq!(key(policy(&theirs, "partner-api"), "alice")["state"][0]["remaining"], 0);
}

/// The page and its assets are served by the shim itself; `/playground`
/// without its files answers 404 saying how to build them.
#[tokio::test]
async fn the_page_is_embedded_and_a_missing_playground_says_so() {
    let redis = Redis::start().expect("redis");
    let port = serve(&redis, None).await;
    let (status, page) = http(port, "GET", "/", "").await;
    assert_eq!(status, 200);
    assert!(page.contains("<script src=\"/dashboard.js\">"), "{page}");
    for asset in ["/dashboard.js", "/dashboard.css"] {
        assert_eq!(http(port, "GET", asset, "").await.0, 200, "{asset}");
    }
    let (status, _) = http(port, "GET", "/playground", "").await;
    assert_eq!(status, 308, "to /playground/, where the page's relative links work");
    let (status, body) = http(port, "GET", "/playground/", "").await;
    assert_eq!(status, 404);
    assert!(body.contains("cargo xtask playground"), "{body}");
}

/// The sum of one of a policy's history series, and its length.
fn history(policy: &Value, series: &str) -> (u64, usize) {
    let counts = policy["history"][series].as_array().unwrap_or_else(|| panic!("no {series} in {policy:#}"));
    (counts.iter().filter_map(Value::as_u64).sum(), counts.len())
}

/// A report of failure-mode passes lands in the policy's history and
/// totals beside the checks this shim decided; a policy it never checked
/// shows zeros over the whole window.
#[tokio::test]
async fn reported_failure_passes_show_in_the_history() {
    let redis = Redis::start().expect("redis");
    let port = serve(&redis, Some(DOCUMENT)).await;
    assert_eq!(history(policy(&dashboard(port).await, "partner-api"), "failure_passes"), (0, 120));
    for i in 0..2 {
        assert!(check(port, &format!("h{i}"), "partner-api", "alice", partner_limits()).await.allowed);
    }
    let report = r#"{"passes": [{"policy": "partner-api", "count": 3}, {"policy": "quiet", "count": 1}]}"#;
    let (status, body) = http(port, "POST", REPORT_PATH, report).await;
    assert_eq!((status, body.as_str()), (200, "{}"));

    let board = dashboard(port).await;
    let partner = policy(&board, "partner-api");
    assert_eq!(partner["history"]["bucket_seconds"], 5);
    assert_eq!(history(partner, "allowed"), (2, 120), "{partner:#}");
    assert_eq!(history(partner, "failure_passes"), (3, 120));
    assert_eq!(history(partner, "denied"), (0, 120));
    assert_eq!(partner["totals"]["failure_passes"], 3);
    assert_eq!(partner["totals"]["allowed"], 2, "a pass is not an admission");
    assert_eq!(history(policy(&board, "quiet"), "failure_passes"), (1, 120));
    assert_eq!(history(policy(&board, "erp"), "allowed"), (0, 120));
}

/// Bad reports are refused with a reason (400), never half counted: not
/// JSON, an unknown field, a negative count, an invalid policy name, more
/// entries than a report may carry, a body over the report's bound.
#[tokio::test]
async fn bad_reports_are_refused_with_a_reason() {
    let redis = Redis::start().expect("redis");
    let port = serve(&redis, Some(DOCUMENT)).await;
    let entry = r#"{"policy": "quiet", "count": 1}"#;
    let many = format!(r#"{{"passes": [{}]}}"#, vec![entry; MAX_REPORT_ENTRIES + 1].join(","));
    let large =
        format!(r#"{{"passes": [{{"policy": "quiet", "count": 1{}}}]}}"#, " ".repeat(MAX_REPORT_BODY));
    let cases = [
        ("not json", "malformed request"),
        (r#"{"passes": [], "extra": 1}"#, "unknown field `extra`"),
        (r#"{"passes": [{"policy": "quiet", "count": -1}]}"#, "malformed request"),
        (
            r#"{"passes": [{"policy": "quiet", "count": 1}, {"policy": "a b", "count": 1}]}"#,
            "passes[1].policy: invalid policy name \"a b\"",
        ),
        (many.as_str(), "passes: 257 entries, more than the 256 a report may carry"),
        (large.as_str(), "more than the 32768 a report may be"),
    ];
    for (body, reason) in cases {
        let (status, answer) = http(port, "POST", REPORT_PATH, body).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer.contains(reason), "{answer:?} should say {reason:?}");
    }
    let board = dashboard(port).await;
    let quiet = policy(&board, "quiet");
    assert_eq!(history(quiet, "failure_passes").0, 0, "nothing counted: {quiet:#}");
    assert_eq!(quiet["totals"]["failure_passes"], 0);
}

/// A token budget (a policy's `llm`) shows in tokens: its limit says
/// "LLM tokens" and carries the unit, and a key's state counts what its
/// reservations left.
#[tokio::test]
async fn a_token_budget_shows_in_tokens() {
    let redis = Redis::start().expect("redis");
    let document = r#"{"policies": [{"name": "team", "key": ["header:x-team"],
        "llm": {"api": "openai_chat"},
        "limits": [{"type": "points", "capacity": 10000, "refill": "1d", "cost": "llm_tokens"},
                   {"type": "fixed_window", "limit": 600, "window": "1m"}]}]}"#;
    let port = serve(&redis, Some(document)).await;
    let limits = vec![
        WireLimit::Points { capacity: 10_000, refill_ms: Millis(86_400_000), cost: 300 },
        WireLimit::FixedWindow { limit: 600, window_ms: Millis(60_000), cost: 1 },
    ];
    assert!(check(port, "r1", "team", "blue", limits).await.allowed);
    let board = dashboard(port).await;
    let team = policy(&board, "team");
    assert_eq!(team["limits"][0]["unit"], "tokens");
    assert!(
        team["limits"][0]["text"].as_str().is_some_and(|t| t.starts_with("10000 LLM tokens")),
        "{team:#}"
    );
    assert!(team["limits"][1].get("unit").is_none(), "a request limit counts requests");
    let blue = key(team, "blue");
    assert_eq!(blue["state"][0]["remaining"], 9_700, "{blue:#}");
}

/// Every level of a hierarchy shows from its own keys. The checks are the
/// plan's (`sluice_policies::plan`), as a face sends them; the organisation
/// and each team are keys of their own, each with its own limits' state.
/// Regression: the dashboard read a hierarchy's every limit under the
/// organisation's key, so with every level a fixed window of one hour it
/// showed no state ("two limits share the key …"), and with other windows
/// one team's count for another.
#[tokio::test]
async fn every_level_of_a_hierarchy_shows_from_its_own_keys() {
    use sluice_policies::plan::{plan, Descriptor};
    use sluice_policies::request::SimpleRequest;
    let redis = Redis::start().expect("redis");
    let document = r#"{"policies": [{"name": "hier", "key": ["header:x-org"],
        "limits": [{"type": "fixed_window", "limit": 100, "window": "1h"}],
        "levels": [{"name": "team", "key": ["header:x-org", "header:x-team"],
                    "limits": [{"type": "fixed_window", "limit": 60, "window": "1h"}]}]}]}"#;
    let port = serve(&redis, Some(document)).await;
    let doc = sluice_policies::parse(document).expect("the document parses");
    for (i, team) in ["a", "a", "a", "a", "a", "b", "b"].into_iter().enumerate() {
        let request = SimpleRequest::new("GET", "/").header("x-org", "acme").header("x-team", team);
        let plan = plan(&doc, &[Descriptor { request, hits: 1 }]).expect("plans");
        for mut req in plan.enforced.requests() {
            req.id = Some(format!("r{i}").into());
            let (status, body) =
                http(port, "POST", "/v1/check", &serde_json::to_string(&req).expect("json")).await;
            assert_eq!(status, 200, "{body}");
        }
    }
    let board = dashboard(port).await;
    let hier = policy(&board, "hier");
    let org = key(hier, "acme");
    assert_eq!(org["state"][0]["remaining"], 93, "seven requests of the organisation: {org:#}");
    assert!(org["state"][1].is_null(), "the team's limit is not the organisation's: {org:#}");
    let a = key(hier, "acme:@team:a");
    assert!(a["state"][0].is_null(), "{a:#}");
    assert_eq!(a["state"][1]["remaining"], 55, "five of team a's: {a:#}");
    assert_eq!(a["checks"], 5);
    let b = key(hier, "acme:@team:b");
    assert_eq!(b["state"][1]["remaining"], 58, "two of team b's: {b:#}");
}

/// Every denial counts, wherever it was answered: the denials a filter
/// answered from its over-limit cache (reported at `POST /v1/report`) count
/// in the policy's denied total and history beside this shim's own, and
/// `cache_denied` says how many of them the cache answered. Regression: the
/// dashboard counted only the shim's denials (a policy showed 1 where Envoy
/// had refused 10).
#[tokio::test]
async fn denials_from_the_over_limit_cache_count_with_where_they_were_answered() {
    let redis = Redis::start().expect("redis");
    let port = serve(&redis, Some(DOCUMENT)).await;
    let limits = || vec![WireLimit::FixedWindow { limit: 1, window_ms: Millis(60_000), cost: 1 }];
    assert!(check(port, "c0", "quiet", "k", limits()).await.allowed);
    assert!(!check(port, "c1", "quiet", "k", limits()).await.allowed);
    let report = r#"{"passes": [], "cache_denied": [{"policy": "quiet", "count": 9}]}"#;
    let (status, body) = http(port, "POST", REPORT_PATH, report).await;
    assert_eq!((status, body.as_str()), (200, "{}"));
    let board = dashboard(port).await;
    let quiet = policy(&board, "quiet");
    assert_eq!(quiet["totals"]["denied"], 10, "one by the shim, nine by the cache: {quiet:#}");
    assert_eq!(quiet["totals"]["cache_denied"], 9);
    assert_eq!(history(quiet, "denied").0, 10);
}

/// A budget several policies share (a policy's `budget`) shows once, by
/// its name, where the first of them stands in the document, with its
/// limits in tokens; the policies that share it never show. A key charged
/// under the budget's name (the name their checks carry) shows its state
/// there, and is not listed again as a policy seen only in traffic.
#[tokio::test]
async fn a_shared_budget_shows_once_by_its_name() {
    let redis = Redis::start().expect("redis");
    let document = r#"{"policies": [
      {"name": "gate", "limits": [{"type": "fixed_window", "limit": 100, "window": "1m"}]},
      {"name": "chat", "match": {"path_exact": "/v1/chat/completions"}, "key": ["header:x-team"],
       "budget": "team-tokens", "llm": {"api": "openai_chat"},
       "limits": [{"type": "points", "capacity": 3000, "refill": "1d", "cost": "llm_tokens"}]},
      {"name": "messages", "match": {"path_exact": "/v1/messages"}, "key": ["header:x-team"],
       "budget": "team-tokens", "llm": {"api": "anthropic_messages"},
       "limits": [{"type": "points", "capacity": 3000, "refill": "1d", "cost": "llm_tokens"}]},
      {"name": "quiet", "limits": [{"type": "interval", "every": "1s"}]}
    ]}"#;
    let port = serve(&redis, Some(document)).await;
    let points = |cost| vec![WireLimit::Points { capacity: 3_000, refill_ms: Millis(86_400_000), cost }];
    assert!(check(port, "r1", "team-tokens", "blue", points(400)).await.allowed);
    assert!(check(port, "r2", "team-tokens", "blue", points(100)).await.allowed);
    let board = dashboard(port).await;
    let names: Vec<&str> =
        board["policies"].as_array().expect("policies").iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, ["gate", "team-tokens", "quiet"], "{board:#}");
    let budget = policy(&board, "team-tokens");
    assert_eq!(budget["source"], "document");
    assert_eq!(budget["limits"].as_array().map(Vec::len), Some(1), "{budget:#}");
    assert_eq!(budget["limits"][0]["unit"], "tokens");
    assert_eq!(budget["limits"][0]["capacity"], 3_000);
    assert_eq!(budget["totals"]["allowed"], 2, "{budget:#}");
    assert_eq!(key(budget, "blue")["state"][0]["remaining"], 2_500, "both checks charged one counter");
}
