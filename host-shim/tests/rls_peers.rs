//! The RLS face against reference models of its peers: small models of
//! envoyproxy/ratelimit's and Limitador's decisions, written here from
//! their documented rules (not from Sluice's code), and random descriptor
//! streams through each model and through the real face (`sluice import`'s
//! conversion, the in-process shim, real Redis). Every answer must agree:
//! the overall code, each descriptor's code, and for envoyproxy/ratelimit
//! each status's `current_limit`, `limit_remaining` and
//! `duration_until_reset`; for Limitador the whole answer, its overall
//! code alone. (The same wiring through Envoy:
//! `tests/e2e/tests/envoy_rls.rs`.)
//!
//! Each call carries a `hits_addend` of 1 to 3. envoyproxy/ratelimit's
//! model counts every call's hits, refused or not; the face (`charge:
//! every_hit`) counts a refusal in Redis, and its memory of refusals is on
//! (the default), which counts none: the answers agree all the same.
//!
//! envoyproxy/ratelimit's streams send some descriptors with their own
//! `limit` (Envoy's override), which imported documents honour.
//!
//! The random streams through the face run on the real clock, with windows
//! of a day or longer, and envoyproxy/ratelimit's run starts well inside a
//! day, so no window ends during them. Window ends are crossed by a third
//! run: Limitador's windows of 1 to 3 s, opened at each counter's first hit,
//! through the checks the face plans for each call, on the scripts at an
//! explicit clock (the shim's test mode).

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice_harness::Redis;
use sluice_shim::grpc::{router, Faces};
use sluice_shim::limiter::Limiter;
use sluice_shim::server::{serve, Options};
use sluice_shim::store::Target;
use tonic::transport::Channel;

mod peers;

use peers::limitador::{Limitador, LIMITADOR, LIMITADOR_SHORT};
use peers::ratelimit::{Answer, Call, Ratelimit, LIMIT, OK, OVER, RATELIMIT};
use sluice_cli::import::RateLimitHeaders;

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

// The models' codes are the protocol's.
const _: () = assert!(OK == Code::Ok as i32 && OVER == Code::OverLimit as i32);

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
        vec![("quota", "q1")],
        vec![("quota", "q2")],
        vec![("quota", "shadow")],
        vec![("credits", "c")],
        // Descriptors with their own `limit` (Envoy's override), each
        // always with the same one: a peer's counter past a limit counts
        // refused hits, so two limits on one counter would part ways
        // (docs/rls.md, "a denied request's count").
        vec![("plan", "gold2"), (LIMIT, "2/day")],
        vec![("plan", "internal"), (LIMIT, "1/week")],
        vec![("plan", "free"), (LIMIT, "1/year")],
        vec![("nobody", "x"), (LIMIT, "2/month")],
        vec![("org", "acme"), ("user", "bob"), (LIMIT, "3/day")],
        vec![("team", "t2"), (LIMIT, "0/day")],
    ]
}

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

/// The call to `domain`, with its `hits_addend`.
fn request_hits(domain: &str, call: &Call, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors: call
            .iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .iter()
                    .filter(|(k, _)| k != LIMIT)
                    .map(|(k, v)| Entry { key: k.clone(), value: v.clone() })
                    .collect(),
                limit: d.iter().find(|(k, _)| k == LIMIT).map(|(_, v)| override_of(v)),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: hits,
    }
}

