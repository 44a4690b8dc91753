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
    let dir = sluice_harness::scratch_dir("simulate").expect("scratch dir");
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

/// Requests that came through the gRPC faces, logged as Sluice's JSON lines
/// with their domain and RLS `entries` or RLQS `bucket` id, are replayed
/// through the policies of their face only, and each policy is labelled
/// with its face; an HTTP line never reaches them.
#[test]
fn rls_and_rlqs_requests_are_replayed_through_their_faces() {
    let policy = write(
        "policy-faces.json",
        r#"{"policies": [
          {"name": "descriptors", "match": {"domain": "edge", "entries": {"client": {"present": true}}},
           "key": ["entry:client"], "limits": [{"type": "fixed_window", "limit": 3, "window": "1m"}]},
          {"name": "quota", "match": {"domain": "edge", "bucket": {"client": {"present": true}}},
           "key": ["bucket:client"], "leased": {"tokens": 2, "ttl": "5s"},
           "limits": [{"type": "fixed_window", "limit": 4, "window": "1m"}]},
          {"name": "web", "match": {"path_prefix": "/"}, "limits": [{"type": "fixed_window", "limit": 100, "window": "1m"}]}
        ]}"#,
    );
    let mut lines = String::new();
    for i in 0..10 {
        let _ = writeln!(
            lines,
            r#"{{"time_ms": {}, "path": "/a", "domain": "edge", "entries": {{"client": "c1"}}}}"#,
            T0 + i * 100
        );
        let _ = writeln!(
            lines,
            r#"{{"time_ms": {}, "path": "/a", "domain": "edge", "bucket": {{"client": "c1"}}}}"#,
            T0 + i * 100 + 1
        );
        let _ = writeln!(lines, r#"{{"time_ms": {}, "path": "/a"}}"#, T0 + i * 100 + 2);
    }
    let log = write("faces.log", &lines);
    let json = simulate(&[
        "--policy",
        policy.to_str().expect("path"),
        "--format",
        "json",
        log.to_str().expect("path"),
    ]);
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let of = |name: &str| {
        report.as_array().and_then(|r| r.iter().find(|p| p["policy"] == name)).cloned().expect(name)
    };
    let (rls, rlqs, web) = (of("descriptors"), of("quota"), of("web"));
    assert_eq!(
        (rls["face"].as_str(), rls["matched"].as_u64(), rls["admitted"].as_u64()),
        (Some("rls"), Some(10), Some(3))
    );
    assert_eq!(
        (rlqs["face"].as_str(), rlqs["matched"].as_u64(), rlqs["admitted"].as_u64()),
        (Some("rlqs"), Some(10), Some(4))
    );
    assert_eq!((web["face"].as_str(), web["matched"].as_u64()), (Some("filter"), Some(10)));
    let text = simulate(&["--policy", policy.to_str().expect("path"), log.to_str().expect("path")]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("policy quota (RLQS face): 10 matched, 4 admitted, 6 denied"), "{text}");
    assert!(text.contains("policy descriptors (RLS face): 10 matched, 3 admitted, 7 denied"), "{text}");
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

// The fixtures in `tests/fixtures/simulate/` are small logs in each shape,
// written out of start order, replayed through `shapes-policy.json`: `by-ip`
// (2 per minute per client address) and `by-key` (2 per minute per
// `x-api-key`), both enforced, so a request is charged to both or neither.

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/simulate/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs `sluice simulate` on a fixture with the shapes policy and `flags`;
/// the report as JSON, by policy name.
fn replay_fixture(log: &str, flags: &[&str]) -> serde_json::Value {
    let policy = fixture("shapes-policy.json");
    let log = fixture(log);
    let mut args = vec!["--policy", &policy, "--format", "json"];
    args.extend_from_slice(flags);
    args.push(&log);
    let out = simulate(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reports: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    reports.into_iter().map(|r| (r["policy"].as_str().unwrap_or_default().to_string(), r)).collect()
}

/// (matched, admitted, denied, missing_key) of one policy's report.
fn counts(report: &serde_json::Value) -> (u64, u64, u64, u64) {
    let n = |field: &str| report[field].as_u64().unwrap_or(u64::MAX);
    (n("matched"), n("admitted"), n("denied"), n("missing_key"))
}

fn unrecorded(report: &serde_json::Value) -> serde_json::Value {
    report["unrecorded"].clone()
}

/// The reported bug: Envoy's text format logs no client address, so a
/// policy keyed on `ip` saw 8 lines from two clients as one key (`!`), 5
/// denied, "0 missing a key". Now they are counted as not recorded, with
/// the key source, and nothing is decided or lumped.
#[test]
fn envoy_text_without_a_client_address_lumps_nobody() {
    let r = replay_fixture("envoy-text.log", &[]);
    assert_eq!(counts(&r["by-ip"]), (8, 0, 0, 0));
    assert_eq!(unrecorded(&r["by-ip"]), serde_json::json!([{"source": "ip", "requests": 8}]));
    assert_eq!(r["by-ip"]["busiest_keys"], serde_json::json!([]));
    assert_eq!(unrecorded(&r["by-key"]), serde_json::json!([{"source": "header:x-api-key", "requests": 8}]));
}

/// With `--trusted-hops 1` the client comes from `x-forwarded-for`: 4 lines
/// of one client (2 admitted, 2 denied), 3 of the other (2 and 1), and one
/// line whose request truly had no `x-forwarded-for`, in the shared bucket.
#[test]
fn envoy_text_with_trusted_hops_reads_the_forwarded_client() {
    let r = replay_fixture("envoy-text.log", &["--trusted-hops", "1"]);
    assert_eq!(counts(&r["by-ip"]), (8, 5, 3, 0));
    assert_eq!(unrecorded(&r["by-ip"]), serde_json::json!([]));
    assert_eq!(
        r["by-ip"]["busiest_keys"],
        serde_json::json!([["203.0.113.9", 4], ["198.51.100.7", 3], ["!", 1]])
    );
}

/// The text report shows the unrecorded key with the shape's hint, keys as
/// written, and the shared bucket by name.
#[test]
fn the_text_report_says_what_the_log_lacks_and_shows_keys_as_written() {
    let policy = fixture("shapes-policy.json");
    let log = fixture("envoy-text.log");
    let out = simulate(&["--policy", &policy, &log]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("lines read: 8 Envoy text\n"), "{text}");
    assert!(text.contains("policy by-ip: 8 matched, 0 admitted, 0 denied, 0 missing a key\n  8 not decided: the log does not record their key source ip\n    Envoy's text format logs no client address; pass --trusted-hops N to read the client from x-forwarded-for, or log %DOWNSTREAM_REMOTE_ADDRESS% in a JSON access log\n"), "{text}");
    let out = simulate(&["--policy", &policy, "--trusted-hops", "1", &log]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("  busiest keys: 203.0.113.9 (4), 198.51.100.7 (3), (shared: missing key) (1)"),
        "{text}"
    );
    let out = simulate(&[
        "--policy",
        &policy,
        "--field",
        "header:x-api-key=x-api-key",
        &fixture("envoy-gateway.jsonl"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("  busiest keys: team a (3), (shared: missing key) (1)"), "{text}");
}

/// Istio's default JSON access log, as it comes: the client is its
/// `downstream_remote_address` (ports differ, the address is one client);
/// it logs no `x-api-key`.
#[test]
fn istio_json_is_read_as_it_comes() {
    let r = replay_fixture("istio.jsonl", &[]);
    assert_eq!(counts(&r["by-ip"]), (5, 4, 1, 0));
    assert_eq!(r["by-ip"]["busiest_keys"], serde_json::json!([["10.0.0.7", 3], ["10.0.0.8", 2]]));
    assert_eq!(unrecorded(&r["by-key"]), serde_json::json!([{"source": "header:x-api-key", "requests": 5}]));
}

/// Envoy Gateway's default JSON access log, with an `x-api-key` field the
/// operator added: unmapped it is ignored (the key is not recorded); mapped
/// with `--field`, a `null` is a request without the header (shared bucket).
/// The fourth request is over both limits and denied by both.
#[test]
fn envoy_gateway_json_is_read_and_extended_with_field() {
    let r = replay_fixture("envoy-gateway.jsonl", &[]);
    assert_eq!(counts(&r["by-ip"]), (4, 3, 1, 0));
    assert_eq!(unrecorded(&r["by-key"]), serde_json::json!([{"source": "header:x-api-key", "requests": 4}]));
    let r = replay_fixture("envoy-gateway.jsonl", &["--field", "header:x-api-key=x-api-key"]);
    assert_eq!(counts(&r["by-ip"]), (4, 3, 1, 0));
    assert_eq!(counts(&r["by-key"]), (4, 3, 1, 0));
    assert_eq!(r["by-key"]["busiest_keys"], serde_json::json!([["team%20a", 3], ["!", 1]]));
}

/// Any JSON log through `--field` mappings; unmapped fields (an array
/// even) are ignored. The third request is denied by `by-ip` alone, so
/// `by-key` neither admits nor denies it.
#[test]
fn any_json_log_is_read_through_field_mappings() {
    let fields = [
        "--field",
        "time=ts",
        "--field",
        "method=verb",
        "--field",
        "path=uri",
        "--field",
        "source=client",
        "--field",
        "header:x-api-key=api_key",
        "--field",
        "duration_ms=ms",
    ];
    let r = replay_fixture("mapped.jsonl", &fields);
    assert_eq!(counts(&r["by-ip"]), (4, 2, 2, 0));
    assert_eq!(counts(&r["by-key"]), (4, 2, 1, 0));
    let policy = fixture("shapes-policy.json");
    let out = simulate(&["--policy", &policy, "--field", "when=ts", &fixture("mapped.jsonl")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--field \"when=ts\": unknown target \"when\""), "{err}");
}

/// A line that starts before one already replayed by more than the
/// reorder window is counted and skipped, never replayed out of order; a
/// wider window takes it.
#[test]
fn a_line_later_than_the_reorder_window_is_counted_not_replayed() {
    let policy = fixture("shapes-policy.json");
    let log = fixture("late.jsonl");
    let out = simulate(&["--policy", &policy, &log]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("3 requests replayed\n"), "{text}");
    assert!(text.contains("1 lines skipped as late: each started before a line already replayed, by more than --reorder 1m\n"), "{text}");
    assert!(text.contains("policy by-ip: 3 matched, 3 admitted, 0 denied"), "{text}");
    let r = replay_fixture("late.jsonl", &["--reorder", "2m"]);
    assert_eq!(counts(&r["by-ip"]), (4, 3, 1, 0));
}

/// Bad lines are counted and skipped, each named on stderr with its line
/// number; the report stands for the lines read and the exit status is 2.
/// A log with no readable line is an error (exit 1).
#[test]
fn bad_lines_are_counted_skipped_and_named() {
    let policy = fixture("shapes-policy.json");
    let log = fixture("bad.log");
    let out = simulate(&["--policy", &policy, "--trusted-hops", "1", &log]);
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("2 requests replayed\nlines read: 2 Envoy text\n3 bad lines skipped\n"),
        "{text}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.log: line 2: expected [START_TIME] or a JSON object\n"), "{err}");
    assert!(err.contains("bad.log: line 3: unknown field `colour`"), "{err}");
    assert!(err.contains("bad.log: line 4: EOF while parsing an object"), "{err}");
    assert!(err.contains("bad.log: 3 bad lines skipped\n"), "{err}");
    let garbage = write("garbage.log", "nothing\nto see\n");
    let out = simulate(&["--policy", &policy, garbage.to_str().expect("path")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no line could be read (2 bad lines)"));
}

/// Token usage replayed from a log field: each request of a token budget is
/// charged its logged count (Sluice's `tokens`, or any JSON field through
/// `--field tokens=FIELD`) until the budget has no room for the next; a
/// line without one is charged the reservation of a request without a body,
/// and said so.
#[test]
fn token_usage_is_replayed_from_a_log_field() {
    let policy = write(
        "llm-policy.json",
        r#"{"policies": [{"name": "team", "key": ["header:x-team"],
            "llm": {"api": "openai_chat", "default_max_tokens": 500},
            "limits": [{"type": "points", "capacity": 10000, "refill": "365d", "cost": "llm_tokens"}]}]}"#,
    );
    // 12 requests of 1,000 tokens a second apart: 10 fit the budget.
    let mut sluice_lines = String::new();
    let mut mapped = String::new();
    for i in 0..12 {
        let at = T0 + i * 1000;
        let _ = writeln!(
            sluice_lines,
            r#"{{"time_ms": {at}, "method": "POST", "path": "/v1/chat/completions", "headers": {{"x-team": "blue"}}, "tokens": 1000}}"#
        );
        let _ = writeln!(
            mapped,
            r#"{{"ts": {at}, "uri": "/v1/chat/completions", "team": "blue", "usage": {}}}"#,
            if i == 11 { "null".to_string() } else { "1000".to_string() }
        );
    }
    for (log, flags) in [
        (write("tokens.jsonl", &sluice_lines), vec![]),
        (
            write("tokens-mapped.jsonl", &mapped),
            vec![
                "--field",
                "time_ms=ts",
                "--field",
                "path=uri",
                "--field",
                "header:x-team=team",
                "--field",
                "tokens=usage",
            ],
        ),
    ] {
        let mut args = vec!["--policy", policy.to_str().expect("path"), "--format", "json"];
        args.extend(flags.iter().copied());
        args.push(log.to_str().expect("path"));
        let out = simulate(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let team = &report[0];
        assert_eq!((team["admitted"].as_u64(), team["denied"].as_u64()), (Some(10), Some(2)), "{team:#}");
        assert_eq!(team["tokens"]["charged"], 10_000);
    }
    // The mapped log's last line logs no count: charged 500, said in the text.
    let log = write("tokens-mapped-text.jsonl", &mapped);
    let out = simulate(&[
        "--policy",
        policy.to_str().expect("path"),
        "--field",
        "time_ms=ts",
        "--field",
        "path=uri",
        "--field",
        "header:x-team=team",
        "--field",
        "tokens=usage",
        log.to_str().expect("path"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("LLM tokens charged to admitted requests: 10000"), "{text}");
    assert!(text.contains("1 requests without a logged token count"), "{text}");
}
