//! A policy change under a running gateway, as a listener update: real
//! Envoy takes its listener (with the filter's policy document) from a file
//! it watches (LDS, `path_config_source`), and the test renames a changed
//! document into place. Each claim is asserted:
//!
//! - a request in flight finishes under the policy that admitted it: it
//!   holds that policy's lease in Redis across the update, and completes (200);
//! - a lease taken under a policy the update removed is still released: the
//!   concurrency lease is gone from Redis when that request ends, long
//!   before the lease could expire;
//! - a lowered limit holds from the next request on: a limit lowered below
//!   what the window already counted refuses the very next request;
//! - counters of an unchanged limit are kept: a limit the update left alone
//!   admits only what was left of its window, not a fresh window.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use redis::Commands;
use sluice_harness::gateway::{open_request, send};
use sluice_harness::{Envoy, Redis, Shim};

const LEASE_MS: u64 = 30_000;

fn document(lowered_limit: u32, with_removed: bool) -> String {
    let removed = format!(
        r#",{{"name": "removed", "match": {{"path_prefix": "/held"}}, "key": ["header:x-api-key"],
             "limits": [{{"type": "concurrency", "limit": 2, "lease": "{LEASE_MS}ms"}}]}}"#
    );
    format!(
        r#"{{"shim": {{"timeout_ms": 2000}}, "headers": "always", "policies": [
            {{"name": "kept", "match": {{"path_prefix": "/kept"}}, "key": ["header:x-api-key"],
              "limits": [{{"type": "fixed_window", "limit": 10, "window": "1h"}}]}},
            {{"name": "lowered", "match": {{"path_prefix": "/lowered"}}, "key": ["header:x-api-key"],
              "limits": [{{"type": "fixed_window", "limit": {lowered_limit}, "window": "1h"}}]}}{}]}}"#,
        if with_removed { removed.as_str() } else { "" }
    )
}

/// An upstream that answers at once, except `/held`, which it answers only
/// once the test opens the gate.
struct GatedUpstream {
    port: u16,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl GatedUpstream {
    fn start() -> GatedUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let shared = gate.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let gate = shared.clone();
                std::thread::spawn(move || serve(conn, &gate));
            }
        });
        GatedUpstream { port, gate }
    }

    fn open(&self) {
        let (open, changed) = &*self.gate;
        *open.lock().expect("gate") = true;
        changed.notify_all();
    }
}

/// HTTP/1.1 keep-alive, GET only: Envoy's pooled connections.
fn serve(conn: TcpStream, gate: &(Mutex<bool>, Condvar)) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone"));
    let mut conn = conn;
    loop {
        let mut first = String::new();
        if reader.read_line(&mut first).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
        }
        if first.contains(" /held") {
            let (open, changed) = gate;
            let mut open = open.lock().expect("gate");
            while !*open {
                open = changed.wait(open).expect("gate");
            }
        }
        if conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n").is_err() {
            return;
        }
    }
}

fn status(envoy: &Envoy, path: &str) -> u16 {
    send(envoy.port, "GET", path, &[("x-api-key", "k")]).expect("request").status
}

#[test]
fn a_listener_update_keeps_what_it_should_and_changes_what_it_should() {
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let upstream = GatedUpstream::start();
    let envoy = Envoy::start_dynamic(&document(10, true), shim.port, upstream.port).expect("envoy");
    let mut conn = redis.connection().expect("redis connection");

    // Six of ten counted in both windows.
    for _ in 0..6 {
        assert_eq!(status(&envoy, "/kept"), 200);
        assert_eq!(status(&envoy, "/lowered"), 200);
    }
    // A request admitted by `removed`, holding its lease at the upstream.
    let mut held = open_request(envoy.port, "/held", &[("x-api-key", "k")]).expect("request");
    let mut lease_keys = || -> Vec<String> { conn.keys("sluice:{removed:*}:cc:*").unwrap_or_default() };
    let deadline = Instant::now() + Duration::from_secs(20);
    let lease_key = loop {
        let sub = format!("}}:cc:{LEASE_MS}:");
        if let Some(key) = lease_keys().into_iter().find(|k| !k.contains(&sub)) {
            break key;
        }
        assert!(Instant::now() < deadline, "the held request never took its lease");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut conn = redis.connection().expect("redis connection");
    assert_eq!(conn.zcard::<_, usize>(&lease_key).expect("ZCARD"), 1, "one lease held");

    // The update: `lowered` to 4, `removed` gone, `kept` as it was.
    let updated = Instant::now();
    envoy.update_policy(&document(4, false)).expect("listener update");
    eprintln!("RELOAD the listener update took {:.1} s", updated.elapsed().as_secs_f64());

    // A lowered limit holds from the next request on.
    let lowered = status(&envoy, "/lowered");
    assert_eq!(lowered, 429, "the first request after lowering the limit to 4 (6 counted)");
    // Counters of an unchanged limit are kept: 4 left of 10, then refused.
    let kept: Vec<u16> = (0..5).map(|_| status(&envoy, "/kept")).collect();
    assert_eq!(kept, [200, 200, 200, 200, 429], "the unchanged limit's window went on");

    // The request in flight finishes under the policy that admitted it.
    upstream.open();
    let mut answer = String::new();
    held.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut buf = [0u8; 4096];
    while !answer.contains("ok\n") {
        let n = held.read(&mut buf).expect("the held request's answer");
        assert!(n > 0, "connection closed before the answer: {answer}");
        answer.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(held);
    // Its lease, of a policy no longer loaded, is released at its end.
    let ended = Instant::now();
    let deadline = ended + Duration::from_secs(10);
    while conn.zcard::<_, usize>(&lease_key).unwrap_or(1) > 0 {
        assert!(Instant::now() < deadline, "the removed policy's lease was not released\n{}", envoy.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "RELOAD lowered 10 -> 4 after 6: next request {lowered}; kept at 10 after 6: {kept:?}; removed policy's \
         lease released {:.2} s after its request ended (lease {LEASE_MS} ms)",
        ended.elapsed().as_secs_f64()
    );
}
