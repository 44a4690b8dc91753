//! The harness itself, without the plugin or the shim: a private Redis and the
//! in-process upstream start, serve, and are gone once dropped; a Redis
//! crashes and comes back empty on its port; the fault suite's judges count
//! only certain over-admissions.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use sluice_harness::client::burst;
use sluice_harness::faults::{busiest_window, most_at_once, Admission};
use sluice_harness::{Redis, Upstream};

fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Redis starts on its own port, answers, and is stopped by its guard.
#[test]
fn redis_starts_answers_and_stops() {
    let redis = Redis::start().expect("starting redis-server");
    let port = redis.port;
    let mut conn = redis.connection().expect("connecting");
    let pong: String = redis::cmd("PING").query(&mut conn).expect("PING");
    assert_eq!(pong, "PONG");
    drop(conn);
    drop(redis);
    assert!(!listening(port), "redis-server still listening on {port} after drop");
}

/// The upstream answers 200 to any method and path, and stops on drop.
#[test]
fn upstream_answers_ok_to_anything() {
    let upstream = Upstream::start().expect("starting the upstream");
    let port = upstream.port;
    for (method, path) in [("GET", "/"), ("DELETE", "/v42/orders"), ("POST", "/x?y=z")] {
        let replies = burst(port, method, path, Some(("x-api-key", "k")), 5).expect("requests");
        assert!(replies.iter().all(|reply| reply.status == 200), "{method} {path}: {replies:?}");
    }
    drop(upstream);
    assert!(!listening(port), "upstream still listening on {port} after drop");
}

/// A killed Redis refuses connections; started again it is on the same port, empty.
#[test]
fn redis_killed_comes_back_empty_on_its_port() {
    let mut redis = Redis::start().expect("starting redis-server");
    let port = redis.port;
    let mut conn = redis.connection().expect("connecting");
    let () = redis::cmd("SET").arg("k").arg("v").query(&mut conn).expect("SET");
    redis.kill();
    assert!(!listening(port), "a killed redis-server still listens");
    redis.start_again().expect("starting again");
    assert_eq!(redis.port, port);
    let mut conn = redis.connection().expect("connecting again");
    let value: Option<String> = redis::cmd("GET").arg("k").query(&mut conn).expect("GET");
    assert_eq!(value, None, "persistence is off");
}

/// The window judge counts a request only if both its sending and its
/// arrival fall inside the window: a slow arrival never makes a false
/// over-admission, and admissions wholly inside one window are all counted.
#[test]
fn the_window_judge_counts_only_what_is_certainly_inside() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let adm = |sent: u64, arrived: u64| Admission { sent: at(sent), arrived: at(arrived) };
    let window = Duration::from_millis(1000);
    // Two per window, but one of them reached the upstream late: never three.
    let late = [adm(0, 10), adm(10, 1500), adm(1001, 1002), adm(1005, 1006)];
    assert_eq!(busiest_window(&late, window, t0), 2);
    // Three wholly inside [0, 1000).
    let over = [adm(0, 1), adm(500, 501), adm(998, 999)];
    assert_eq!(busiest_window(&over, window, t0), 3);
    // Only windows that start at or after `from`.
    assert_eq!(busiest_window(&over, window, at(400)), 2);
}

/// Intervals that only touch do not overlap; nested ones do.
#[test]
fn the_in_flight_judge_counts_overlaps() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    assert_eq!(most_at_once(&[(at(0), at(10)), (at(10), at(20)), (at(20), at(30))]), 1);
    assert_eq!(most_at_once(&[(at(0), at(100)), (at(10), at(20)), (at(15), at(16))]), 3);
    assert_eq!(most_at_once(&[]), 0);
}
