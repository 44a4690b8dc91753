//! `sluice import`: envoyproxy/ratelimit configurations (the examples of its
//! README, `fixtures/import/readme/`) and Limitador limits files
//! (`fixtures/import/limitador/`) become policy documents that pick, for
//! every descriptor, the limit the peer picks, with its window and key; what
//! cannot be carried exactly is named line by line and stops the command
//! unless `--accept-losses`; a configuration the peer would refuse is
//! refused. (The decisions themselves, through the face and through Envoy:
//! `rls.rs`, `tests/e2e/tests/envoy_rls.rs`.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sluice_policies::descriptor_limit::DescriptorLimitMode;
use sluice_policies::document::{Charge, Statuses};
use sluice_policies::request::SimpleRequest;
use sluice_policies::wire::WireLimit;
use sluice_policies::{Document, HeaderFormat, HeadersMode};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/import").join(name)
}

fn run(args: &[&str], file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice")).arg("import").args(args).arg(file).output().expect("sluice")
}

/// The document printed (parsed) and the stderr lines; `accept` passes
/// `--accept-losses`.
fn import_with(name: &str, accept: bool) -> (Document, String) {
    let out = run(if accept { &["--accept-losses"] } else { &[] }, &fixture(name));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{name}: {stderr}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let doc = sluice_policies::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    (doc, stderr)
}

/// A conversion that carries everything exactly: no loss printed.
fn import(name: &str) -> Document {
    let (doc, stderr) = import_with(name, false);
    assert_eq!(stderr, "", "{name}");
    doc
}

fn descriptor(domain: &str, entries: &[(&str, &str)]) -> SimpleRequest {
    entries.iter().fold(SimpleRequest::default().domain(domain).index(0), |r, (k, v)| r.entry(k, v))
}

/// What the document makes of one descriptor, as the peer states a limit:
/// `"N/WINDOW_MS name key"`, `"blocked/WINDOW_MS name"`, `"unlimited"`, or
/// nothing; one entry per policy that applies.
fn limits(doc: &Document, req: &SimpleRequest) -> Vec<String> {
    let eval = doc.evaluate(req).expect("no missing key");
    eval.iter()
        .map(|a| {
            let p = a.policy;
            let name = p.answer_name();
            if p.unlimited {
                return "unlimited".to_string();
            }
            if let Some(w) = p.blocked {
                return format!("blocked/{} {name:?}", w.as_millis());
            }
            if p.limits.is_empty() {
                return "nothing".to_string();
            }
            let shadow = if p.shadow { " shadow" } else { "" };
            match WireLimit::with_cost(&p.limits[0], 1) {
                WireLimit::FixedWindow { limit, window_ms, cost: 1 } => {
                    format!("{limit}/{} {name:?} key={:?}{shadow}", window_ms.get(), a.key)
                }
                WireLimit::FirstHitWindow { limit, window_ms, cost: 1 } => {
                    format!("{limit}/{} first hit {name:?} key={:?}{shadow}", window_ms.get(), a.key)
                }
                other => panic!("{other:?}"),
            }
        })
        .collect()
}

fn one(doc: &Document, domain: &str, entries: &[(&str, &str)]) -> Vec<String> {
    limits(doc, &descriptor(domain, entries))
}

const S: u64 = 1_000;
const MIN: u64 = 60_000;
const H: u64 = 3_600_000;
const DAY: u64 = 86_400_000;

#[test]
fn imported_documents_take_the_peers_charging_and_headers() {
    let doc = import("readme/example1.yaml");
    assert_eq!(doc.charge, Charge::EveryHit);
    assert_eq!(doc.headers, HeadersMode::Off);
    assert_eq!(doc.descriptor_limit, DescriptorLimitMode::Honour, "Envoy's override counts, as in the peer");
    assert_eq!(doc.statuses, Statuses::Each, "envoyproxy/ratelimit answers a status per descriptor");
}

