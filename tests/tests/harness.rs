//! The harness itself, without the plugin or the shim: a private Redis and the
//! in-process upstream start, serve, and are gone once dropped.

use std::net::TcpStream;

use sluice_tests::client::burst;
use sluice_tests::{Redis, Upstream};

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
