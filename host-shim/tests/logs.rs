//! What `sluice serve` writes to its log when clients misbehave or Redis is
//! gone: a hostile value cannot forge a line or send a terminal escape (the
//! values a client controls have a fixed alphabet, and are logged with `?`),
//! and a failure that every request meets is one line a minute, not one per
//! request.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice_harness::Redis;
use sluice_policies::units::Millis;
use sluice_policies::wire::{Check, CheckRequest, WireLimit};

const FORGED: &str = "2026-01-01T00:00:00.000000Z  INFO forged line";

fn serve(redis_url: &str) -> (Child, u16) {
    let port = sluice_harness::paths::free_port().expect("port");
    let mut shim = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--redis", redis_url])
        .args(["--redis-timeout-ms", "200"])
        .env("RUST_LOG", "debug")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice serve");
    for _ in 0..200 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (shim, port);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = shim.kill();
    let _ = shim.wait();
    panic!("the shim never listened on {port}");
}

/// SIGTERM, so it flushes, then its whole log.
fn stop(mut shim: Child) -> String {
    let pid = shim.id().to_string();
    let _ = Command::new("kill").arg(pid).status();
    let _ = shim.wait();
    let mut log = String::new();
    shim.stderr.take().expect("stderr").read_to_string(&mut log).expect("log");
    log
}

fn request(id: &str, wait_ms: u64) -> Vec<u8> {
    let req = CheckRequest {
        checks: vec![Check {
            policy: "p".into(),
            key: "k".into(),
            limits: vec![WireLimit::Interval { every_ms: Millis(2_000) }],
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        }]
        .into(),
        now_us: None,
        id: Some(id.to_string().into()),
        wait_ms: Some(Millis(wait_ms)),
        views: Default::default(),
    };
    serde_json::to_vec(&req).expect("json")
}

fn send(port: u16, body: &[u8]) -> TcpStream {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let head = format!(
        "POST /v1/check HTTP/1.1\r\nhost: shim\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).expect("write");
    conn.write_all(body).expect("write");
    conn
}

fn answer(mut conn: TcpStream) -> String {
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer
}

/// A check whose id carries a newline, a forged log line and an ANSI escape
/// is refused at the door (400: ids, keys and policy names have a fixed
/// alphabet), and nothing of it reaches the log, even at debug level.
#[test]
fn a_hostile_client_value_never_reaches_the_log_raw() {
    let redis = Redis::start().expect("redis");
    let (shim, port) = serve(&redis.url());
    let id = format!("evil\n{FORGED}\u{1b}[31mred");
    let reply = answer(send(port, &request(&id, 5_000)));
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    let log = stop(shim);
    assert!(!log.contains('\u{1b}'), "a raw escape reached the log:\n{log}");
    assert!(!log.lines().any(|line| line.starts_with(FORGED)), "a forged line reached the log:\n{log}");
}

/// Redis is gone: every check fails (503), and the log says so once, not
/// once per check.
#[test]
fn a_redis_outage_is_one_log_line_not_one_per_request() {
    let dead = sluice_harness::paths::free_port().expect("port");
    let (shim, port) = serve(&format!("redis://127.0.0.1:{dead}"));
    for i in 0..20 {
        let reply = answer(send(port, &request(&format!("r{i}"), 0)));
        assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    }
    let log = stop(shim);
    let lines = log.matches("redis call failed").count();
    assert_eq!(lines, 1, "20 failed checks logged {lines} times:\n{log}");
}
