//! The operator's endpoints (the dashboard and `/metrics`) kept apart from
//! the decision port: with `--admin-listen` they are served only there; with
//! `--admin-token-file` they answer 401 without `Authorization: Bearer
//! <token>`, and the token never reaches the log. And a client that sends its
//! body a byte a second is cut off by the body-read deadline.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_harness::Redis;

const TOKEN: &str = "tok-9f2c41d7e3b8a605";

fn serve(redis_url: &str, extra: &[&str]) -> (Child, u16) {
    let port = sluice_harness::paths::free_port().expect("port");
    let mut shim = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--redis", redis_url])
        .args(extra)
        .env("RUST_LOG", "debug")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice serve");
    for _ in 0..400 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (shim, port);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = shim.kill();
    let _ = shim.wait();
    panic!("the shim never listened on {port}");
}

/// SIGTERM, then its whole log.
fn stop(mut shim: Child) -> String {
    let _ = Command::new("kill").arg(shim.id().to_string()).status();
    let _ = shim.wait();
    let mut log = String::new();
    shim.stderr.take().expect("stderr").read_to_string(&mut log).expect("log");
    log
}

/// The status code and the whole answer of one HTTP/1.1 request.
fn get(port: u16, path: &str, authorization: Option<&str>) -> (u16, String) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let auth = authorization.map(|a| format!("authorization: {a}\r\n")).unwrap_or_default();
    let head = format!("GET {path} HTTP/1.1\r\nhost: shim\r\n{auth}connection: close\r\n\r\n");
    conn.write_all(head.as_bytes()).expect("write");
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, answer)
}

fn wait_listening(port: u16) {
    for _ in 0..400 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on {port}");
}

const ADMIN_PATHS: [&str; 3] = ["/", "/dashboard.json", "/metrics"];

/// With `--admin-listen`, the dashboard and `/metrics` are absent (404) on
/// the decision port and served on the admin one; decisions and `/healthz`
/// stay on the decision port only.
#[test]
fn admin_routes_move_to_their_own_listener() {
    let redis = Redis::start().expect("redis");
    let admin = sluice_harness::paths::free_port().expect("port");
    let (shim, port) = serve(&redis.url(), &["--admin-listen", &format!("127.0.0.1:{admin}")]);
    wait_listening(admin);
    for path in ADMIN_PATHS {
        let (status, answer) = get(port, path, None);
        assert_eq!(status, 404, "{path} still served on the decision port: {answer}");
        let (status, answer) = get(admin, path, None);
        assert_eq!(status, 200, "{path} not served on the admin port: {answer}");
    }
    assert_eq!(get(port, "/healthz", None).0, 200);
    assert_eq!(get(admin, "/healthz", None).0, 404, "the admin port serves only the operator's routes");
    stop(shim);
}

/// With `--admin-token-file`, each operator's route answers 401 without the
/// token or with a wrong one, 200 with it; decisions need no token; the
/// token is in no log line.
#[test]
fn admin_routes_require_the_token_and_it_is_never_logged() {
    let redis = Redis::start().expect("redis");
    let dir = sluice_harness::scratch_dir("admin").expect("scratch dir");
    let file = dir.join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).expect("token file");
    let (shim, port) = serve(&redis.url(), &["--admin-token-file", file.to_str().expect("utf-8 path")]);
    let bearer = format!("Bearer {TOKEN}");
    let wrong = format!("Bearer {}x", TOKEN);
    for path in ADMIN_PATHS {
        assert_eq!(get(port, path, None).0, 401, "{path} without a token");
        assert_eq!(get(port, path, Some(&wrong)).0, 401, "{path} with a wrong token");
        assert_eq!(get(port, path, Some(TOKEN)).0, 401, "{path} without the Bearer scheme");
        let (status, answer) = get(port, path, Some(&bearer));
        assert_eq!(status, 200, "{path} with the token: {answer}");
    }
    assert_eq!(get(port, "/healthz", None).0, 200, "health checks need no token");
    let log = stop(shim);
    assert!(log.contains("sluice shim serving"), "the log was not captured: {log}");
    assert!(!log.contains(TOKEN), "the token reached the log:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that sends its headers at once, then its body a byte a second,
/// gets 408 and its connection closed at the body-read deadline (here 2 s),
/// long before the body would be complete.
#[test]
fn a_slow_body_is_cut_off() {
    let redis = Redis::start().expect("redis");
    let (shim, port) = serve(&redis.url(), &["--body-read-timeout-ms", "2000"]);
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let body_len = 60;
    let head = format!("POST /v1/check HTTP/1.1\r\nhost: shim\r\ncontent-length: {body_len}\r\n\r\n");
    conn.write_all(head.as_bytes()).expect("write");
    conn.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut sent = 0;
    let mut closed = false;
    while sent < body_len {
        if conn.write_all(b" ").is_err() {
            closed = true;
            break;
        }
        sent += 1;
        let mut buf = [0u8; 1024];
        let slept = Instant::now();
        while slept.elapsed() < Duration::from_secs(1) {
            match conn.read(&mut buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
        }
        if closed {
            break;
        }
    }
    let answer = String::from_utf8_lossy(&answer).to_string();
    assert!(closed, "the connection was still open after the whole body, {:?}: {answer}", started.elapsed());
    assert!(sent < body_len, "the body was sent in full: {answer}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    stop(shim);
}
