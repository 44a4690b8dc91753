//! `sluice import`: envoyproxy/ratelimit configurations shaped like that
//! project's documented examples (`fixtures/import/`) become policy
//! documents that parse, with the expected limits, matches and keys; what
//! cannot be carried over is printed on stderr with why.

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_policies::condition::ValueCondition;
use sluice_policies::request::SimpleRequest;
use sluice_policies::wire::WireLimit;
use sluice_policies::{Document, Limit};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/import").join(name)
}

/// The document printed (parsed) and the stderr lines.
fn import(name: &str) -> (Document, String) {
    let out =
        Command::new(env!("CARGO_BIN_EXE_sluice")).arg("import").arg(fixture(name)).output().expect("sluice");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let doc = sluice_policies::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    (doc, stderr)
}

/// `(limit, window_ms)` of a policy's one fixed window.
fn window(doc: &Document, name: &str) -> (u32, u64) {
    let policy =
        doc.policies.iter().find(|p| p.name.as_str() == name).unwrap_or_else(|| panic!("no policy {name}"));
    match WireLimit::with_cost(&policy.limits[0], 1) {
        WireLimit::FixedWindow { limit, window_ms } => (limit, window_ms.get()),
        other => panic!("{name}: {other:?}"),
    }
}

fn descriptor(domain: &str, entries: &[(&str, &str)]) -> SimpleRequest {
    entries.iter().fold(SimpleRequest::default().domain(domain), |r, (k, v)| r.entry(k, v))
}

/// The policies that apply to a descriptor, with their keys.
fn applied(doc: &Document, req: &SimpleRequest) -> Vec<(String, String)> {
    let eval = doc.evaluate(req).expect("no missing key");
    eval.iter().map(|a| (a.policy.name.as_str().to_string(), a.key.clone())).collect()
}

#[test]
fn per_value_limits_become_one_policy_each() {
    let (doc, stderr) = import("mongo_cps.yaml");
    assert_eq!(stderr, "");
    assert_eq!(doc.policies.len(), 2);
    assert_eq!(window(&doc, "mongo_cps_database_users"), (500, 1_000));
    assert_eq!(window(&doc, "mongo_cps_database_default"), (500, 1_000));
    let users = descriptor("mongo_cps", &[("database", "users")]);
    assert_eq!(applied(&doc, &users), [("mongo_cps_database_users".to_string(), String::new())]);
    assert!(applied(&doc, &descriptor("other", &[("database", "users")])).is_empty());
}

#[test]
fn nested_descriptors_wildcards_shadow_and_prefixes() {
    let (doc, stderr) = import("messaging.yaml");
    assert_eq!(stderr, "");
    assert_eq!(window(&doc, "messaging_message_type_marketing_to_number"), (5, 86_400_000));
    assert_eq!(window(&doc, "messaging_to_number"), (100, 86_400_000));
    assert_eq!(window(&doc, "messaging_user"), (10, 60_000));
    assert_eq!(window(&doc, "messaging_client_team-_"), (1000, 3_600_000));
    let user = doc.policies.iter().find(|p| p.name.as_str() == "messaging_user").expect("user");
    assert!(user.shadow);
    let client = doc.policies.iter().find(|p| p.name.as_str() == "messaging_client_team-_").expect("client");
    assert_eq!(client.matcher.entries.get("client"), Some(&ValueCondition::Prefix("team-".into())));
    // The nested leaf, keyed by the number.
    let marketing = descriptor("messaging", &[("message_type", "marketing"), ("to_number", "+1 555")]);
    assert_eq!(
        applied(&doc, &marketing),
        [("messaging_message_type_marketing_to_number".to_string(), "%2B1%20555".to_string())]
    );
    let any = descriptor("messaging", &[("to_number", "+1 555")]);
    assert_eq!(applied(&doc, &any), [("messaging_to_number".to_string(), "%2B1%20555".to_string())]);
}

#[test]
fn what_cannot_be_carried_over_is_named_with_why() {
    let (doc, stderr) = import("edge_proxy.yaml");
    let per_ip = doc.policies.iter().find(|p| p.name.as_str() == "per-ip").expect("per-ip");
    assert_eq!(per_ip.key.iter().map(ToString::to_string).collect::<Vec<_>>(), ["entry:remote_address"]);
    assert_eq!(window(&doc, "per-ip"), (10, 1_000));
    let internal = doc
        .policies
        .iter()
        .find(|p| p.name.as_str() == "edge_proxy_per_ip_remote_address_50_0_0_5")
        .expect("unlimited");
    assert!(internal.unlimited && internal.limits.is_empty());
    // The parent level's limit does not reach its child's longer descriptors.
    assert_eq!(window(&doc, "edge_proxy_per_ip_key1_value1"), (20, 60_000));
    assert_eq!(window(&doc, "specific"), (2, 1_000));
    let child = descriptor("edge_proxy_per_ip", &[("key1", "value1"), ("subkey1", "x")]);
    assert_eq!(applied(&doc, &child), [("specific".to_string(), "x".to_string())]);
    let parent = descriptor("edge_proxy_per_ip", &[("key1", "value1")]);
    assert_eq!(applied(&doc, &parent), [("edge_proxy_per_ip_key1_value1".to_string(), String::new())]);
    assert!(!doc.policies.iter().any(|p| p.name.as_str().contains("bay")), "a month is not an exact window");
    for why in [
        r#"replaces ["per-ip"] not carried over: every Sluice policy that matches a descriptor applies"#,
        "detailed_metric not carried over",
        r#"unit "month" not carried over"#,
        "descriptors[3].value_to_metric: not carried over: Sluice does not know this field",
    ] {
        assert!(stderr.contains(why), "{why:?} missing from:\n{stderr}");
    }
    assert!(doc.policies.iter().all(|p| p.limits.iter().all(|l| matches!(l, Limit::FixedWindow { .. }))));
}

#[test]
fn a_file_that_is_not_a_configuration_is_refused() {
    let dir = sluice_harness::scratch_dir("import").expect("scratch dir");
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "descriptors: [1, 2]\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice")).arg("import").arg(&bad).output().expect("sluice");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an envoyproxy/ratelimit configuration"));
}
