//! Parsing policy documents: the examples are accepted, and each kind of
//! mistake is refused with a message that names the path, reason and position.

use sluice_policies::{parse, FailureMode, Limit};

fn error_of(text: &str) -> String {
    match parse(text) {
        Ok(doc) => panic!("expected an error, parsed {doc:?}"),
        Err(err) => err.to_string(),
    }
}

/// The demo document parses into the dual window of scenario S0.
#[test]
fn demo_example_parses() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/demo.json"))
        .expect("examples/demo.json is readable");
    let doc = parse(&text).expect("demo.json is valid");
    assert_eq!(doc.shim.cluster, "sluice_shim");
    assert_eq!(doc.shim.timeout_ms.get(), 50);
    assert_eq!(doc.failure_mode, FailureMode::Allow);
    let policy = &doc.policies[0];
    assert_eq!(policy.name.as_str(), "partner-api");
    let windows: Vec<(u32, u64)> = policy
        .limits
        .iter()
        .map(|Limit::SlidingWindow { limit, window }| (limit.get(), window.as_millis()))
        .collect();
    assert_eq!(windows, [(25, 5_000), (300, 60_000)]);
}

/// Omitted settings take their documented defaults.
#[test]
fn defaults_apply() {
    let doc = parse(r#"{"policies": [{"name": "p", "limits": [{"type": "sliding_window", "limit": 1, "window": "1s"}]}]}"#)
        .expect("minimal document is valid");
    assert_eq!(doc.shim.cluster, "sluice_shim");
    assert_eq!(doc.shim.timeout_ms.get(), 100);
    assert_eq!(doc.failure_mode, FailureMode::Allow);
    assert!(doc.policies[0].key.is_empty());
}

const LIMIT: &str = r#"{"type": "sliding_window", "limit": 25, "window": "5s"}"#;

fn with_policy(policy: &str) -> String {
    format!("{{\"policies\": [{policy}]}}")
}

#[test]
fn bad_duration_names_path_and_position() {
    let text = "{\n  \"policies\": [\n    {\"name\": \"a\",\n     \"limits\": [{\"type\": \"sliding_window\", \"limit\": 25, \"window\": \"5 sec\"}]}\n  ]\n}";
    assert_eq!(
        error_of(text),
        r#"policies[0].limits[0].window: invalid duration "5 sec" (expected e.g. "5s", "250ms"; from 1ms to 365d) at 4:74"#
    );
}

#[test]
fn unknown_field_is_refused() {
    let text = with_policy(&format!(r#"{{"name": "a", "limits": [{LIMIT}], "burst": 3}}"#));
    assert_eq!(
        error_of(&text),
        "policies[0].burst: unknown field `burst`, expected one of `name`, `match`, `key`, `limits` at 1:104"
    );
}

#[test]
fn zero_limit_is_refused() {
    let text =
        with_policy(r#"{"name": "a", "limits": [{"type": "sliding_window", "limit": 0, "window": "1s"}]}"#);
    assert_eq!(
        error_of(&text),
        "policies[0].limits[0].limit: invalid count 0 (expected 1 to 1000000000) at 1:76"
    );
}

#[test]
fn unknown_limit_type_is_refused() {
    let text = with_policy(r#"{"name": "a", "limits": [{"type": "sliding", "limit": 1, "window": "1s"}]}"#);
    assert_eq!(
        error_of(&text),
        "policies[0].limits[0].type: unknown variant `sliding`, expected `sliding_window` at 1:57"
    );
}

#[test]
fn missing_window_is_refused() {
    let text = with_policy(r#"{"name": "a", "limits": [{"type": "sliding_window", "limit": 1}]}"#);
    assert_eq!(error_of(&text), "policies[0].limits[0]: missing field `window` at 1:78");
}

#[test]
fn duplicate_names_are_refused() {
    let p = format!(r#"{{"name": "a", "limits": [{LIMIT}]}}"#);
    let text = with_policy(&format!("{p}, {p}"));
    assert_eq!(error_of(&text), r#"policies: duplicate policy name "a" at policies[1] at 1:181"#);
}

#[test]
fn bad_name_is_refused() {
    let text = with_policy(&format!(r#"{{"name": "a b", "limits": [{LIMIT}]}}"#));
    assert_eq!(
        error_of(&text),
        r#"policies[0].name: invalid policy name "a b" (expected 1 to 64 of A-Z a-z 0-9 _ -) at 1:28"#
    );
}

#[test]
fn empty_limits_are_refused() {
    let text = with_policy(r#"{"name": "a", "limits": []}"#);
    assert_eq!(error_of(&text), "policies[0].limits: a policy needs at least one limit at 1:41");
}

#[test]
fn bad_key_source_is_refused() {
    let text = with_policy(&format!(r#"{{"name": "a", "key": ["cookie:x"], "limits": [{LIMIT}]}}"#));
    assert_eq!(
        error_of(&text),
        r#"policies[0].key[0]: invalid key source "cookie:x" (expected "header:NAME") at 1:47"#
    );
}

#[test]
fn bad_failure_mode_is_refused() {
    let text = r#"{"failure_mode": "open", "policies": []}"#;
    assert_eq!(error_of(text), "failure_mode: unknown variant `open`, expected `allow` or `deny` at 1:23");
}

#[test]
fn not_json_is_refused() {
    assert_eq!(error_of("{\"policies\": [}"), "policies[0]: expected value at 1:15");
    assert_eq!(error_of("{\"policies\": []} x"), "(document): trailing characters at 1:18");
    assert_eq!(error_of(""), "(document): EOF while parsing a value at 1:0");
}
