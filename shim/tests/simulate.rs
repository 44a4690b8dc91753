//! `sluice simulate`: a generated access log whose answer is known, replayed
//! through a policy by the real binary, as text and as JSON.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output};

const POLICY: &str = r#"{"policies": [
  {"name": "partner-api", "match": {"path_prefix": "/v42/"}, "key": ["header:x-account"],
   "limits": [{"type": "sliding_window", "limit": 25, "window": "5s"},
              {"type": "sliding_window", "limit": 300, "window": "1m"}]},
  {"name": "jobs", "match": {"path_prefix": "/jobs"},
   "limits": [{"type": "concurrency", "limit": 2, "lease": "30s"}]}
]}"#;

/// 2026-11-23T10:00:00Z in milliseconds.
const T0: u64 = 1_795_428_000_000;

fn write(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-simulate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writing");
    path
}

/// acme calls every 100 ms for 60 s (600 calls) and zeta 10 times, as JSON
/// lines; a job runner sends 30 jobs of 1 s, one every 400 ms, in Envoy's
/// default format (no account header: one shared bucket).
fn log() -> String {
    let mut log = String::new();
    for i in 0..600 {
        let _ = writeln!(
            log,
            r#"{{"time_ms": {}, "method": "GET", "path": "/v42/orders", "headers": {{"x-account": "acme"}}}}"#,
            T0 + i * 100
        );
    }
    for i in 0..10 {
        let _ = writeln!(
            log,
            r#"{{"time_ms": {}, "path": "/v42/x", "headers": {{"x-account": "zeta"}}}}"#,
            T0 + i * 1000
        );
    }
    for i in 0..30u64 {
        let ms = 400 * i;
        let _ = writeln!(
            log,
            r#"[2026-11-23T10:00:{:02}.{:03}Z] "POST /jobs HTTP/1.1" 200 - 10 2 1000 998 "10.0.0.9" "runner" "id-{i}" "erp" "10.1.0.1:80""#,
            ms / 1000,
            ms % 1000
        );
    }
    log
}

fn simulate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice")).arg("simulate").args(args).output().expect("running sluice")
}

/// The dual window admits 25 per 5 s: 12 blocks of 25 in the minute, 300,
/// exactly what the 1-minute window allows; zeta is untouched. Two jobs run
/// at once, so of every three jobs 400 ms apart, 1 s long, two pass.
#[test]
fn a_known_log_gives_the_known_answer_as_json() {
    let policy = write("policy.json", POLICY);
    let log = write("access.log", &log());
    let out = simulate(&[
        "--policy",
        policy.to_str().expect("path"),
        "--format",
        "json",
        log.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let partner = &report[0];
    assert_eq!(partner["policy"], "partner-api");
    assert_eq!(partner["matched"], 610);
    assert_eq!(partner["admitted"], 310);
    assert_eq!(partner["denied"], 300);
    assert_eq!(partner["limits"][0]["peak"], 25);
    assert_eq!(partner["limits"][0]["denied"], 300);
    assert_eq!(partner["limits"][1]["peak"], 300);
    // A limit's denials count every refusal it would have made alone: the
    // minute is full from 57.4 s, so the last 25 calls are refused by both.
    assert_eq!(partner["limits"][1]["denied"], 25);
    assert_eq!(partner["busiest_keys"][0], serde_json::json!(["acme", 600]));
    assert_eq!(partner["busiest_keys"][1], serde_json::json!(["zeta", 10]));
    let jobs = &report[1];
    assert_eq!(
        (jobs["matched"].as_u64(), jobs["admitted"].as_u64(), jobs["denied"].as_u64()),
        (Some(30), Some(20), Some(10))
    );
    assert_eq!(jobs["limits"][0]["peak"], 2);
}

/// The text report says the same for people.
#[test]
fn the_text_report_names_each_policy_and_limit() {
    let policy = write("policy-text.json", POLICY);
    let log = write("access-text.log", &log());
    let out = simulate(&["--policy", policy.to_str().expect("path"), log.to_str().expect("path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("640 requests replayed\n"), "{text}");
    assert!(
        text.contains("policy partner-api: 610 matched, 310 admitted, 300 denied, 0 missing a key"),
        "{text}"
    );
    assert!(text.contains("  sliding_window 25 per 5000ms: peak 25 of 25, denied 300"), "{text}");
    assert!(text.contains("  busiest keys: acme (600), zeta (10)"), "{text}");
    assert!(text.contains("policy jobs: 30 matched, 20 admitted, 10 denied"), "{text}");
}

/// A line that is neither format is an error naming the file and the line.
#[test]
fn a_bad_line_is_named() {
    let policy = write("policy-bad.json", POLICY);
    let log = write("bad.log", "{\"time_ms\": 1, \"path\": \"/\"}\nnot a log line\n");
    let out = simulate(&["--policy", policy.to_str().expect("path"), log.to_str().expect("path")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.log: line 2: expected [START_TIME] or a JSON object"), "{err}");
}
