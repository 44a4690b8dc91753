//! Every document in `examples/` parses, and says what its scenario needs.

use sluice_policies::request::SimpleRequest;
use sluice_policies::units::Millis;
use sluice_policies::wire::WireLimit;
use sluice_policies::{parse, Document};

/// Every example this file tests; a new example must be added here.
const TESTED: &[&str] = &[
    "demo",
    "partner-api",
    "egress-partner",
    "partner-feedback",
    "one-call-per-second",
    "erp-concurrency",
    "token-bucket-per-user",
    "query-cost-points",
    "leaky-bucket",
    "fixed-windows",
    "public-api-by-ip",
    "fleet-reserve",
    "utilization-shedder",
    "leased-ingress",
    "leased-per-key",
    "leased-bucket",
    "rlqs-quota",
    "rls-edge",
    "calendar-budgets",
    "llm-hierarchy",
    "llm-budget",
    "llm-demo",
    "llm-shared-budget",
];

fn example(name: &str) -> Document {
    assert!(TESTED.contains(&name), "add {name} to TESTED");
    let path = format!("{}/examples/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The limits and key the example's only policy applies to `req`.
fn applied(doc: &Document, req: &SimpleRequest) -> Option<(String, Vec<WireLimit>)> {
    let applied = doc.evaluate(req).ok()?;
    applied.first().map(|a| (a.key.clone(), a.check(req).limits))
}

/// S0: 25 per 5 s and 300 per minute, by API key.
#[test]
fn partner_api() {
    let req = SimpleRequest::new("POST", "/v42/orders").header("x-api-key", "acct-1");
    let sw = |limit, window_ms| WireLimit::SlidingWindow {
        limit,
        window_ms: Millis(window_ms),
        approximate: false,
    };
    let want = ("acct-1".to_string(), vec![sw(25, 5_000), sw(300, 60_000)]);
    assert_eq!(applied(&example("partner-api"), &req), Some(want.clone()));
    assert_eq!(applied(&example("demo"), &req), Some(want));
}

/// S1: one call per second to the API host, shared by every caller.
#[test]
fn one_call_per_second() {
    let req = SimpleRequest::new("GET", "/api/v9/me").authority("api.track.example");
    let want = (String::new(), vec![WireLimit::Interval { every_ms: Millis(1_000) }]);
    assert_eq!(applied(&example("one-call-per-second"), &req), Some(want));
}

/// S2a: 50 in flight to the ERP, a dead holder's slot back after 30 s.
#[test]
fn erp_concurrency() {
    let req = SimpleRequest::new("GET", "/erp/invoices");
    let want = (String::new(), vec![WireLimit::Concurrency { limit: 50, lease_ms: Millis(30_000) }]);
    assert_eq!(applied(&example("erp-concurrency"), &req), Some(want));
}

/// S4a: 100 per second with a burst of 500, per user; no user, no entry.
#[test]
fn token_bucket_per_user() {
    let doc = example("token-bucket-per-user");
    let req = SimpleRequest::new("GET", "/v1/charges").header("x-user-id", "u42");
    let want =
        ("u42".to_string(), vec![WireLimit::TokenBucket { rate: 100, per_ms: Millis(1_000), burst: 500 }]);
    assert_eq!(applied(&doc, &req), Some(want));
    assert!(doc.evaluate(&SimpleRequest::new("GET", "/v1/charges")).is_err());
}

/// S2e: 1000 points refilled in 20 s, the cost estimated from a request header.
#[test]
fn query_cost_points() {
    let req = SimpleRequest::new("POST", "/admin/api/graphql.json")
        .header("x-shop-id", "s1")
        .header("x-query-cost", "120");
    let want =
        ("s1".to_string(), vec![WireLimit::Points { capacity: 1000, refill_ms: Millis(20_000), cost: 120 }]);
    assert_eq!(applied(&example("query-cost-points"), &req), Some(want));
}

/// A team's daily token budget per model: a chat request reserves its
/// body's bytes and its cap in tokens, keyed by team and model; the
/// request-rate limit beside it counts one.
#[test]
fn llm_budget() {
    let body = r#"{"model": "gpt-4o", "max_completion_tokens": 100, "messages": []}"#;
    let req = SimpleRequest::new("POST", "/v1/chat/completions").header("x-team", "blue").body(body);
    let want = (
        "blue:gpt-4o".to_string(),
        vec![
            WireLimit::Points {
                capacity: 1_000_000,
                refill_ms: Millis(86_400_000),
                cost: body.len() as u32 + 100,
            },
            WireLimit::FixedWindow { limit: 600, window_ms: Millis(60_000), cost: 1 },
        ],
    );
    let doc = example("llm-budget");
    assert!(doc.needs_body(&req));
    assert_eq!(applied(&doc, &req), Some(want));
}

/// The token-budget demo's document: a team's chat request reserves its
/// body's bytes and the default output part, as `harness::llm_demo` says.
#[test]
fn llm_demo() {
    let body = r#"{"model": "m", "messages": []}"#;
    let req = SimpleRequest::new("POST", "/v1/chat/completions").header("x-team", "alpha").body(body);
    let doc = example("llm-demo");
    let (key, limits) = applied(&doc, &req).expect("the policy applies");
    assert_eq!(key, "alpha");
    assert_eq!(
        limits,
        [WireLimit::Points {
            capacity: 10_000,
            refill_ms: Millis(86_400_000),
            cost: body.len() as u32 + 200
        }]
    );
    assert!(doc.verdict_header, "the demo counts by the gateway's verdict");
}

/// Hostile cost headers are clamped to the capacity (1000) or fall back to
/// the default (50); before, `4294967295` went to the shim as it was, and
/// anything beyond u32 (or signed) fell back to the cheap default.
#[test]
fn query_cost_headers_are_clamped() {
    let doc = example("query-cost-points");
    let cost = |value: &str| {
        let req = SimpleRequest::new("POST", "/admin/api/graphql.json")
            .header("x-shop-id", "s1")
            .header("x-query-cost", value);
        match applied(&doc, &req) {
            Some((_, limits)) => match limits[..] {
                [WireLimit::Points { cost, .. }] => cost,
                _ => panic!("{limits:?}"),
            },
            None => panic!("the policy applies"),
        }
    };
    assert_eq!(cost("4294967295"), 1000);
    assert_eq!(cost("99999999999999999999999"), 1000);
    assert_eq!(cost("1001"), 1000);
    assert_eq!(cost(" 120\t"), 120);
    assert_eq!(cost("-120"), 50);
    assert_eq!(cost("12 0"), 50);
    assert_eq!(cost(""), 50);
}

/// S2d: a bucket of 60 that drains in 60 s.
#[test]
fn leaky_bucket() {
    let req = SimpleRequest::new("GET", "/").header("x-api-key", "k");
    let want = ("k".to_string(), vec![WireLimit::LeakyBucket { capacity: 60, drain_ms: Millis(60_000) }]);
    assert_eq!(applied(&example("leaky-bucket"), &req), Some(want));
}

/// S2b: aligned windows per minute and per day.
#[test]
fn fixed_windows() {
    let req = SimpleRequest::new("GET", "/").header("x-api-key", "k");
    let fw = |limit, window_ms| WireLimit::FixedWindow { limit, window_ms: Millis(window_ms), cost: 1 };
    let want = ("k".to_string(), vec![fw(100, 60_000), fw(10_000, 86_400_000)]);
    assert_eq!(applied(&example("fixed-windows"), &req), Some(want));
}

/// A public API keyed by client IP behind one trusted proxy; internal traffic bypasses.
#[test]
fn public_api_by_ip() {
    let doc = example("public-api-by-ip");
    let req = SimpleRequest::new("GET", "/public/items")
        .source("10.0.0.2:999")
        .header("x-forwarded-for", "203.0.113.7");
    let want = (
        "203.0.113.7".to_string(),
        vec![WireLimit::SlidingWindow { limit: 60, window_ms: Millis(60_000), approximate: true }],
    );
    assert_eq!(applied(&doc, &req), Some(want));
    assert_eq!(applied(&doc, &req.clone().header("x-internal-token", "change-me")), None);
}

/// The egress shape of S0: gateways in front of the partner hold each call
/// (up to 15 s) until both windows of the provider account allow it.
#[test]
fn egress_partner() {
    let doc = example("egress-partner");
    let req = SimpleRequest::new("POST", "/v42/orders")
        .authority("api.partner.example")
        .header("x-provider-account", "acct-1");
    let sw = |limit, window_ms| WireLimit::SlidingWindow {
        limit,
        window_ms: Millis(window_ms),
        approximate: false,
    };
    let want = ("acct-1".to_string(), vec![sw(25, 5_000), sw(300, 300_000)]);
    assert_eq!(applied(&doc, &req), Some(want));
    let wait = doc.policies[0].wait.expect("the policy waits");
    assert_eq!((wait.timeout_ms(), wait.margin_ms()), (15_000, 4));
    let check = doc.evaluate(&req).expect("applies")[0].check(&req);
    assert_eq!(check.margin_ms, Some(Millis(4)), "each check carries its policy's margin");
}

/// Upstream feedback on the egress case: the partner's 429s and its
/// `X-RateLimit-Reset` (a Unix time) pause the account fleet-wide, at most
/// for 2 min; each check asks the shim to see the account's pause.
#[test]
fn partner_feedback() {
    let doc = example("partner-feedback");
    let req = SimpleRequest::new("POST", "/v42/orders")
        .authority("api.partner.example")
        .header("x-provider-account", "acct-1");
    let upstream = doc.policies[0].upstream.as_ref().expect("the policy reads feedback");
    assert_eq!(upstream.reset, sluice_policies::feedback::ResetFormat::Unix);
    assert_eq!((upstream.default_pause.as_millis(), upstream.max_pause.as_millis()), (2_000, 120_000));
    let check = doc.evaluate(&req).expect("applies")[0].check(&req);
    assert!(check.upstream, "the check carries the account's pause");
}

/// S4c: a fleet pool of 500 whose last 20% only payments may use: a
/// payment sees the whole pool, anything else 400 of it; `x-priority` may
/// name the class.
#[test]
fn fleet_reserve() {
    let doc = example("fleet-reserve");
    let pool =
        |limit| Some((String::new(), vec![WireLimit::Concurrency { limit, lease_ms: Millis(30_000) }]));
    assert_eq!(applied(&doc, &SimpleRequest::new("POST", "/payments/charge")), pool(500));
    assert_eq!(applied(&doc, &SimpleRequest::new("GET", "/catalog")), pool(400));
    let named = SimpleRequest::new("GET", "/catalog").header("x-priority", "critical");
    assert_eq!(applied(&doc, &named), pool(500));
}

/// S4d: the service's ORCA `cpu_utilization` sheds batch traffic (all that
/// matches no other class) first, then interactive traffic, never payments,
/// on the scenario's timeline (the controller's defaults).
#[test]
fn utilization_shedder() {
    let doc = example("utilization-shedder");
    let shed = doc.policies[0].shed.as_ref().expect("the policy sheds");
    assert_eq!(shed.signal, sluice_policies::load::Signal::Orca("cpu_utilization".into()));
    assert_eq!(shed.controller, sluice_policies::shed::ShedSettings::default());
    let class = |req: &SimpleRequest| doc.evaluate(req).expect("applies").class;
    assert_eq!(class(&SimpleRequest::new("POST", "/payments/charge")), 0);
    assert_eq!(class(&SimpleRequest::new("GET", "/app/cart")), 1);
    assert_eq!(class(&SimpleRequest::new("GET", "/export")), 2, "matching none: the last class");
    assert_eq!(class(&SimpleRequest::new("GET", "/export").header("x-priority", "interactive")), 1);
}

/// Leased mode: one global window of 60,000 a minute, spent from leases of
/// 200 tokens; a gateway holds at most 300 unspent.
#[test]
fn leased_ingress() {
    let doc = example("leased-ingress");
    let leased = doc.policies[0].leased.expect("the policy is leased");
    assert_eq!((leased.tokens(), leased.ttl_ms(), leased.held_at_most()), (200, 2_000, 300));
    let req = SimpleRequest::new("GET", "/api/items");
    let want =
        (String::new(), vec![WireLimit::FixedWindow { limit: 60_000, window_ms: Millis(60_000), cost: 1 }]);
    assert_eq!(applied(&doc, &req), Some(want));
}

/// Leased per key: each API key has its own window of 6,000 a minute; a
/// key hot enough at a gateway is leased 50 tokens at a time, the others
/// are checked exactly.
#[test]
fn leased_per_key() {
    let doc = example("leased-per-key");
    let leased = doc.policies[0].leased.expect("the policy is leased");
    assert_eq!((leased.tokens(), leased.ttl_ms(), leased.held_at_most()), (50, 1_000, 75));
    let req = SimpleRequest::new("GET", "/api/items").header("x-api-key", "k1");
    let (key, limits) = applied(&doc, &req).expect("applies");
    assert!(!key.is_empty(), "one window per key");
    assert_eq!(limits, vec![WireLimit::FixedWindow { limit: 6_000, window_ms: Millis(60_000), cost: 1 }]);
}

/// Leased per key on a token bucket of 100 a second with a burst of 200:
/// leases of 20, in periods of a tenth of the 1.8 s the bucket takes to
/// refill beyond a lease.
#[test]
fn leased_bucket() {
    use sluice_policies::leased::Source;
    let doc = example("leased-bucket");
    let leased = doc.policies[0].leased.expect("the policy is leased");
    assert_eq!((leased.source(), leased.tokens(), leased.ttl_ms()), (Source::Bucket, 20, 180));
    let req = SimpleRequest::new("GET", "/api/items").header("x-api-key", "k1");
    let (key, limits) = applied(&doc, &req).expect("applies");
    assert!(!key.is_empty(), "one bucket per key");
    assert_eq!(limits, vec![WireLimit::TokenBucket { rate: 100, per_ms: Millis(1_000), burst: 200 }]);
}

/// RLQS: each client's bucket (`name: api`) spends a window of 6,000 a
/// minute in assignments of 100; the internal tier's buckets are unlimited.
#[test]
fn rlqs_quota() {
    use sluice_policies::rlqs::{govern, Governed};
    let doc = example("rlqs-quota");
    let bucket = SimpleRequest::default().domain("edge").bucket("name", "api").bucket("client", "c1");
    match govern(&doc, &bucket).0 {
        Governed::Leased(window) => {
            assert_eq!(
                (window.key.as_str(), window.limit(), window.lease.tokens(), window.ttl_s()),
                ("c1", 6_000, 100, 5)
            );
        }
        other => panic!("expected a leased window, got {other:?}"),
    }
    let internal = SimpleRequest::default().domain("edge").bucket("tier", "internal");
    assert_eq!(govern(&doc, &internal).0, Governed::Unlimited { policy: "internal".into() });
}

/// Calendar budgets: 20,000 requests per New York day and 5,000,000
/// points per billing month from the 15th in Paris, by organisation; the
/// points cost 1,000 up front, corrected by the response.
#[test]
fn calendar_budgets() {
    use sluice_policies::calendar::{Calendar, Period, Zone};
    let doc = example("calendar-budgets");
    let req = SimpleRequest::new("POST", "/v1/chat").header("x-org", "acme");
    let zone = |name| Zone::new(name).expect("a zone");
    let want = vec![
        WireLimit::CalendarWindow {
            limit: 20_000,
            calendar: Calendar { period: Period::Day, zone: zone("America/New_York") },
            cost: 1,
        },
        WireLimit::CalendarPoints {
            capacity: 5_000_000,
            cost: 1_000,
            calendar: Calendar { period: Period::Month { anchor: 15 }, zone: zone("Europe/Paris") },
        },
    ];
    assert_eq!(applied(&doc, &req), Some(("acme".to_string(), want)));
    assert!(doc.policies[0].limits[1].actual_cost_header().is_some());
}

/// A hierarchy: an organisation's monthly token budget, each team's share,
/// each API key's rate. One check carries every level, each keyed within
/// the one above; a request without a team is refused (`on_missing_key`).
#[test]
fn llm_hierarchy() {
    use sluice_policies::wire::{CheckLevel, LevelKey};
    let doc = example("llm-hierarchy");
    let req = SimpleRequest::new("POST", "/v1/chat")
        .header("x-org", "acme")
        .header("x-team", "red")
        .header("x-api-key", "k 1")
        .header("x-max-tokens", "1000");
    let applied = doc.evaluate(&req).expect("applies");
    let check = applied[0].check(&req);
    assert_eq!(check.key, "acme");
    assert_eq!(check.limits.len(), 3);
    let level = |name: &str, key: &str, from| CheckLevel {
        level: LevelKey { name: name.into(), key: key.into() },
        from,
    };
    assert_eq!(check.levels, vec![level("team", "red", 1), level("api-key", "red:k%201", 2)]);
    assert!(matches!(check.limits[1], WireLimit::CalendarPoints { capacity: 10_000_000, cost: 1000, .. }));
    assert_eq!(check.state_prefix(0), "sluice:{llm:acme}");
    assert_eq!(check.state_prefix(1), "sluice:{llm:acme}:@team:red");
    assert_eq!(check.state_prefix(2), "sluice:{llm:acme}:@api-key:red:k%201");
    let no_team = SimpleRequest::new("POST", "/v1/chat").header("x-org", "acme").header("x-api-key", "k1");
    assert!(doc.evaluate(&no_team).is_err(), "a level's missing key refuses the request");
}

/// One team's token budget shared by three API shapes: each policy's check
/// names the budget, so chat, responses and messages charge one counter.
#[test]
fn llm_shared_budget() {
    let doc = example("llm-shared-budget");
    let mut prefixes = Vec::new();
    for path in ["/v1/chat/completions", "/v1/responses", "/v1/messages"] {
        let req = SimpleRequest::new("POST", path).header("x-team", "blue").body("{}");
        let applied = doc.evaluate(&req).expect("applies");
        assert_eq!(applied.len(), 1, "{path}: one policy");
        let check = applied[0].check(&req);
        assert_eq!(check.policy, "team-tokens", "{path}");
        prefixes.push(check.state_prefix(0));
    }
    assert!(prefixes.iter().all(|p| p == "sluice:{team-tokens:blue}"), "{prefixes:?}");
}

/// The RLS face's example (docs/rls.md): a descriptor with `x-client` is
/// counted per client, 100 a minute; `x-tier: internal` is unlimited.
#[test]
fn rls_edge() {
    let doc = example("rls-edge");
    let client = SimpleRequest::default().domain("edge").entry("x-client", "c1");
    let fw = WireLimit::FixedWindow { limit: 100, window_ms: Millis(60_000), cost: 1 };
    assert_eq!(applied(&doc, &client), Some(("c1".to_string(), vec![fw])));
    let internal = SimpleRequest::default().domain("edge").entry("x-tier", "internal");
    let applied = doc.evaluate(&internal).expect("evaluates");
    assert!(applied.iter().all(|a| a.policy.unlimited) && !applied.is_empty());
}

/// Every document in `examples/` is in [`TESTED`], so each has a test here.
#[test]
fn every_example_is_tested() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    for entry in std::fs::read_dir(dir).expect("examples dir") {
        let path = entry.expect("dir entry").path();
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        assert!(TESTED.contains(&stem.as_str()), "example {} has no test", path.display());
    }
}
