//! `sluice serve` as a process: it warns when it listens without
//! authentication beyond loopback, and SIGTERM still stops it promptly with
//! connections open (its accept loop is its own since the connection cap,
//! no longer `axum::serve`'s); `--threads` sizes its runtime.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_harness::free_port;

const WARNING: &str = "listening without authentication on a non-loopback address";

/// Starts `sluice serve --listen ADDR:PORT` (Redis unused: it connects lazily)
/// and waits until it answers `/healthz` on loopback.
fn serve(addr: &str, extra: &[&str]) -> (Child, u16) {
    let port = free_port().expect("port");
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", &format!("{addr}:{port}"), "--redis", "redis://127.0.0.1:1"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice serve");
    let deadline = Instant::now() + Duration::from_secs(10);
    while healthz(port).is_none() {
        assert!(Instant::now() < deadline, "the shim did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, port)
}

fn healthz(port: u16) -> Option<String> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.write_all(b"GET /healthz HTTP/1.1\r\nhost: shim\r\nconnection: close\r\n\r\n").ok()?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).ok()?;
    answer.starts_with("HTTP/1.1 200").then_some(answer)
}

/// SIGTERM, then its exit within `within`, and its log.
fn stop(mut child: Child, within: Duration) -> String {
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the shim did not stop within {within:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut log = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut log).expect("log");
    log
}

/// Cleartext on every address: a warning. On loopback, or with mTLS: none.
#[test]
fn cleartext_beyond_loopback_is_warned_about() {
    let (child, _) = serve("0.0.0.0", &[]);
    let log = stop(child, Duration::from_secs(5));
    assert!(log.contains(WARNING), "{log}");
    assert!(log.contains("auth=\"none\"") || log.contains("auth=none"), "{log}");

    let (child, _) = serve("127.0.0.1", &[]);
    let log = stop(child, Duration::from_secs(5));
    assert!(!log.contains(WARNING), "{log}");
}

/// With an idle keep-alive connection, a connection that has sent nothing
/// and one mid-headers open, SIGTERM stops the shim once the last has had
/// its header read timeout (1 s here): a half-sent request cannot hold it.
#[test]
fn sigterm_stops_the_shim_with_connections_open() {
    let (child, port) = serve("127.0.0.1", &["--header-read-timeout-ms", "1000"]);
    let mut idle = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: shim\r\n\r\n").expect("write");
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).expect("answer");
    let _silent = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut partial = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    partial.write_all(b"GET /healthz HTTP/1.1\r\n").expect("write");
    std::thread::sleep(Duration::from_millis(200));
    let log = stop(child, Duration::from_secs(3));
    assert!(log.contains("shutting down"), "{log}");
}

fn get(port: u16, path: &str) -> String {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(conn, "GET {path} HTTP/1.1\r\nhost: shim\r\nconnection: close\r\n\r\n").expect("write");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("read");
    answer
}

fn document(policy: &str) -> String {
    format!(
        r#"{{"policies": [{{"name": "{policy}", "match": {{"path_prefix": "/"}}, "key": ["header:x-api-key"],
            "limits": [{{"type": "fixed_window", "limit": 10, "window": "1m"}}]}}]}}"#
    )
}

/// SIGHUP reads `--policy` again: the dashboard lists the new document's
/// policies, not the old ones. A document that does not parse is refused
/// with a log line, and the one loaded stays.
#[test]
fn sighup_reloads_the_policy_document() {
    let dir = sluice_harness::scratch_dir("reload").expect("scratch dir");
    let path = dir.join("policy.json");
    std::fs::write(&path, document("before")).expect("write");
    let (child, port) = serve("127.0.0.1", &["--policy", path.to_str().expect("utf-8 path")]);
    assert!(get(port, "/dashboard.json").contains(r#""name":"before""#));
    let hup = |child: &Child| {
        let sent = Command::new("kill").args(["-HUP", &child.id().to_string()]).status().expect("kill");
        assert!(sent.success());
    };

    std::fs::write(&path, document("after")).expect("write");
    hup(&child);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let page = get(port, "/dashboard.json");
        if page.contains(r#""name":"after""#) && !page.contains(r#""name":"before""#) {
            break;
        }
        assert!(Instant::now() < deadline, "not reloaded: {page}");
        std::thread::sleep(Duration::from_millis(50));
    }

    std::fs::write(&path, "{ not a policy document").expect("write");
    hup(&child);
    std::thread::sleep(Duration::from_millis(500));
    assert!(get(port, "/dashboard.json").contains(r#""name":"after""#), "the loaded document was dropped");
    let log = stop(child, Duration::from_secs(5));
    assert!(log.contains("policy document reloaded"), "{log}");
    assert!(log.contains("policy document not reloaded"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--threads N` sizes the runtime that serves requests: with 6 there are at
/// least 6 of its worker threads (the default on a 2-core machine is 2); 0 is
/// refused at start, naming the flag.
#[test]
fn threads_sizes_the_runtime_and_zero_is_refused() {
    let (child, _port) = serve("127.0.0.1", &["--threads", "6"]);
    let tasks = std::fs::read_dir(format!("/proc/{}/task", child.id())).expect("/proc");
    let runtime = tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "tokio-rt-worker")
        .count();
    stop(child, Duration::from_secs(10));
    assert!(runtime >= 6, "{runtime} runtime threads with --threads 6");

    let refused = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--redis", "redis://127.0.0.1:1", "--threads", "0"])
        .output()
        .expect("sluice serve");
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("--threads"), "{said}");
}
