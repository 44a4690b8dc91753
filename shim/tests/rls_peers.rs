//! The RLS face against reference models of its peers: small models of
//! envoyproxy/ratelimit's and Limitador's decisions, written here from
//! their documented rules (not from Sluice's code), and random descriptor
//! streams through each model and through the real face (`sluice import`'s
//! conversion, the in-process shim, real Redis). Every answer must agree:
//! the overall code, each descriptor's code, and for envoyproxy/ratelimit
//! each status's `current_limit`, `limit_remaining` and
//! `duration_until_reset`. (The same wiring through Envoy:
//! `e2e/tests/envoy_rls.rs`.)
//!
//! Windows are a day or longer, and a run starts well inside a day, so no
//! window ends during a run: Limitador's windows (from a counter's first
//! hit) and envoyproxy/ratelimit's (aligned to the epoch) then count alike.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde::Deserialize;
use sluice_harness::Redis;
use sluice_shim::grpc::{router, Faces};
use sluice_shim::limiter::Limiter;
use sluice_shim::server::{serve, Options};
use sluice_shim::store::Target;
use tonic::transport::Channel;

/// A call: its descriptors, each a list of entries.
type Call = Vec<Vec<(String, String)>>;

/// What a model answers, as compared: overall code, and per descriptor its
/// code and, for envoyproxy/ratelimit, `(name, requests_per_unit, unit,
/// remaining, reset seconds)` (`None`: no `current_limit`).
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    overall: i32,
    statuses: Vec<(i32, Option<(String, u32, i32, u32, i64)>)>,
    /// `limit_remaining` of statuses without a limit.
    bare_remaining: Vec<u32>,
}

fn face_answer(resp: &RateLimitResponse, with_limits: bool) -> Answer {
    Answer {
        overall: resp.overall_code,
        statuses: resp
            .statuses
            .iter()
            .map(|s| {
                let limit = s.current_limit.as_ref().filter(|_| with_limits).map(|l| {
                    let reset = s.duration_until_reset.as_ref().map_or(-1, |d| d.seconds);
                    (l.name.clone(), l.requests_per_unit, l.unit, s.limit_remaining, reset)
                });
                (s.code, limit)
            })
            .collect(),
        bare_remaining: resp
            .statuses
            .iter()
            .filter(|s| with_limits && s.current_limit.is_none())
            .map(|s| s.limit_remaining)
            .collect(),
    }
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

// ---- A model of envoyproxy/ratelimit, from its README and its documented
// rules: the descriptor tree walked most specific first (key_value, then
// the first matching wildcard, then the bare key), no going back, the limit
// of the node at the last entry; `replaces` by name over the whole call;
// `unlimited` (OK, remaining MaxUint32); each descriptor's counter (domain,
// the entries' values, a shared wildcard's pattern) incremented whatever
// the others say, over when the count passes `requests_per_unit`; shadow
// answered OK with its limit; the reset the seconds to the unit's end.

#[derive(Debug, Deserialize)]
struct Config {
    domain: String,
    descriptors: Vec<Node>,
}

#[derive(Debug, Deserialize)]
struct Node {
    key: String,
    value: Option<String>,
    rate_limit: Option<Rate>,
    #[serde(default)]
    descriptors: Vec<Node>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    share_threshold: bool,
}

#[derive(Debug, Deserialize)]
struct Rate {
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<Replaces>,
}

#[derive(Debug, Deserialize)]
struct Replaces {
    name: String,
}

fn glob(pattern: &str, value: &str) -> bool {
    // Each `*` any run of characters: a plain recursive match.
    match pattern.split_once('*') {
        None => pattern == value,
        Some((head, tail)) => {
            value.starts_with(head)
                && (0..=value.len() - head.len())
                    .any(|i| value.is_char_boundary(head.len() + i) && glob(tail, &value[head.len() + i..]))
        }
    }
}

struct Ratelimit {
    config: Config,
    counters: HashMap<String, u64>,
}

impl Ratelimit {
    /// The node a descriptor reaches, and each level's shared pattern.
    fn find<'c>(config: &'c Config, entries: &[(String, String)]) -> Option<(&'c Node, Vec<Option<String>>)> {
        let mut level = &config.descriptors;
        let mut shared = Vec::new();
        for (i, (k, v)) in entries.iter().enumerate() {
            let full = format!("{k}_{v}");
            let node = level
                .iter()
                .find(|n| n.key == *k && n.value.as_deref() == Some(v.as_str()) && !v.contains('*'))
                .or_else(|| {
                    level.iter().find(|n| {
                        n.value
                            .as_deref()
                            .is_some_and(|p| p.contains('*') && glob(&format!("{}_{p}", n.key), &full))
                    })
                })
                .or_else(|| level.iter().find(|n| n.key == *k && n.value.is_none()))?;
            shared.push(node.share_threshold.then(|| node.value.clone().unwrap_or_default()));
            if i + 1 == entries.len() {
                return Some((node, shared));
            }
            if node.descriptors.is_empty() {
                return None;
            }
            level = &node.descriptors;
        }
        None
    }

    fn decide(&mut self, call: &Call, now_s: u64) -> Answer {
        let (config, counters) = (&self.config, &mut self.counters);
        let found: Vec<Option<(&Node, Vec<Option<String>>)>> =
            call.iter().map(|d| Ratelimit::find(config, d)).collect();
        let replacing: Vec<String> = found
            .iter()
            .flatten()
            .filter_map(|(n, _)| n.rate_limit.as_ref())
            .flat_map(|r| r.replaces.iter().map(|x| x.name.clone()))
            .collect();
        let mut out = Answer { overall: OK, statuses: Vec::new(), bare_remaining: Vec::new() };
        let mut charges = Vec::new();
        for (d, found) in call.iter().zip(found) {
            let Some((node, shared)) = found else {
                out.statuses.push((OK, None));
                out.bare_remaining.push(0);
                continue;
            };
            let Some(rate) = &node.rate_limit else {
                out.statuses.push((OK, None));
                out.bare_remaining.push(0);
                continue;
            };
            let name = rate.name.clone().unwrap_or_default();
            if !name.is_empty() && replacing.contains(&name) {
                out.statuses.push((OK, None));
                out.bare_remaining.push(0);
                continue;
            }
            if rate.unlimited {
                out.statuses.push((OK, None));
                out.bare_remaining.push(u32::MAX);
                continue;
            }
            let (divider, unit) = unit(rate.unit.as_deref().unwrap_or_default());
            let mut key = format!("{}|", config.domain);
            for ((k, v), shared) in d.iter().zip(&shared) {
                key.push_str(&format!("{k}={}|", shared.as_deref().unwrap_or(v)));
            }
            key.push_str(&format!("{:?}|{}", node as *const Node, now_s / divider));
            charges.push(key.clone());
            let count = counters.entry(key).or_default();
            *count += 1;
            let over = *count > u64::from(rate.requests_per_unit);
            let remaining = if over { 0 } else { rate.requests_per_unit - *count as u32 };
            let reset = (divider - now_s % divider) as i64;
            let code = if over && !node.shadow_mode { OVER } else { OK };
            if code == OVER {
                out.overall = OVER;
            }
            out.statuses.push((code, Some((name, rate.requests_per_unit, unit, remaining, reset))));
        }
        out
    }
}

