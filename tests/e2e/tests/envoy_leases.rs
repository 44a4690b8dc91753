//! Concurrency leases end to end through real Envoy, `sluice.wasm`, the shim
//! and Redis: a lease is released exactly once however the stream ends (a
//! normal end, an upstream 500, an upstream connection reset, a client reset,
//! the route timing out), and a lease whose release failed is reclaimed by
//! its TTL and counted.
//!
//! Each check is against Redis (`ZCARD` of the lease set), polled with a
//! deadline, and against the stats: `released` equals the requests, and the
//! shim cluster saw exactly one release per check.

use std::time::Duration;

use sluice_harness::gateway::{
    envoy_with_route_timeout, eventually, open_request, prometheus, sample, send, Response, RoughUpstream,
};
use sluice_harness::{Envoy, Redis, Shim};

const WAIT: Duration = Duration::from_secs(15);

struct Pool {
    envoy: Envoy,
    shim: Shim,
    _upstream: RoughUpstream,
    redis: Redis,
    set: String,
}

impl Pool {
    /// `limit` in flight per `x-api-key`, leases of `lease`; the route times out after 1 s.
    fn start(limit: u32, lease: &str) -> Pool {
        Pool::with_route_timeout(limit, lease, "1s")
    }

    /// As [`Pool::start`], the route timing out after `route_timeout`.
    fn with_route_timeout(limit: u32, lease: &str, route_timeout: &str) -> Pool {
        let doc = format!(
            r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "policies": [{{"name": "pool",
                "key": ["header:x-api-key"], "limits": [{{"type": "concurrency", "limit": {limit}, "lease": "{lease}"}}]}}]}}"#
        );
        let redis = Redis::start().expect("redis");
        let shim = Shim::start(&redis.url()).expect("shim");
        let upstream = RoughUpstream::start().expect("upstream");
        let envoy = envoy_with_route_timeout(&doc, shim.port, upstream.port, route_timeout).expect("envoy");
        let lease_ms = sluice_policies::Duration::parse(lease).expect("lease").as_millis();
        Pool { envoy, shim, _upstream: upstream, redis, set: format!("sluice:{{pool:alice}}:cc:{lease_ms}") }
    }

    fn get(&self, path: &str) -> Response {
        send(self.envoy.port, "GET", path, &[("x-api-key", "alice")]).expect("request")
    }

    fn held(&self) -> u64 {
        let mut conn = self.redis.connection().expect("redis");
        redis::cmd("ZCARD").arg(&self.set).query(&mut conn).expect("ZCARD")
    }

    fn stat(&self, name: &str) -> f64 {
        prometheus(&self.envoy).map(|page| sample(&page, name)).unwrap_or(-1.0)
    }

    /// Every lease is back, each of the `requests` admitted was released
    /// once and no release failed: the shim cluster saw `checks` checks and
    /// one release per admitted request.
    fn assert_released_once(&self, requests: usize, checks: usize) {
        assert!(
            eventually(WAIT, || self.held() == 0),
            "{} leases still held\n{}",
            self.held(),
            self.envoy.log()
        );
        let n = requests as f64;
        let released = eventually(WAIT, || self.stat(r#"sluice_released{policy="pool"}"#) == n);
        assert!(
            released,
            "released {} of {n}\n{}",
            self.stat(r#"sluice_released{policy="pool"}"#),
            self.shim.log()
        );
        let shim_calls = r#"envoy_cluster_upstream_rq_total{envoy_cluster_name="sluice_shim"}"#;
        assert!(
            eventually(WAIT, || self.stat(shim_calls) == n + checks as f64),
            "shim calls {}",
            self.stat(shim_calls)
        );
        assert_eq!(self.stat(r#"sluice_release_failed{policy="pool"}"#), 0.0);
    }
}

/// A normal end: 10 requests in turn each take the one slot and return it.
/// The filter holds the response's last byte until the shim has confirmed
/// the release, so the slot is free the moment the client has the whole
/// response: no waiting between requests.
#[test]
fn a_lease_is_released_once_on_a_normal_end() {
    let pool = Pool::start(1, "30s");
    for _ in 0..10 {
        let reply = pool.get("/ok");
        assert_eq!(reply.status, 200, "{reply:?}\n{}", pool.envoy.log());
        assert_eq!(pool.held(), 0, "the response ended before its slot was free");
    }
    pool.assert_released_once(10, 10);
}

/// Regression: a finished request's slot was not free for the next one. A
/// concurrency limit of 3, a slow upstream, and three clients that each send
/// their next request the moment their response ends (the ERP workers'
/// back-to-back calls). The release used to wait for the root context's next
/// tick, so the next request found its own slot still held and got 429.
#[test]
fn back_to_back_requests_find_their_own_slot_free() {
    let pool = Pool::start(3, "30s");
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..3)
            .map(|_| s.spawn(|| (0..5).map(|_| pool.get("/slow").status).collect::<Vec<u16>>()))
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("worker")).collect()
    });
    assert_eq!(statuses, vec![200; 15], "{}", pool.envoy.log());
    pool.assert_released_once(15, 15);
}