#[test]
fn readme_example_1_values_each_their_limit() {
    let doc = import("readme/example1.yaml");
    assert_eq!(one(&doc, "mongo_cps", &[("database", "users")]), [format!("500/{S} \"\" key=\"\"")]);
    assert_eq!(one(&doc, "mongo_cps", &[("database", "default")]), [format!("500/{S} \"\" key=\"\"")]);
    assert!(one(&doc, "mongo_cps", &[("database", "other")]).is_empty());
    assert!(one(&doc, "other", &[("database", "users")]).is_empty());
}

#[test]
fn readme_example_2_nested_and_bare_per_number() {
    let doc = import("readme/example2.yaml");
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    assert_eq!(one(&doc, "messaging", &marketing), [format!("5/{DAY} \"\" key=\"2061111111\"")]);
    assert_eq!(
        one(&doc, "messaging", &[("to_number", "2061111111")]),
        [format!("100/{DAY} \"\" key=\"2061111111\"")]
    );
    // The placeholder level has no limit of its own.
    assert!(one(&doc, "messaging", &[("message_type", "marketing")]).is_empty());
}

#[test]
fn readme_example_3_the_specific_value_wins_and_a_blocked_value_stays_blocked() {
    let doc = import("readme/example3.yaml");
    assert_eq!(
        one(&doc, "edge_proxy_per_ip", &[("remote_address", "50.0.0.1")]),
        [format!("10/{S} \"\" key=\"50.0.0.1\"")]
    );
    assert_eq!(
        one(&doc, "edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]),
        [format!("blocked/{S} \"\"")]
    );
}

#[test]
fn readme_example_4_depth_must_match() {
    let shallow = import("readme/example4a.yaml");
    let two = [("key", "value"), ("subkey", "subvalue")];
    assert!(one(&shallow, "example4", &two).is_empty());
    assert_eq!(one(&shallow, "example4", &[("key", "value")]), [format!("300/{S} \"\" key=\"\"")]);
    let deep = import("readme/example4b.yaml");
    assert_eq!(one(&deep, "example4", &two), [format!("300/{S} \"\" key=\"subvalue\"")]);
}

#[test]
fn readme_example_5_unlimited() {
    let doc = import("readme/example5.yaml");
    assert_eq!(one(&doc, "internal", &[("ldap", "x")]), ["unlimited"]);
    assert_eq!(one(&doc, "internal", &[("azure", "x")]), [format!("100/{MIN} \"\" key=\"x\"")]);
}

#[test]
fn readme_example_6_shadow_for_one_value() {
    let doc = import("readme/example6.yaml");
    let a = [("service", "auth-service"), ("user", "user-a")];
    let b = [("service", "auth-service"), ("user", "user-b")];
    assert_eq!(one(&doc, "example6", &a), [format!("10/{S} \"\" key=\"auth-service\" shadow")]);
    assert_eq!(one(&doc, "example6", &b), [format!("20/{S} \"\" key=\"auth-service\"")]);
}

#[test]
fn readme_example_7_replaces_is_carried_by_name() {
    let doc = import("readme/example7.yaml");
    let first = [("key_1", "value_1"), ("user", "bkthomps")];
    let second = [("key_2", "value_2"), ("user", "bkthomps")];
    assert_eq!(one(&doc, "example7", &first), [format!("5/{S} \"specific_limit\" key=\"\"")]);
    assert_eq!(one(&doc, "example7", &second), [format!("10/{S} \"\" key=\"\"")]);
    let replacing = doc.policies.iter().find(|p| !p.replaces.is_empty()).expect("replaces");
    assert_eq!(replacing.replaces, ["specific_limit"]);
}

/// The `descriptor` label of `entries`' decisions by the policy that
/// applies (`descriptor_metric`), as envoyproxy/ratelimit names its stats.
fn label(doc: &Document, domain: &str, entries: &[(&str, &str)]) -> Option<String> {
    let req = descriptor(domain, entries);
    let eval = doc.evaluate(&req).expect("no missing key");
    let applied = eval.first().expect("a policy applies");
    sluice_policies::descriptor_metric::label(applied.policy, &req)
}

/// README example 8: `detailed_metric` names the stats of the bare key's
/// rule after each value; the value's own rule keeps its name.
#[test]
fn readme_example_8_detailed_metric_labels_each_value() {
    let doc = import("readme/example8.yaml");
    assert_eq!(one(&doc, "example8", &[("key1", "other")]), [format!("10/{MIN} \"\" key=\"other\"")]);
    assert_eq!(one(&doc, "example8", &[("key1", "value1")]), [format!("20/{MIN} \"\" key=\"\"")]);
    assert_eq!(
        label(&doc, "example8", &[("key1", "unspecified_value")]).as_deref(),
        Some("example8.key1_unspecified_value")
    );
    assert_eq!(
        label(&doc, "example8", &[("key1", "unspecified_value2")]).as_deref(),
        Some("example8.key1_unspecified_value2")
    );
    assert_eq!(
        label(&doc, "example8", &[("key1", "value1")]),
        None,
        "named by its path: example8.key1_value1"
    );
}

#[test]
fn readme_example_9_wildcards_anywhere() {
    let doc = import("readme/example9.yaml");
    assert_eq!(one(&doc, "example9", &[("key1", "valueXYZ")]), [format!("20/{MIN} \"\" key=\"valueXYZ\"")]);
    assert!(one(&doc, "example9", &[("key1", "valu")]).is_empty());
    assert_eq!(
        one(&doc, "example9", &[("path", "/api/user-id/action")]),
        [format!("20/{MIN} \"\" key=\"%2Fapi%2Fuser-id%2Faction\"")]
    );
    assert!(one(&doc, "example9", &[("path", "/api/123/other")]).is_empty());
    assert_eq!(one(&doc, "example9", &[("route", "/api/v1/resource/123/action")]).len(), 1);
    assert!(one(&doc, "example9", &[("route", "/api/v1/resource/123/other")]).is_empty());
}

/// README example 10: `value_to_metric` puts the values of its levels
/// into the stats' name, a wildcard's whole value included; the level
/// without it shows its key alone.
#[test]
fn readme_example_10_value_to_metric_labels_the_values_of_its_levels() {
    for (name, domain, entries, want, shown) in [
        (
            "readme/example10.yaml",
            "example10",
            [("route", "api"), ("http_method", "GET"), ("subject_id", "123")],
            60,
            "example10.route_api.http_method_GET.subject_id",
        ),
        (
            "readme/example10_wildcard.yaml",
            "example10_wildcard",
            [("user", "alice"), ("action", "readfile"), ("resource", "documents")],
            100,
            "example10_wildcard.user_alice.action_readfile.resource",
        ),
    ] {
        let doc = import(name);
        let got = one(&doc, domain, &entries);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].starts_with(&format!("{want}/{MIN} ")), "{got:?}");
        assert_eq!(label(&doc, domain, &entries).as_deref(), Some(shown));
    }
}