/// A model's `"N/UNIT"` as Envoy sends it.
fn override_of(limit: &str) -> RateLimitOverride {
    let (n, unit) = limit.split_once('/').expect("N/UNIT");
    RateLimitOverride {
        requests_per_unit: n.parse().expect("a number"),
        unit: peers::ratelimit::unit(unit).1,
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
    let imported = sluice_cli::import::convert(RATELIMIT, None).expect("converts");
    assert!(imported.losses.is_empty(), "{:?}", imported.losses);
    for seed in [7_u64, 1_234_567, 0xdead_beef] {
        let (mut client, _redis) = face(&imported.document.to_string()).await;
        let mut model = Ratelimit::new(RATELIMIT);
        let pool = ratelimit_pool();
        let mut rng = Rng(seed);
        for i in 0..150 {
            let call = rng.call(&pool);
            // envoyproxy/ratelimit adds the call's hits_addend to every
            // descriptor's counter, a refused call's too.
            let hits = 1 + rng.below(3) as u32;
            let resp = client
                .should_rate_limit(request_hits("edge", &call, hits))
                .await
                .expect("an answer")
                .into_inner();
            let now = now_s();
            let mut want = model.decide_hits(&call, now, u64::from(hits));
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
    let imported = sluice_cli::import::convert(LIMITADOR, None).expect("converts");
    assert!(imported.losses.is_empty(), "{:?}", imported.losses);
    for seed in [3_u64, 99_991, 0xfeed] {
        let (mut client, _redis) = face(&imported.document.to_string()).await;
        let mut model = Limitador::new(LIMITADOR);
        let pool = limitador_pool();
        let mut rng = Rng(seed);
        for i in 0..150 {
            let call = rng.call(&pool);
            let domain = if rng.below(10) == 0 { "other" } else { "shop" };
            // Limitador counts the call's hits_addend on every matching limit.
            let hits = 1 + rng.below(3) as u32;
            let resp = client
                .should_rate_limit(request_hits(domain, &call, hits))
                .await
                .expect("an answer")
                .into_inner();
            // The whole answer: the overall code alone, as Limitador's.
            let want = model.answer_at(domain, &call, 0, u64::from(hits));
            assert_eq!(resp, want, "seed {seed}, call {i}: {domain} {call:?}");
        }
    }
}

/// Limitador's windows open at a counter's first hit and end `seconds`
/// later: random calls at random steps (whole seconds, a microsecond
/// either side, and less) cross many window ends, through the checks the
/// RLS face plans for each call (`sluice_core::plan`) run by the real
/// scripts at the same explicit time as the model. Every overall code
/// agrees (regression: the import aligned Limitador's windows to the
/// epoch, so around a window's end the two admitted different calls).
#[tokio::test]
async fn limitador_windows_open_at_the_first_hit_across_window_ends() {
    let imported = sluice_cli::import::convert(LIMITADOR_SHORT, None).expect("converts");
    assert!(imported.losses.is_empty(), "{:?}", imported.losses);
    let doc = sluice_policies::parse(&imported.document.to_string()).expect("the imported document");
    let redis = Redis::start().expect("redis");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter");
    let steps = [0_u64, 1, 999_999, 1_000_000, 1_000_001, 250_000, 2_000_000, 3_000_000];
    let pool = limitador_pool();
    let mut admitted = 0;
    for seed in [5_u64, 77_777, 0xabcdef] {
        redis::cmd("FLUSHALL").query::<()>(&mut redis.connection().expect("connection")).expect("FLUSHALL");
        let mut model = Limitador::new(LIMITADOR_SHORT);
        let mut rng = Rng(seed);
        let mut now = 1_700_000_000_000_000_u64;
        for i in 0..300 {
            now += steps[rng.below(steps.len())];
            let call = rng.call(&pool);
            let hits = 1 + rng.below(3) as u32;
            let descriptors =
                sluice_shim::grpc::rls::decode(&request_hits("shop", &call, hits)).expect("a valid call");
            let plan = sluice_core::plan::plan(&doc, &descriptors).expect("a plan");
            let mut over = plan.descriptors.iter().any(|d| !d.blocked.is_empty());
            for mut req in plan.enforced.requests() {
                req.now_us = Some(sluice_policies::units::Micros(now));
                let resp = limiter.check(&req).await.expect("a decision");
                over |= !resp.allowed;
            }
            let got = if over { OVER } else { OK };
            let want = model.decide_hits_at("shop", &call, now, u64::from(hits));
            assert_eq!(got, want, "seed {seed}, call {i} at {now}: {call:?}");
            admitted += usize::from(want == OK);
        }
    }
    // 900 calls over about 18 minutes of windows of 1 to 3 s: most are admitted.
    assert!(admitted > 300, "the runs admit calls in many windows: {admitted}");
}

/// The bench's RLS peer on the `limitador` crate, Limitador's engine with
/// its Redis storage (`bench/limitador-peer`): `SLUICE_LIMITADOR`, which
/// `cargo xtask test` builds and sets, else where `cargo xtask bench`
/// builds it.
fn limitador_engine() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_LIMITADOR") {
        return path.into();
    }
    let built =
        sluice_harness::workspace_root().join("target/limitador-peer/target/release/sluice-bench-limitador");
    assert!(
        built.is_file(),
        "Limitador's engine is not built: `cargo xtask test` builds it (or set SLUICE_LIMITADOR)"
    );
    built
}

/// A second reference for Limitador's rules: its engine itself, served the
/// same limits file, beside the face serving `sluice import`'s conversion
/// of it. Random calls (domains, descriptors, `hits_addend`) go to both on
/// the real clock, with windows of a day opened at the first hit, and every
/// overall code agrees. The engine's counters share the face's Redis under
/// their own keys.
#[tokio::test]
async fn the_face_decides_as_limitadors_engine_on_random_streams() {
    against_limitadors_engine(RateLimitHeaders::None).await;
}

/// Limitador's server setting `--rate-limit-headers DRAFT_VERSION_03`,
/// given to `sluice import` and to the engine: beside every overall code,
/// every answer's `X-RateLimit-*` headers agree with the engine's, each
/// matching limit listed with its window and name. The limit that leads
/// is the one with the fewest remaining; where two tie, the engine's
/// order is its hash set's, so the leader may differ: then its remaining
/// agrees and the list does.
#[tokio::test]
async fn the_face_answers_limitadors_rate_limit_headers_as_its_engine() {
    against_limitadors_engine(RateLimitHeaders::DraftVersion03).await;
}

async fn against_limitadors_engine(headers: RateLimitHeaders) {
    let engine = limitador_engine();
    let imported = sluice_cli::import::convert(LIMITADOR, None)
        .and_then(|i| i.with_rate_limit_headers(headers))
        .expect("converts");
    assert!(imported.losses.is_empty(), "{:?}", imported.losses);
    let limits = sluice_harness::scratch_dir("limitador-limits").expect("a scratch dir").join("limits.yaml");
    std::fs::write(&limits, LIMITADOR).expect("the limits file");
    let flag = match headers {
        RateLimitHeaders::None => "NONE",
        RateLimitHeaders::DraftVersion03 => "DRAFT_VERSION_03",
    };
    let (mut led_alike, mut tied) = (0, 0);
    for seed in [5_u64, 424_242, 0xc0ffee] {
        let (mut client, redis) = face(&imported.document.to_string()).await;
        let served = sluice_harness::Service::start("limitador-engine", &engine, |port| {
            let limits = limits.display().to_string();
            [
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--redis",
                &redis.url(),
                "--limits",
                &limits,
                "--rate-limit-headers",
                flag,
            ]
            .map(String::from)
            .to_vec()
        })
        .expect("Limitador's engine");
        let mut peer = RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", served.port))
            .await
            .expect("connect to the engine");
        let pool = limitador_pool();
        let mut rng = Rng(seed);
        let mut refused = 0;
        for i in 0..150 {
            let call = rng.call(&pool);
            let domain = if rng.below(10) == 0 { "other" } else { "shop" };
            let hits = 1 + rng.below(3) as u32;
            let req = request_hits(domain, &call, hits);
            let got = client.should_rate_limit(req.clone()).await.expect("the face's answer").into_inner();
            let want = peer.should_rate_limit(req).await.expect("the engine's answer").into_inner();
            let at = format!(
                "seed {seed}, call {i}: {domain} {call:?} x{hits}: the face {got:?}, the engine {want:?}"
            );
            assert_eq!(got.overall_code, want.overall_code, "{at}");
            refused += usize::from(want.overall_code == OVER);
            let (got, want) = (x_ratelimit(&got), x_ratelimit(&want));
            match headers {
                RateLimitHeaders::None => assert!(got.is_none() && want.is_none(), "{at}"),
                RateLimitHeaders::DraftVersion03 => {
                    let (Some(got), Some(want)) = (got, want) else {
                        panic!("{at}: both answer with the headers, or neither");
                    };
                    assert_eq!((&got.listed, got.remaining), (&want.listed, want.remaining), "{at}");
                    if got.leader == want.leader {
                        // The reset is read on two clocks a moment apart.
                        assert!(got.reset.abs_diff(want.reset) <= 1, "{at}");
                        led_alike += 1;
                    } else {
                        tied += 1;
                    }
                }
            }
        }
        assert!((10..140).contains(&refused), "seed {seed}: {refused} of 150 refused: the run shows little");
    }
    assert!(tied <= led_alike / 4, "{tied} leaders differ, {led_alike} agree: more than ties explain");
}

/// An answer's draft-03 headers: the leading limit's quota, every limit
/// listed (sorted here, ties may come in either order), and the leader's
/// remaining and reset; `None` without them.
#[derive(Debug)]
struct XRateLimit {
    leader: String,
    listed: Vec<String>,
    remaining: u64,
    reset: u64,
}

fn x_ratelimit(resp: &RateLimitResponse) -> Option<XRateLimit> {
    let get = |key: &str| {
        let found = resp.response_headers_to_add.iter().find(|h| h.key == key);
        found.map(|h| h.value.clone())
    };
    let keys: Vec<&str> = resp.response_headers_to_add.iter().map(|h| h.key.as_str()).collect();
    if keys.is_empty() {
        return None;
    }
    assert_eq!(keys, ["X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"], "{resp:?}");
    let limit = get("X-RateLimit-Limit")?;
    let mut parts = limit.split(", ").map(String::from);
    let leader = parts.next()?;
    let mut listed: Vec<String> = parts.collect();
    listed.sort();
    Some(XRateLimit {
        leader,
        listed,
        remaining: get("X-RateLimit-Remaining")?.parse().ok()?,
        reset: get("X-RateLimit-Reset")?.parse().ok()?,
    })
}