/// The upstream answers 500: the lease is still released once.
#[test]
fn a_lease_is_released_once_when_the_upstream_answers_500() {
    let pool = Pool::start(1, "30s");
    assert_eq!(pool.get("/500").status, 500);
    pool.assert_released_once(1, 1);
}

/// The upstream resets the connection (Envoy answers 503): released once.
#[test]
fn a_lease_is_released_once_when_the_upstream_resets() {
    let pool = Pool::start(1, "30s");
    assert_eq!(pool.get("/reset").status, 503);
    pool.assert_released_once(1, 1);
}

/// The route times out after 1 s on an upstream that hangs (504): released once.
#[test]
fn a_lease_is_released_once_when_the_stream_times_out() {
    let pool = Pool::start(1, "30s");
    assert_eq!(pool.get("/hang").status, 504);
    pool.assert_released_once(1, 1);
}

/// The client resets while the upstream hangs: the slot is held while the
/// request is in flight, and released once after the reset.
#[test]
fn a_lease_is_released_once_when_the_client_resets() {
    let pool = Pool::start(1, "30s");
    let client = open_request(pool.envoy.port, "/hang", &[("x-api-key", "alice")]).expect("request");
    assert!(eventually(WAIT, || pool.held() == 1), "the slot was never taken");
    assert_eq!(pool.get("/ok").status, 429, "the one slot is held; concurrency denials are never cached");
    drop(client);
    pool.assert_released_once(1, 2);
    assert_eq!(pool.get("/ok").status, 200, "the slot is free again");
}

/// A release that fails (Redis refuses the scripts) is counted as
/// release_failed; the slot stays held until its 1 s lease expires, and the
/// next check reclaims it, counted as reclaimed.
#[test]
fn a_failed_release_is_reclaimed_by_the_lease_ttl() {
    let pool = Pool::start(1, "1s");
    let client = open_request(pool.envoy.port, "/hang", &[("x-api-key", "alice")]).expect("request");
    assert!(eventually(WAIT, || pool.held() == 1), "the slot was never taken");
    // The shim answers 503 to everything, the release included.
    pool.redis.refuse_scripts().expect("ACL");
    drop(client);
    assert!(
        eventually(WAIT, || pool.stat(r#"sluice_release_failed{policy="pool"}"#) == 1.0),
        "{}",
        pool.envoy.log()
    );
    assert_eq!(pool.held(), 1, "the failed release left the slot held");
    pool.redis.allow_scripts().expect("ACL");
    assert!(eventually(WAIT, || pool.get("/ok").status == 200), "the lease never expired");
    assert_eq!(pool.stat(r#"sluice_reclaimed{policy="pool"}"#), 1.0);
    let own = eventually(WAIT, || pool.stat(r#"sluice_released{policy="pool"}"#) == 1.0);
    assert!(
        own,
        "the admitted request's own lease: released {}",
        pool.stat(r#"sluice_released{policy="pool"}"#)
    );
}

/// Regression: a live request lost its lease. Leases were never renewed, so
/// a stream that ran longer than its lease was reclaimed while it still ran,
/// and the check that reclaimed it admitted a second request into a pool of
/// one. The filter now renews a live stream's lease every third of its
/// length: after two and a half lease lengths the slot is still held, the
/// next request is refused, and nothing was reclaimed.
#[test]
fn a_live_stream_keeps_its_lease_past_the_lease_length() {
    let pool = Pool::with_route_timeout(1, "2s", "30s");
    let client = open_request(pool.envoy.port, "/hang", &[("x-api-key", "alice")]).expect("request");
    assert!(eventually(WAIT, || pool.held() == 1), "the slot was never taken");
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(pool.get("/ok").status, 429, "the live stream's lease was reclaimed\n{}", pool.envoy.log());
    assert_eq!(pool.stat(r#"sluice_reclaimed{policy="pool"}"#), 0.0);
    drop(client);
    assert!(eventually(WAIT, || pool.held() == 0), "the ended stream kept its slot");
    assert_eq!(pool.get("/ok").status, 200, "the slot is free again");
}