#[test]
fn readme_example_11_share_threshold_shares_one_counter() {
    let doc = import("readme/example11.yaml");
    // Shared: one key for every matching value.
    assert_eq!(one(&doc, "example11", &[("files", "files/a.pdf")]), [format!("10/{H} \"\" key=\"\"")]);
    assert_eq!(one(&doc, "example11", &[("files", "files/b.csv")]), [format!("10/{H} \"\" key=\"\"")]);
    // Isolated: a key per value.
    assert_eq!(
        one(&doc, "example11", &[("files_no_share", "files_no_share/a.pdf")]),
        [format!("10/{H} \"\" key=\"files_no_share%2Fa.pdf\"")]
    );
    // `value_to_metric` on a shared wildcard: its stats show the pattern,
    // as without the flag, so no label of its own.
    let doc = import("readme/example11_metrics.yaml");
    let entries = [("route", "api/v1"), ("method", "GET")];
    assert_eq!(one(&doc, "example11_metrics", &entries), [format!("60/{MIN} \"\" key=\"GET\"")]);
    assert_eq!(label(&doc, "example11_metrics", &entries), None);
}

#[test]
fn a_mixed_configuration_is_carried_exactly() {
    let doc = import("mixed.yaml");
    assert_eq!(one(&doc, "edge", &[("plan", "free")]), [format!("7/{MIN} \"plan\" key=\"free\"")]);
    assert_eq!(one(&doc, "edge", &[("plan", "pro")]), [format!("12/{MIN} \"pro\" key=\"\"")]);
    assert_eq!(one(&doc, "edge", &[("plan", "internal")]), ["unlimited"]);
    assert_eq!(one(&doc, "edge", &[("client_ip", "10.0.0.66")]), [format!("blocked/{MIN} \"blocked\"")]);
    assert_eq!(one(&doc, "edge", &[("tenant", "t")]), [format!("4/{} \"\" key=\"t\"", 30 * DAY)]);
    assert_eq!(one(&doc, "edge", &[("org", "o")]), [format!("3/{} \"\" key=\"o\"", 365 * DAY)]);
    assert_eq!(one(&doc, "edge", &[("path", "/api/7/action")]).len(), 1);
    assert_eq!(one(&doc, "edge", &[("trial", "x")]), [format!("1/{MIN} \"trial\" key=\"x\" shadow")]);
}

