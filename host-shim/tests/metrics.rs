//! `GET /metrics`, read back after real traffic: the shim in process on a
//! real socket, in front of a real redis-server. Each count is the one the
//! traffic must produce: decisions per policy and result, one latency
//! sample per script call, script errors and NOSCRIPT reloads, and, for
//! egress waiting, the waiter held and the hand-over that frees it.

use std::time::{Duration, Instant};

use sluice_harness::client::http;
use sluice_harness::Redis;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{
    Check, CheckBatch, CheckRequest, CheckResponse, Encoding, ReleaseRequest, WireLimit,
};
use sluice_shim::limiter::Limiter;
use sluice_shim::server::{run, Options};
use sluice_shim::store::Target;

/// A shim on a free port until the test ends; its port.
async fn serve(redis: &Redis, test_time: bool) -> u16 {
    let limiter =
        Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), test_time).expect("limiter");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(run(listener, limiter, Options::default(), std::future::pending()));
    port
}

fn check(policy: &str, key: &str, limit: WireLimit) -> Check {
    Check {
        policy: policy.into(),
        key: key.into(),
        limits: vec![limit],
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }
}

/// Posts a check; its status and, on 200, its answer.
async fn post_check(
    port: u16,
    checks: Vec<Check>,
    id: &str,
    now_us: Option<u64>,
    wait_ms: Option<u64>,
) -> (u16, Option<CheckResponse>) {
    let req = CheckRequest {
        checks: checks.into(),
        id: Some(id.to_string().into()),
        now_us: now_us.map(Micros),
        wait_ms: wait_ms.map(Millis),
        views: Default::default(),
    };
    let (status, body) = http(port, "POST", "/v1/check", &serde_json::to_string(&req).expect("json")).await;
    (status, serde_json::from_str(&body).ok())
}

async fn metrics(port: u16) -> String {
    let (status, page) = http(port, "GET", "/metrics", "").await;
    assert_eq!(status, 200, "{page}");
    page
}

/// The value of sample `name` (labels included, as written); 0 if absent.
fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .filter_map(|line| line.rsplit_once(' '))
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0.0)
}

