//! Redis over TLS with a password, against a real `redis-server` that
//! speaks only TLS and requires AUTH: the shim decides over `rediss://`
//! with the CA given, and the password appears in no error nor log line,
//! not even when it is wrong (`sluice serve` logged `redis = ?target`, the
//! whole URL, at startup).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use sluice_harness::tls::Pki;
use sluice_harness::{free_port, Redis};
use sluice_policies::units::Millis;
use sluice_policies::wire::{Check, CheckRequest, WireLimit};
use sluice_shim::limiter::{CheckError, Limiter};
use sluice_shim::store::{Connect, Target};

const PASSWORD: &str = "pw-Zq8rT1x";

fn request() -> CheckRequest<'static> {
    let limits = vec![WireLimit::SlidingWindow { limit: 1, window_ms: Millis(60_000), approximate: false }];
    let checks = vec![Check {
        policy: "p".into(),
        key: "k".into(),
        limits,
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }];
    CheckRequest { checks: checks.into(), now_us: None, id: None, wait_ms: None, views: Default::default() }
}

fn limiter(url: String, ca: Option<Vec<u8>>) -> Limiter {
    let target = Target::Single(url);
    Limiter::connect(&Connect { target: &target, timeout: Duration::from_secs(2), ca }, false)
        .expect("limiter")
}

/// With the CA and the password, checks decide over TLS; a wrong password,
/// a missing CA or cleartext fail as store errors that do not show it.
#[tokio::test]
async fn the_shim_decides_over_tls_with_auth_and_never_shows_the_password() {
    let pki = Pki::generate().expect("certificates");
    let redis = Redis::start_tls(&pki.server.cert, &pki.server.key, PASSWORD).expect("redis with TLS");
    let ca = std::fs::read(&pki.ca).expect("ca");
    let port = redis.port;

    let good = limiter(format!("rediss://:{PASSWORD}@127.0.0.1:{port}"), Some(ca.clone()));
    let first = good.check(&request()).await.expect("check over TLS");
    let second = good.check(&request()).await.expect("check over TLS");
    assert_eq!((first.allowed, second.allowed), (true, false));

    let wrong = "pw-wrong-Kx5";
    for (url, ca) in [
        (format!("rediss://:{wrong}@127.0.0.1:{port}"), Some(ca.clone())),
        (format!("rediss://:{PASSWORD}@127.0.0.1:{port}"), None),
        (format!("redis://:{PASSWORD}@127.0.0.1:{port}"), None),
    ] {
        match limiter(url.clone(), ca).check(&request()).await {
            Err(CheckError::Store(reason)) => {
                assert!(!reason.contains(PASSWORD) && !reason.contains(wrong), "{url}: {reason}")
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}

/// `sluice serve` logs where Redis is with the password hidden, and a
/// failed check's log line does not show it either.
#[test]
fn serve_logs_never_show_the_password() {
    let pki = Pki::generate().expect("certificates");
    let redis = Redis::start_tls(&pki.server.cert, &pki.server.key, PASSWORD).expect("redis with TLS");
    let port = free_port().expect("port");
    let url = format!("rediss://:{PASSWORD}-but-wrong@127.0.0.1:{}", redis.port);
    let mut shim = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--redis", &url, "--redis-ca"])
        .arg(&pki.ca)
        .env("RUST_LOG", "debug")
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice serve");
    let body = serde_json::to_vec(&request()).expect("json");
    let mut answered = None;
    for _ in 0..100 {
        if let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::Write;
            let head = format!(
                "POST /v1/check HTTP/1.1\r\nhost: shim\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            conn.write_all(head.as_bytes()).expect("write");
            conn.write_all(&body).expect("write");
            let mut answer = String::new();
            let _ = conn.read_to_string(&mut answer);
            answered = Some(answer);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGTERM lets it flush its log.
    let pid = i32::try_from(shim.id()).expect("pid");
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let _ = shim.wait();
    let mut log = String::new();
    shim.stderr.take().expect("stderr").read_to_string(&mut log).expect("log");
    let answer = answered.expect("the shim never listened");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(!answer.contains(PASSWORD), "{answer}");
    assert!(log.contains(&format!("rediss://:***@127.0.0.1:{}", redis.port)), "{log}");
    assert!(log.contains("redis call failed"), "{log}");
    assert!(!log.contains(PASSWORD), "{log}");
}

/// Egress waiting over TLS: the wake-up subscriber connects with the same
/// CA and password, so a check held for a concurrency slot is admitted when
/// the holder releases it (without the CA it could not subscribe, and the
/// held check would fail).
#[tokio::test]
async fn a_held_check_is_woken_over_tls() {
    let pki = Pki::generate().expect("certificates");
    let redis = Redis::start_tls(&pki.server.cert, &pki.server.key, PASSWORD).expect("redis with TLS");
    let ca = std::fs::read(&pki.ca).expect("ca");
    let url = format!("rediss://:{PASSWORD}@127.0.0.1:{}", redis.port);
    let limiter = std::sync::Arc::new(limiter(url, Some(ca)));
    let limits = vec![WireLimit::Concurrency { limit: 1, lease_ms: Millis(30_000) }];
    let checks = vec![Check {
        policy: "p".into(),
        key: "k".into(),
        limits,
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    }];
    let held = |id: &str, wait_ms: Option<u64>| CheckRequest {
        checks: checks.clone().into(),
        now_us: None,
        id: Some(id.to_string().into()),
        wait_ms: wait_ms.map(Millis),
        views: Default::default(),
    };
    let first = limiter.check(&held("first", None)).await.expect("check over TLS");
    assert_eq!(first.lease.as_deref(), Some("first"));
    let waiting = {
        let (limiter, req) = (limiter.clone(), held("second", Some(5_000)));
        tokio::spawn(async move { limiter.check(&req).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let release = sluice_policies::wire::ReleaseRequest { lease: "first".into(), checks: checks.clone() };
    assert_eq!(limiter.release(&release).await.expect("release over TLS").released, 1);
    let second = waiting.await.expect("task").expect("the held check over TLS");
    assert!(second.allowed && second.lease.as_deref() == Some("second"), "{second:?}");
}
