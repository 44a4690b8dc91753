//! The `sluice` command line: `validate`, `schema` and `envoy-config`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice")).args(args).output().expect("running sluice")
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn examples() -> Vec<PathBuf> {
    let dir = root().join("policies/examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}

/// The committed schema, compiled.
fn schema_validator() -> jsonschema::Validator {
    let text = std::fs::read_to_string(root().join("policies/schema.json")).expect("policies/schema.json");
    let schema: serde_json::Value = serde_json::from_str(&text).expect("schema is JSON");
    jsonschema::validator_for(&schema).expect("schema compiles")
}

/// `validate` prints `FILE: ok` per good file, the error per bad one, and
/// exits 1 if any is bad.
#[test]
fn validate_reports_each_file_and_fails_on_any_error() {
    let good = root().join("policies/examples/partner-api.json");
    let bad = root().join("policies/tests/fixtures/bad_duration.json");
    let out = sluice(&["validate", good.to_str().expect("utf-8 path")]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{}: ok\n", good.display()));

    let out = sluice(&["validate", good.to_str().expect("utf-8"), bad.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let want = format!(
        "{}: ok\n{}: policies[0].limits[0].window: invalid duration \"5 sec\" (expected e.g. \"5s\", \"250ms\"; from 1ms to 365d) at 6:66\n",
        good.display(),
        bad.display()
    );
    assert_eq!(stdout, want);

    let out = sluice(&["validate", "/no/such/file.json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("/no/such/file.json: cannot read: "));
}

/// `policies/schema.json` is what `sluice schema` prints; regenerate it with
/// `dist/sluice schema > policies/schema.json` when the document types change.
#[test]
fn committed_schema_is_up_to_date() {
    let out = sluice(&["schema"]);
    assert!(out.status.success());
    let committed =
        std::fs::read_to_string(root().join("policies/schema.json")).expect("policies/schema.json");
    assert!(
        String::from_utf8_lossy(&out.stdout) == committed,
        "policies/schema.json is out of date: run `dist/sluice schema > policies/schema.json`"
    );
}

/// Every example is valid by the schema as well as by the parser, and
/// points editors at the schema.
#[test]
fn examples_are_valid_by_the_schema() {
    let validator = schema_validator();
    let files = examples();
    assert!(files.len() >= 8, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("example");
        let doc: serde_json::Value = serde_json::from_str(&text).expect("example is JSON");
        assert_eq!(doc["$schema"], "../schema.json", "{}", file.display());
        let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", file.display());
        assert!(sluice_policies::parse(&text).is_ok(), "{}", file.display());
    }
}

/// The schema refuses what the parser refuses, for the mistakes a schema can see.
#[test]
fn schema_refuses_common_mistakes() {
    let validator = schema_validator();
    for name in [
        "bad_duration",
        "zero_limit",
        "unknown_limit_field",
        "field_of_another_type",
        "unknown_policy_field",
        "bad_method",
        "missing_window",
    ] {
        let path = root().join(format!("policies/tests/fixtures/{name}.json"));
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("JSON");
        assert!(!validator.is_valid(&doc), "the schema accepts {name}");
    }
}

/// `envoy-config` prints a configuration that Envoy itself accepts, for a
/// plain document and for an egress one with `wait`: its stream idle timeout
/// outlasts the longest hold, and the shim cluster admits many held calls.
#[test]
fn envoy_config_is_accepted_by_envoy() {
    for (example, idle) in [("partner-api", "300s"), ("egress-partner", "300s")] {
        let policy = root().join(format!("policies/examples/{example}.json"));
        let yaml = envoy_config_of(&policy);
        assert!(yaml.contains(&format!("stream_idle_timeout: {idle}")), "{yaml}");
        assert!(yaml.contains("max_requests: 100000"), "{yaml}");
        envoy_validates(&yaml);
    }
}

/// The config `envoy-config` prints for `policy`, with the real filter.
fn envoy_config_of(policy: &std::path::Path) -> String {
    // Envoy checks that the filter exists, so point at the real one.
    let dist = std::env::var("SLUICE_DIST").map(PathBuf::from).unwrap_or_else(|_| root().join("dist"));
    let wasm = dist.join("sluice.wasm");
    assert!(wasm.exists(), "{} is missing: run `cargo xtask test`", wasm.display());
    let wasm = wasm.to_str().expect("utf-8 path");
    let args = [
        "envoy-config",
        "--policy",
        policy.to_str().expect("utf-8"),
        "--wasm",
        wasm,
        "--listen",
        "0.0.0.0:10000",
    ];
    let out = sluice(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8(out.stdout).expect("utf-8 yaml");
    assert!(yaml.contains(wasm));
    yaml
}

fn envoy_validates(yaml: &str) {
    let dir = sluice_harness::scratch_dir("envoy-config").expect("scratch dir");
    let file = dir.join("envoy.yaml");
    std::fs::write(&file, yaml).expect("write envoy.yaml");
    let envoy = std::env::var("SLUICE_ENVOY").unwrap_or_else(|_| "envoy".to_string());
    let check = Command::new(&envoy)
        .args(["--mode", "validate", "-c"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("running {envoy} (set SLUICE_ENVOY, or run `cargo xtask test`): {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        check.status.success(),
        "envoy refused the config:\n{}\n{yaml}",
        String::from_utf8_lossy(&check.stderr)
    );
}

/// `--wasm` is made absolute and must exist: a wrong path fails here, not in
/// Envoy. Without it, the sluice.wasm beside the binary is used, wherever the
/// command runs. The rendered file's comments are the template's notes: no
/// placeholder there is filled with the policy or the TLS setting.
#[test]
fn envoy_config_checks_the_wasm_and_defaults_to_the_one_beside_it() {
    let policy = root().join("policies/examples/partner-api.json");
    let policy = policy.to_str().expect("utf-8");
    let out = sluice(&["envoy-config", "--policy", policy, "--wasm", "/no/such/sluice.wasm"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--wasm /no/such/sluice.wasm: no such file"), "{stderr}");

    let dir = sluice_harness::scratch_dir("envoy-config-wasm").expect("scratch dir");
    let binary = dir.join("sluice");
    std::fs::copy(env!("CARGO_BIN_EXE_sluice"), &binary).expect("copy the binary");
    let out = Command::new(&binary).args(["envoy-config", "--policy", policy]).current_dir("/").output();
    let out = out.expect("running the copy");
    assert_eq!(out.status.code(), Some(1), "no sluice.wasm beside it yet");
    assert!(String::from_utf8_lossy(&out.stderr).contains("(the default: beside this binary)"));

    std::fs::write(dir.join("sluice.wasm"), b"\0asm").expect("a file to point at");
    let out = Command::new(&binary).args(["envoy-config", "--policy", policy]).current_dir("/").output();
    let out = out.expect("running the copy");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8(out.stdout).expect("utf-8 yaml");
    let wasm = dir.join("sluice.wasm");
    assert!(yaml.contains(&wasm.display().to_string()), "{yaml}");
    let comments: Vec<&str> = yaml.lines().filter(|l| l.trim_start().starts_with('#')).collect();
    assert!(comments.iter().any(|l| l.contains("${POLICY_JSON}")), "the notes name the placeholder");
    assert!(
        !comments.iter().any(|l| l.contains("sliding_window")),
        "no policy in a comment:\n{}",
        comments.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bad policy gets no config, and the error names the file and field.
#[test]
fn envoy_config_refuses_a_bad_policy() {
    let bad = root().join("policies/tests/fixtures/zero_limit.json");
    let out = sluice(&["envoy-config", "--policy", bad.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("zero_limit.json: policies[0].limits[0].limit: invalid count 0"), "{stderr}");
}

/// With `--shim-ca`, `--shim-client-cert` and `--shim-client-key`, the shim
/// cluster gets Envoy's client certificate, the CA, SNI and ALPN h2; Envoy
/// accepts it (it loads the files). Without them, cleartext. Half the flags
/// are refused, and so is a missing file. Paths are normalized either way.
#[test]
fn envoy_config_renders_mutual_tls_to_the_shim() {
    let pki = sluice_harness::tls::Pki::generate().expect("certificates");
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let (ca, cert, key) = (path(&pki.ca), path(&pki.client.cert), path(&pki.client.key));
    let plain = tls_config_accepted_by_envoy(&[]);
    assert!(!plain.contains("UpstreamTlsContext"), "cleartext without the flags");
    let yaml = tls_config_accepted_by_envoy(&[
        "--shim-ca",
        &ca,
        "--shim-client-cert",
        &cert,
        "--shim-client-key",
        &key,
        "--shim-server-name",
        "sluice-shim",
    ]);
    for want in [
        "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        &format!(r#""certificate_chain":{{"filename":"{cert}"}}"#),
        &format!(r#""private_key":{{"filename":"{key}"}}"#),
        &format!(r#""trusted_ca":{{"filename":"{ca}"}}"#),
        r#""alpn_protocols":["h2"]"#,
        r#""sni":"sluice-shim""#,
        "http2_protocol_options",
        "normalize_path: true",
        "merge_slashes: true",
    ] {
        assert!(yaml.contains(want), "no {want} in\n{yaml}");
    }
    let policy = root().join("policies/examples/partner-api.json");
    let out = sluice(&["envoy-config", "--policy", policy.to_str().expect("utf-8"), "--shim-ca", &ca]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let out = sluice(&[
        "envoy-config",
        "--policy",
        policy.to_str().expect("utf-8"),
        "--shim-ca",
        "/no/such/ca.pem",
        "--shim-client-cert",
        &cert,
        "--shim-client-key",
        &key,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--shim-ca /no/such/ca.pem"));
}

/// `envoy-config` for the partner-api example with `extra` flags, checked by
/// `envoy --mode validate`; the YAML.
fn tls_config_accepted_by_envoy(extra: &[&str]) -> String {
    let policy = root().join("policies/examples/partner-api.json");
    let dist = std::env::var("SLUICE_DIST").map(PathBuf::from).unwrap_or_else(|_| root().join("dist"));
    let wasm = dist.join("sluice.wasm");
    assert!(wasm.exists(), "{} is missing: run `cargo xtask test`", wasm.display());
    let mut args = vec!["envoy-config", "--policy", policy.to_str().expect("utf-8"), "--wasm"];
    args.push(wasm.to_str().expect("utf-8 path"));
    args.extend_from_slice(extra);
    let out = sluice(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8(out.stdout).expect("utf-8 yaml");
    envoy_validates(&yaml);
    yaml
}

/// `envoy-config --face rlqs` prints a configuration with Envoy's
/// `rate_limit_quota` filter, one bucket matcher per RLQS-face policy (its
/// bucket id built from constants and request headers) and an HTTP/2
/// cluster to the shim's gRPC listener, which Envoy itself accepts;
/// `failure_mode: deny` becomes `deny_all` before the first assignment.
#[test]
fn envoy_config_for_the_rlqs_face_is_accepted_by_envoy() {
    let dir = sluice_harness::scratch_dir("envoy-config-rlqs").expect("scratch dir");
    let policy = dir.join("rlqs.json");
    std::fs::write(
        &policy,
        r#"{"failure_mode": "deny", "policies": [
          {"name": "per-client", "match": {"domain": "edge", "bucket": {"name": {"equals": "api"}, "x-client": {"prefix": "team-"}}},
           "key": ["bucket:x-client"], "leased": {"tokens": 100, "ttl": "5s"},
           "limits": [{"type": "fixed_window", "limit": 6000, "window": "1m"}]},
          {"name": "by-tenant", "match": {"domain": "edge", "bucket": {"x-tenant": {"present": true}}},
           "key": ["bucket:x-tenant"], "leased": {"tokens": 100, "ttl": "5s"},
           "limits": [{"type": "fixed_window", "limit": 6000, "window": "1m"}]},
          {"name": "everyone", "match": {"domain": "edge", "bucket": {"name": {"equals": "all"}}},
           "leased": {"tokens": 100, "ttl": "5s"}, "limits": [{"type": "fixed_window", "limit": 60000, "window": "1m"}]},
          {"name": "http", "match": {"path_prefix": "/"}, "limits": [{"type": "fixed_window", "limit": 1, "window": "1s"}]}]}"#,
    )
    .expect("write the policy");
    let out = sluice(&[
        "envoy-config",
        "--face",
        "rlqs",
        "--policy",
        policy.to_str().expect("utf-8"),
        "--shim",
        "127.0.0.1:8081",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8(out.stdout).expect("utf-8 yaml");
    for part in [
        "envoy.filters.http.rate_limit_quota",
        "domain: \"edge\"",
        r#""name":{"string_value":"api"}"#,
        r#""header_name":"x-client""#,
        r#""value_match":{"prefix":"team-"}"#,
        r#""blanket_rule":"DENY_ALL""#,
        r#""port_value":8081"#,
        "http2_protocol_options",
    ] {
        assert!(yaml.contains(part), "{part} missing:\n{yaml}");
    }
    assert!(!yaml.contains("sluice.wasm"), "{yaml}");
    envoy_validates(&yaml);
}

/// `envoy-config --face rls` prints a configuration with Envoy's native
/// rate-limit filter, the route's `rate_limits` and an HTTP/2 cluster to the
/// shim's gRPC listener, which Envoy itself accepts; `failure_mode: deny`
/// becomes `failure_mode_deny: true`.
#[test]
fn envoy_config_for_the_rls_face_is_accepted_by_envoy() {
    let dir = sluice_harness::scratch_dir("envoy-config-rls").expect("scratch dir");
    let policy = dir.join("rls.json");
    std::fs::write(
        &policy,
        r#"{"failure_mode": "deny", "policies": [
          {"name": "per-client", "match": {"domain": "edge", "entries": {"generic_key": {"equals": "api"}, "x-client": {"present": true}}},
           "key": ["entry:x-client"], "limits": [{"type": "fixed_window", "limit": 100, "window": "1m"}]},
          {"name": "by-address", "match": {"domain": "edge", "entries": {"remote_address": {"present": true}}},
           "key": ["entry:remote_address"], "limits": [{"type": "token_bucket", "rate": 10, "per": "1s", "burst": 20}]}]}"#,
    )
    .expect("write the policy");
    let out = sluice(&[
        "envoy-config",
        "--face",
        "rls",
        "--policy",
        policy.to_str().expect("utf-8"),
        "--shim",
        "127.0.0.1:8081",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8(out.stdout).expect("utf-8 yaml");
    for part in [
        "envoy.filters.http.ratelimit",
        "domain: \"edge\"",
        "failure_mode_deny: true",
        r#"{"generic_key":{"descriptor_value":"api"}}"#,
        r#"{"remote_address":{}}"#,
        r#""port_value":8081"#,
        "http2_protocol_options",
    ] {
        assert!(yaml.contains(part), "{part} missing:\n{yaml}");
    }
    assert!(!yaml.contains("sluice.wasm"), "{yaml}");
    envoy_validates(&yaml);
}