fn decisions(page: &str, policy: &str, result: &str) -> f64 {
    sample(page, &format!(r#"sluice_decisions_total{{policy="{policy}",result="{result}",face="filter"}}"#))
}

/// Checks of two policies, a denial that names the policy that denied, a
/// refused request, a Redis that refuses scripts, and a SCRIPT FLUSH: each
/// shows up once where it belongs, every script call is timed, and nothing
/// is left in flight.
#[tokio::test]
async fn metrics_count_each_decision_script_call_and_reload() {
    let redis = Redis::start().expect("redis");
    let port = serve(&redis, true).await;
    // One explicit time: the fixed window cannot roll over mid-test.
    let now = Some(1_700_000_000_000_000);
    let partner = |key: &str| {
        check("partner-api", key, WireLimit::FixedWindow { limit: 2, window_ms: Millis(60_000), cost: 1 })
    };
    let search =
        || check("search", "k", WireLimit::FixedWindow { limit: 100, window_ms: Millis(60_000), cost: 1 });

    for (i, allowed) in [true, true, false].into_iter().enumerate() {
        let (status, resp) = post_check(port, vec![partner("k")], &format!("r{i}"), now, None).await;
        assert_eq!((status, resp.map(|r| r.allowed)), (200, Some(allowed)), "request {i}");
    }
    let (_, resp) = post_check(port, vec![search()], "r3", now, None).await;
    assert_eq!(resp.map(|r| r.allowed), Some(true));
    // Search admits, partner-api denies: the denial is partner-api's alone.
    let (_, resp) = post_check(port, vec![search(), partner("k")], "r4", now, None).await;
    assert_eq!(resp.map(|r| r.allowed), Some(false));
    // Refused before Redis is asked: no script call.
    let (status, _) = post_check(port, vec![partner("k")], "not an id", now, None).await;
    assert_eq!(status, 400);
    redis.refuse_scripts().expect("ACL");
    let (status, _) = post_check(port, vec![search()], "r5", now, None).await;
    assert_eq!(status, 503);
    redis.allow_scripts().expect("ACL");

    let page = metrics(port).await;
    assert_eq!(decisions(&page, "partner-api", "allowed"), 2.0, "{page}");
    assert_eq!(decisions(&page, "partner-api", "denied"), 2.0);
    assert_eq!(decisions(&page, "partner-api", "invalid"), 1.0);
    assert_eq!(decisions(&page, "search", "allowed"), 1.0);
    assert_eq!(decisions(&page, "search", "denied"), 0.0);
    assert_eq!(decisions(&page, "search", "error"), 1.0);
    assert_eq!(sample(&page, "sluice_redis_call_seconds_count"), 6.0, "one per script call");
    assert_eq!(sample(&page, r#"sluice_script_errors_total{kind="server"}"#), 1.0);
    assert_eq!(sample(&page, "sluice_script_reloads_total"), 1.0, "loaded once, on first use");
    assert_eq!(sample(&page, "sluice_requests_in_flight"), 0.0);
    assert_eq!(sample(&page, "sluice_waiters"), 0.0);

    let mut conn = redis.connection().expect("redis connection");
    redis::cmd("SCRIPT").arg("FLUSH").query::<()>(&mut conn).expect("SCRIPT FLUSH");
    let (_, resp) = post_check(port, vec![search()], "r6", now, None).await;
    assert_eq!(resp.map(|r| r.allowed), Some(true));
    let page = metrics(port).await;
    assert_eq!(sample(&page, "sluice_script_reloads_total"), 2.0, "loaded again after the flush: {page}");
    assert_eq!(sample(&page, "sluice_redis_call_seconds_count"), 7.0);
    assert_eq!(decisions(&page, "search", "allowed"), 2.0);
}

/// A concurrency limit of 1 with a wait: the second check is held (one
/// waiter, one request in flight) until the first's release hands its slot
/// over; then it counts as waited, the hand-over is counted, and nothing is
/// held or in flight.
#[tokio::test]
async fn a_held_waiter_and_its_hand_over_are_counted() {
    let redis = Redis::start().expect("redis");
    let port = serve(&redis, false).await;
    let slot = || vec![check("egress", "k", WireLimit::Concurrency { limit: 1, lease_ms: Millis(30_000) })];

    let (_, first) = post_check(port, slot(), "first", None, Some(10_000)).await;
    assert_eq!(first.as_ref().map(|r| r.allowed), Some(true));
    let second = tokio::spawn(post_check(port, slot(), "second", None, Some(10_000)));

    let deadline = Instant::now() + Duration::from_secs(10);
    let mut page = metrics(port).await;
    while sample(&page, "sluice_waiters") < 1.0 {
        assert!(Instant::now() < deadline, "the second check was never held: {page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        page = metrics(port).await;
    }
    assert_eq!(sample(&page, "sluice_waiters"), 1.0);
    assert_eq!(sample(&page, "sluice_requests_in_flight"), 1.0, "the held check, not the scrape");
    assert_eq!(sample(&page, "sluice_handovers_total"), 0.0);

    let release = ReleaseRequest { lease: "first".into(), checks: slot() };
    let (status, _) =
        http(port, "POST", "/v1/release", &serde_json::to_string(&release).expect("json")).await;
    assert_eq!(status, 200);
    let (status, resp) = second.await.expect("second check");
    let resp = resp.expect("an answer");
    assert_eq!((status, resp.allowed, resp.lease.as_deref()), (200, true, Some("second")));
    assert!(resp.waited_ms.is_some_and(|ms| ms > Millis(0)), "{resp:?}");

    let page = metrics(port).await;
    assert_eq!(decisions(&page, "egress", "allowed"), 1.0, "{page}");
    assert_eq!(decisions(&page, "egress", "waited"), 1.0);
    assert_eq!(sample(&page, "sluice_handovers_total"), 1.0);
    assert_eq!(sample(&page, "sluice_waiters"), 0.0);
    assert_eq!(sample(&page, "sluice_requests_in_flight"), 0.0);
}

/// The partner's answers are counted by what they did: the first refusal
/// pauses the key and lowers its rate; a second one inside the pause, as
/// long, moves nothing; a longer one only extends the pause.
#[tokio::test]
async fn the_partners_answers_are_counted_by_effect() {
    use sluice_policies::wire::{FeedbackRequest, Pause, Slowdown};
    let redis = Redis::start().expect("redis");
    let port = serve(&redis, true).await;
    let slow = Some(Slowdown { decrease_ppm: 500_000, recover_ms: Millis(60_000), min_ppm: 50_000 });
    let t0 = 1_700_000_000_000_000u64;
    for (dt, pause_ms) in [(0, 2_000), (1_000, 1_000), (2_000, 5_000)] {
        let req = FeedbackRequest {
            pauses: vec![Pause {
                policy: "partner".into(),
                key: "acme".into(),
                pause_ms: Millis(pause_ms),
                slow,
            }],
            now_us: Some(Micros(t0 + dt)),
        };
        let (status, body) =
            http(port, "POST", "/v1/feedback", &serde_json::to_string(&req).expect("json")).await;
        assert_eq!(status, 200, "{body}");
    }
    let page = metrics(port).await;
    let effect = |effect: &str| {
        sample(&page, &format!(r#"sluice_upstream_feedback_total{{policy="partner",effect="{effect}"}}"#))
    };
    assert_eq!((effect("paused"), effect("slowed")), (2.0, 1.0), "{page}");
}

/// Shared callouts: each batch (`POST /v1/checks`) is observed once, with
/// the checks it carried, so the mean batch is `_sum / _count`.
#[tokio::test]
async fn each_batch_is_counted_with_its_checks() {
    let redis = Redis::start().expect("redis");
    let port = serve(&redis, false).await;
    let limit = WireLimit::FixedWindow { limit: 100, window_ms: Millis(60_000), cost: 1 };
    for n in [3_usize, 5] {
        let checks = (0..n)
            .map(|i| {
                let req = CheckRequest {
                    checks: vec![check("batched", &format!("k{i}"), limit)].into(),
                    id: Some(format!("b{n}-{i}").into()),
                    now_us: None,
                    wait_ms: None,
                    views: Default::default(),
                };
                serde_json::to_vec(&req).expect("json")
            })
            .collect();
        let body = Encoding::Json.encode(&CheckBatch { checks }).expect("encodes");
        let (status, page) =
            http(port, "POST", "/v1/checks", std::str::from_utf8(&body).expect("utf-8")).await;
        assert_eq!(status, 200, "{page}");
    }
    let page = metrics(port).await;
    assert_eq!(sample(&page, "sluice_batch_checks_count"), 2.0, "{page}");
    assert_eq!(sample(&page, "sluice_batch_checks_sum"), 8.0, "{page}");
}
