//! Redis under memory pressure, on a real redis-server: a `maxmemory` with
//! an evicting policy would silently reset limits, so `GET /healthz` says so
//! while it holds; under `noeviction` a full Redis refuses the check's
//! writes, the check fails (503: `failure_mode` decides in the filter), and
//! the failure is counted as `sluice_script_errors_total{kind="oom"}`.

use std::time::{Duration, Instant};

use sluice_harness::client::http;
use sluice_harness::Redis;
use sluice_policies::units::Millis;
use sluice_policies::wire::{Check, CheckRequest, WireLimit};
use sluice_shim::limiter::Limiter;
use sluice_shim::server::{run, Options};
use sluice_shim::store::Target;

async fn serve(redis: &Redis) -> u16 {
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(run(listener, limiter, Options::default(), std::future::pending()));
    port
}

fn config(redis: &Redis, name: &str, value: &str) {
    let mut conn = redis.connection().expect("redis");
    let _: () = redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query(&mut conn).expect("CONFIG SET");
}

/// `/healthz` once the shim has read Redis's settings (it reads them at start).
async fn healthz_within(port: u16, within: Duration, until: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    loop {
        let (status, body) = http(port, "GET", "/healthz", "").await;
        assert_eq!(status, 200, "{body}");
        if until(&body) || started.elapsed() > within {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn check(port: u16) -> (u16, String) {
    let limit = WireLimit::FixedWindow { limit: 1_000, window_ms: Millis(60_000), cost: 1 };
    let checks = vec![Check {
        policy: "p".into(),
        key: "k".into(),
        limits: vec![limit],
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }];
    let req = CheckRequest {
        checks: checks.into(),
        id: None,
        now_us: None,
        wait_ms: None,
        views: Default::default(),
    };
    http(port, "POST", "/v1/check", &serde_json::to_string(&req).expect("json")).await
}

/// An evicting policy under a memory limit is named in `/healthz`, which
/// still answers 200: the shim serves, but its limits may be reset.
#[tokio::test]
async fn healthz_warns_of_an_evicting_policy() {
    let redis = Redis::start().expect("redis");
    config(&redis, "maxmemory", "1gb");
    config(&redis, "maxmemory-policy", "allkeys-lru");
    let port = serve(&redis).await;
    let body = healthz_within(port, Duration::from_secs(10), |b| b.contains("warning")).await;
    assert!(body.starts_with("ok\n"), "{body}");
    assert!(body.contains("warning: Redis maxmemory-policy is allkeys-lru"), "{body}");
}

/// `noeviction`, or no `maxmemory`, is safe: no warning.
#[tokio::test]
async fn no_warning_when_nothing_is_evicted() {
    let redis = Redis::start().expect("redis");
    config(&redis, "maxmemory", "1gb");
    config(&redis, "maxmemory-policy", "noeviction");
    let port = serve(&redis).await;
    // Give the shim's first read time to happen, then look.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, body) = http(port, "GET", "/healthz", "").await;
    assert_eq!(body, "ok\n");
}

/// A full Redis under `noeviction` refuses the check's writes: the check
/// fails (the filter's `failure_mode` decides) and is counted as `oom`.
#[tokio::test]
async fn a_full_redis_fails_checks_counted_as_oom() {
    let redis = Redis::start().expect("redis");
    let port = serve(&redis).await;
    assert_eq!(check(port).await.0, 200, "the first check loads the scripts");
    config(&redis, "maxmemory-policy", "noeviction");
    let mut conn = redis.connection().expect("redis");
    let _: () = redis::cmd("SET").arg("filler").arg(vec![b'x'; 2 << 20]).query(&mut conn).expect("SET");
    let info: String = redis::cmd("INFO").arg("memory").query(&mut conn).expect("INFO");
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory");
    // A limit below what Redis holds: it refuses every write from now on.
    config(&redis, "maxmemory", &(used - (1 << 20)).to_string());
    let (status, body) = check(port).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("OOM"), "{body}");
    let (_, page) = http(port, "GET", "/metrics", "").await;
    let oom = page
        .lines()
        .find_map(|l| l.strip_prefix(r#"sluice_script_errors_total{kind="oom"} "#))
        .and_then(|v| v.parse::<f64>().ok());
    assert_eq!(oom, Some(1.0), "{page}");
}