#[test]
fn a_leaf_without_rate_limit_stops_the_walk() {
    let dir = sluice_harness::scratch_dir("import-leaf").expect("scratch dir");
    let file = dir.join("leaf.yaml");
    std::fs::write(
        &file,
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    value: free\n",
    )
    .expect("write");
    let out = run(&[], &file);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = sluice_policies::parse(&String::from_utf8_lossy(&out.stdout)).expect("a document");
    assert_eq!(one(&doc, "d", &[("a", "free")]), ["nothing"]);
    assert_eq!(one(&doc, "d", &[("a", "x")]).len(), 1);
}

/// What envoyproxy/ratelimit refuses to load, `sluice import` refuses.
#[test]
fn configurations_the_peer_refuses_are_refused() {
    let dir = sluice_harness::scratch_dir("import-bad").expect("scratch dir");
    for (yaml, why) in [
        ("descriptors: [1, 2]\n", "not an envoyproxy/ratelimit configuration"),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "is not a unit",
        ),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, unlimited: true}\n", "no unit"),
        ("domain: d\ndescriptors:\n  - key: a\n  - key: a\n", "duplicate descriptor"),
        ("domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n", "share_threshold"),
        ("domain: d\ndescriptors:\n  - key: a\n    limt: 1\n", "unknown field"),
    ] {
        let file = dir.join("bad.yaml");
        std::fs::write(&file, yaml).expect("write");
        let out = run(&[], &file);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{yaml}: {stderr}");
        assert!(out.stdout.is_empty());
        assert!(stderr.contains(why), "{why:?} missing from: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn limitador_files_are_detected_and_every_matching_limit_applies() {
    // Every limit carried exactly, its window from its counter's first hit
    // (regression: each was a loss, Sluice's window aligned to the epoch).
    let doc = import("limitador/examples.yaml");
    assert_eq!(doc.charge, Charge::AllOrNone);
    assert_eq!(doc.statuses, Statuses::Overall, "Limitador answers the overall code alone");
    let post = descriptor("test_namespace", &[("req.method", "POST"), ("user_id", "u1")]);
    assert_eq!(
        limits(&doc, &post),
        [format!("1000000/{MIN} first hit \"\" key=\"\""), format!("5/{MIN} first hit \"\" key=\"u1\"")]
    );
    // A variable that does not resolve: that limit does not apply.
    let anonymous = descriptor("test_namespace", &[("req.method", "POST")]);
    assert_eq!(limits(&doc, &anonymous), [format!("1000000/{MIN} first hit \"\" key=\"\"")]);
    // Only descriptors[0] is read.
    let second = SimpleRequest::default()
        .domain("test_namespace")
        .index(1)
        .entry("req.method", "POST")
        .entry("user_id", "u1");
    assert!(limits(&doc, &second).is_empty());

    let doc = import("limitador/sandbox.yaml");
    let get = |path: &str| descriptor("test_namespace", &[("req.method", "GET"), ("req.path", path)]);
    assert_eq!(limits(&doc, &get("/")), [format!("10/{MIN} first hit \"\" key=\"\"")]);
    assert_eq!(limits(&doc, &get("/json")), [format!("50000/{} first hit \"\" key=\"\"", 10 * S)]);
    // `!=` on a missing entry is false, as in Limitador.
    assert!(limits(&doc, &descriptor("test_namespace", &[("req.method", "GET")])).is_empty());

    let doc = import("limitador/configuration.yaml");
    let req = descriptor("example.org", &[("req_method", "GET"), ("user_id", "7"), ("KEY_A", "VALUE_A")]);
    assert_eq!(
        limits(&doc, &req),
        [format!("10/{MIN} first hit \"\" key=\"7\""), format!("1/{MIN} first hit \"key-a\" key=\"\"")]
    );
}

#[test]
fn limitador_conditions_beyond_the_documented_forms_are_refused() {
    let dir = sluice_harness::scratch_dir("import-limitador").expect("scratch dir");
    for condition in [
        "descriptors[0]['a'].startsWith('x')",
        "descriptors[0]['a'] == 'x' || descriptors[0]['b'] == 'y'",
        "size(descriptors) > 1",
    ] {
        let file = dir.join("limits.yaml");
        let yaml = format!("- namespace: n\n  max_value: 1\n  seconds: 1\n  conditions: [\"{condition}\"]\n  variables: []\n");
        std::fs::write(&file, yaml).expect("write");
        let out = run(&["--from", "limitador", "--accept-losses"], &file);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{condition}: {stderr}");
        assert!(stderr.contains("line 1") && stderr.contains("conditions[0]"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `quota_mode` is carried as `quota` (the document charges each
/// descriptor on its own): no loss.
#[test]
fn quota_mode_is_carried_as_quota() {
    let doc = import("quota.yaml");
    let quota: Vec<(&str, bool)> = doc.policies.iter().map(|p| (p.name.as_str(), p.quota)).collect();
    assert_eq!(
        quota,
        [("edge_a", true), ("edge_b", true), ("edge_s", true), ("edge_r", false), ("edge_u", false)]
    );
    assert!(doc.policies[2].shadow);
}

/// `metadata` is carried as the policy's `metadata`; the document leaves
/// `dynamic_metadata` off, as envoyproxy/ratelimit's
/// `RESPONSE_DYNAMIC_METADATA` is by default.
#[test]
fn metadata_is_carried_and_answered_only_when_asked() {
    let doc = import("metadata.yaml");
    assert!(!doc.dynamic_metadata);
    let metadata: Vec<Option<serde_json::Value>> =
        doc.policies.iter().map(|p| p.metadata.clone().map(serde_json::Value::Object)).collect();
    assert_eq!(
        metadata,
        [
            Some(serde_json::json!({"team": "payments", "tags": {"tier": "gold"}})),
            Some(serde_json::json!({"team": "search", "tags": {"zone": "eu"}, "weight": 2})),
            None
        ]
    );
}

/// Limitador's server setting `--rate-limit-headers` is not in its limits
/// file: `sluice import` takes it as a flag. With `DRAFT_VERSION_03` the
/// document sends draft 03's headers on every answer; the default sends
/// none, as Limitador's; for an envoyproxy/ratelimit configuration the flag
/// is refused, naming why.
#[test]
fn limitadors_rate_limit_headers_are_a_flag_of_the_import() {
    let limits = fixture("limitador/examples.yaml");
    let out = run(&["--rate-limit-headers", "DRAFT_VERSION_03"], &limits);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = sluice_policies::parse(&String::from_utf8_lossy(&out.stdout)).expect("a document");
    assert_eq!((doc.headers, doc.header_format), (HeadersMode::Always, HeaderFormat::DraftVersion03));
    assert_eq!(import("limitador/examples.yaml").headers, HeadersMode::Off);

    let config = fixture("readme/example1.yaml");
    let out = run(&["--rate-limit-headers", "DRAFT_VERSION_03"], &config);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("a setting of Limitador's server"));
}