/// A unit's divider in seconds and its protobuf number.
fn unit(name: &str) -> (u64, i32) {
    match name {
        "day" => (86_400, 4),
        "week" => (7 * 86_400, 7),
        "month" => (30 * 86_400, 5),
        "year" => (365 * 86_400, 6),
        other => panic!("the model's configurations use day and longer units, not {other}"),
    }
}

const RATELIMIT: &str = r#"
domain: edge
descriptors:
  - key: plan
    rate_limit: {name: plan, unit: day, requests_per_unit: 6}
  - key: plan
    value: pro
    rate_limit: {name: pro, unit: day, requests_per_unit: 9}
  - key: plan
    value: internal
    rate_limit: {unlimited: true}
  - key: plan
    value: free
  - key: ip
    rate_limit: {unit: month, requests_per_unit: 5}
  - key: ip
    value: 10.0.0.66
    rate_limit: {name: blocked, unit: day, requests_per_unit: 0}
  - key: path
    value: /api/*/action
    rate_limit: {unit: year, requests_per_unit: 4}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {name: api, unit: day, requests_per_unit: 7}
  - key: org
    descriptors:
      - key: user
        rate_limit: {name: base, unit: day, requests_per_unit: 3}
      - key: user
        value: vip
        rate_limit: {unit: week, requests_per_unit: 8, replaces: [{name: plan}]}
  - key: org
    value: acme
    descriptors:
      - key: user
        value: alice
        shadow_mode: true
        rate_limit: {name: trial, unit: day, requests_per_unit: 2}
  - key: team
    rate_limit: {unit: day, requests_per_unit: 4, replaces: [{name: base}]}
"#;

/// The pool the random calls draw descriptors from: every branch of the tree.
fn ratelimit_pool() -> Vec<Vec<(&'static str, &'static str)>> {
    vec![
        vec![("plan", "pro")],
        vec![("plan", "basic")],
        vec![("plan", "gold")],
        vec![("plan", "internal")],
        vec![("plan", "free")],
        vec![("ip", "10.0.0.66")],
        vec![("ip", "10.0.0.1")],
        vec![("ip", "10.0.0.2")],
        vec![("path", "/api/7/action")],
        vec![("path", "/api/8/action")],
        vec![("path", "/api/7/other")],
        vec![("path", "/api/9")],
        vec![("path", "/web")],
        vec![("org", "x"), ("user", "u1")],
        vec![("org", "x"), ("user", "vip")],
        vec![("org", "acme"), ("user", "alice")],
        vec![("org", "acme"), ("user", "bob")],
        vec![("org", "x")],
        vec![("plan", "pro"), ("extra", "1")],
        vec![("team", "t1")],
        vec![("nobody", "x")],
    ]
}

// ---- A model of Limitador, from its documentation: each limit of the
// call's namespace applies when all its conditions hold on descriptors[0]
// (a missing entry: false) and all its variables resolve, its counter
// qualified by the variables' values; the call is limited when one
// counter would pass its max_value, and then no counter is charged.

#[derive(Debug, Deserialize)]
struct Limit {
    namespace: String,
    max_value: u64,
    #[allow(dead_code)]
    seconds: u64,
    #[serde(default)]
    conditions: Option<Vec<String>>,
    #[serde(default)]
    variables: Option<Vec<String>>,
}

/// `descriptors[0]['k'] OP 'v'` read the model's own way: (k, equal, v).
fn parse_condition(text: &str) -> (String, bool, String) {
    let (left, equal, right) = match text.split_once("==") {
        Some((l, r)) => (l, true, r),
        None => {
            let (l, r) = text.split_once("!=").expect("== or !=");
            (l, false, r)
        }
    };
    (parse_variable(left), equal, right.trim().trim_matches(['\'', '"']).to_string())
}

fn parse_variable(text: &str) -> String {
    let rest = text.trim().strip_prefix("descriptors[0]").expect("descriptors[0]");
    match rest.strip_prefix('.') {
        Some(name) => name.to_string(),
        None => rest.trim_matches(['[', ']', '\'', '"']).to_string(),
    }
}

struct Limitador {
    limits: Vec<Limit>,
    counters: HashMap<String, u64>,
}

impl Limitador {
    fn decide(&mut self, domain: &str, call: &Call) -> Answer {
        let first: HashMap<&str, &str> = call[0].iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut counters = Vec::new();
        for (i, limit) in self.limits.iter().enumerate() {
            if limit.namespace != domain {
                continue;
            }
            let holds = limit.conditions.iter().flatten().all(|c| {
                let (k, equal, v) = parse_condition(c);
                first.get(k.as_str()).is_some_and(|got| (*got == v) == equal)
            });
            let values: Option<Vec<&str>> = limit
                .variables
                .iter()
                .flatten()
                .map(|v| first.get(parse_variable(v).as_str()).copied())
                .collect();
            if let (true, Some(values)) = (holds, values) {
                counters.push((format!("{i}|{}", values.join("|")), limit.max_value));
            }
        }
        let limited = counters.iter().any(|(k, max)| self.counters.get(k).copied().unwrap_or(0) + 1 > *max);
        if !limited {
            for (k, _) in counters {
                *self.counters.entry(k).or_default() += 1;
            }
        }
        let overall = if limited { OVER } else { OK };
        Answer { overall, statuses: Vec::new(), bare_remaining: Vec::new() }
    }
}

const LIMITADOR: &str = r#"
- namespace: shop
  max_value: 30
  seconds: 86400
  conditions: []
  variables: []
- namespace: shop
  max_value: 4
  seconds: 86400
  conditions: ["descriptors[0]['req.method'] == 'POST'"]
  variables: ["descriptors[0]['user']"]
- namespace: shop
  max_value: 6
  seconds: 86400
  conditions: ["descriptors[0].method == 'GET'", "descriptors[0].path != '/health'"]
  variables: []
- namespace: shop
  max_value: 3
  seconds: 86400
  conditions: ["descriptors[0]['path'] == '/checkout'"]
  variables: ["descriptors[0].user"]
- namespace: other
  max_value: 1
  seconds: 86400
  conditions: []
  variables: []
"#;

fn limitador_pool() -> Vec<Vec<(&'static str, &'static str)>> {
    vec![
        vec![("req.method", "POST"), ("user", "a")],
        vec![("req.method", "POST"), ("user", "b")],
        vec![("req.method", "POST")],
        vec![("method", "GET"), ("path", "/health")],
        vec![("method", "GET"), ("path", "/items")],
        vec![("method", "GET")],
        vec![("path", "/checkout"), ("user", "a")],
        vec![("path", "/checkout")],
        vec![("x", "y")],
    ]
}

// ---- The face, and the runs.

async fn face(doc: &str) -> (RateLimitServiceClient<Channel>, Redis) {
    let redis = Redis::start().expect("redis");
    let limiter =
        Arc::new(Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter"));
    let document = Arc::new(sluice_policies::parse(doc).expect("the imported document"));
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = grpc.local_addr().expect("addr").port();
    let app = router(Faces::new(limiter.clone(), document));
    tokio::spawn(serve(grpc, app, Options::default(), std::future::pending(), limiter.drain().clone(), None));
    let client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}")).await.expect("connect");
    (client, redis)
}

fn request(domain: &str, call: &Call) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors: call
            .iter()
            .map(|d| RateLimitDescriptor {
                entries: d.iter().map(|(k, v)| Entry { key: k.clone(), value: v.clone() }).collect(),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// A small deterministic generator (xorshift), seeded per run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn call(&mut self, pool: &[Vec<(&str, &str)>]) -> Call {
        let n = 1 + self.below(3);
        (0..n)
            .map(|_| {
                pool[self.below(pool.len())].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
            })
            .collect()
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs()
}

/// Starts a run inside one day, far from its end.
fn inside_one_day() {
    let left = 86_400 - now_s() % 86_400;
    if left < 120 {
        std::thread::sleep(Duration::from_secs(left + 1));
    }
}

#[tokio::test]
async fn the_face_decides_as_envoyproxy_ratelimit_on_random_streams() {
    inside_one_day();
    let imported = sluice_shim::import::convert(RATELIMIT, None).expect("converts");
    assert!(imported.losses.is_empty(), "{:?}", imported.losses);
    for seed in [7_u64, 1_234_567, 0xdead_beef] {
        let (mut client, _redis) = face(&imported.document.to_string()).await;
        let config: Config = serde_norway::from_str(RATELIMIT).expect("the model's config");
        let mut model = Ratelimit { config, counters: HashMap::new() };
        let pool = ratelimit_pool();
        let mut rng = Rng(seed);
        for i in 0..150 {
            let call = rng.call(&pool);
            let resp =
                client.should_rate_limit(request("edge", &call)).await.expect("an answer").into_inner();
            let now = now_s();
            let mut want = model.decide(&call, now);
            let got = face_answer(&resp, true);
            // The reset is read on two clocks a moment apart.
            for (g, w) in got.statuses.iter().zip(&mut want.statuses) {
                if let (Some(g), Some(w)) = (&g.1, &mut w.1) {
                    if (g.4 - w.4).abs() <= 1 {
                        w.4 = g.4;
                    }
                }
            }
            assert_eq!(got, want, "seed {seed}, call {i}: {call:?}");
        }
    }
}

#[tokio::test]
async fn the_face_decides_as_limitador_on_random_streams() {
    let imported = sluice_shim::import::convert(LIMITADOR, None).expect("converts");
    assert_eq!(imported.losses.len(), 5, "the window anchoring, once per limit");
    for seed in [3_u64, 99_991, 0xfeed] {
        let (mut client, _redis) = face(&imported.document.to_string()).await;
        let limits: Vec<Limit> = serde_norway::from_str(LIMITADOR).expect("the model's limits");
        let mut model = Limitador { limits, counters: HashMap::new() };
        let pool = limitador_pool();
        let mut rng = Rng(seed);
        for i in 0..150 {
            let call = rng.call(&pool);
            let domain = if rng.below(10) == 0 { "other" } else { "shop" };
            let resp =
                client.should_rate_limit(request(domain, &call)).await.expect("an answer").into_inner();
            let got = face_answer(&resp, false);
            let want = model.decide(domain, &call);
            assert_eq!(got.overall, want.overall, "seed {seed}, call {i}: {domain} {call:?}");
            // Limitador answers the call alone; Sluice's statuses agree with it.
            let over = got.statuses.iter().filter(|(c, _)| *c == OVER).count();
            assert_eq!(over > 0, got.overall == OVER, "{resp:?}");
        }
    }
}
