//! `sluice serve --listeners per-thread`: each thread takes connections on
//! a listener of its own (one port, `SO_REUSEPORT`) and decides on a Redis
//! connection of its own, and the decisions stay exact across them.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_harness::{free_port, Redis};
use sluice_policies::wire::{Encoding, PROTOCOL_VERSION};
#[path = "support/raw_post.rs"]
mod raw_post;

const THREADS: usize = 4;
const LIMIT: usize = 100;
const CHECKS: usize = 300;

/// Kills the shim when the test ends, passed or not.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn healthy(port: u16) -> bool {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let mut answer = String::new();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nhost: shim\r\nconnection: close\r\n\r\n").is_ok()
        && conn.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
}

/// 300 checks, each on a connection of its own, first of a concurrency
/// limit that admits them all, then of a limit of 100. An admitted request
/// carries its lease, named by the request id, whose prefix is its
/// limiter's nonce, one per thread: the first 300 carry 4 nonces, so each
/// of the 4 threads served some on its own Redis connection. Of the second
/// 300, exactly 100 are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_thread_serves_and_the_decisions_are_exact() {
    let redis = Redis::start().expect("redis");
    let port = free_port().expect("port");
    let shim = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--redis", &redis.url()])
        .args(["--listeners", "per-thread", "--threads", &THREADS.to_string()])
        .stderr(Stdio::null())
        .spawn()
        .expect("sluice serve");
    let shim = Killed(shim);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !healthy(port) {
        assert!(Instant::now() < deadline, "the shim did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let listeners = std::fs::read_dir(format!("/proc/{}/task", shim.0.id()))
        .expect("/proc")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("sluice-listener"))
        .count();
    assert_eq!(listeners, THREADS - 1, "threads of their own beside the first listener's");

    let all = checks(port, "everyone", CHECKS).await;
    let mut nonces: Vec<&str> = all.iter().filter_map(|l| l.split('.').next()).collect();
    nonces.sort_unstable();
    nonces.dedup();
    assert_eq!(all.len(), CHECKS, "admitted under a limit none reaches");
    assert_eq!(nonces.len(), THREADS, "limiters that admitted: {nonces:?}");

    let admitted = checks(port, "contended", LIMIT).await;
    assert_eq!(admitted.len(), LIMIT, "admitted of {CHECKS}");
}

/// `CHECKS` checks of a concurrency limit of `limit` on `key`, at once,
/// each on a connection of its own: the leases of those admitted.
async fn checks(port: u16, key: &str, limit: usize) -> Vec<String> {
    let body = format!(
        r#"{{"checks":[{{"policy":"p","key":"{key}","limits":[{{"type":"concurrency","limit":{limit},"lease_ms":3600000}}]}}]}}"#
    );
    let calls: Vec<_> = (0..CHECKS)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move {
                raw_post::post(port, "/v1/check", Encoding::Json, PROTOCOL_VERSION, body.as_bytes()).await
            })
        })
        .collect();
    let mut leases = Vec::new();
    for call in calls {
        let (status, _, answer) = call.await.expect("a call");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        let answer: serde_json::Value = serde_json::from_slice(&answer).expect("JSON");
        if answer["allowed"] == true {
            leases.push(answer["lease"].as_str().expect("an admitted request's lease").to_string());
        }
    }
    leases
}
