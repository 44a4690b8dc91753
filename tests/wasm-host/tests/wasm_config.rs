//! Scenario 5, bad configuration: sluice.wasm refuses a bad policy document in
//! `proxy_on_configure` (returns false, which makes Envoy refuse the
//! configuration) and says why in exactly one error line, naming the place.
//! The wasm host runs the real `dist/sluice.wasm`; no shim is needed.

use sluice_wasm_host::{Plugin, Route};

const SHIM: &str = "sluice_shim";

/// A valid document with `limit` as its one limit and `extra` appended to its
/// policy object.
fn document(limit: &str, extra: &str) -> String {
    format!(
        r#"{{
  "shim": {{"cluster": "sluice_shim", "timeout_ms": 50}},
  "failure_mode": "deny",
  "policies": [
    {{"name": "partner-api", "key": ["header:x-api-key"],
      "limits": [{limit}]{extra}}}
  ]
}}"#
    )
}

const GOOD_LIMIT: &str = r#"{"type": "sliding_window", "limit": 25, "window": "5s"}"#;

/// Boots sluice.wasm with `doc` and expects on_configure to refuse it with
/// one error line that contains `reason`.
fn refused(doc: &str, reason: &str) {
    Plugin::boot(doc, SHIM, Route::Scripted).configure().refuses_configuration().logs_error(reason).done();
}

/// The reference document is accepted, so the refusals below are about
/// their one defect.
#[test]
fn a_good_document_is_accepted() {
    Plugin::configured(&document(GOOD_LIMIT, ""), SHIM, Route::Scripted);
}

/// A malformed duration is refused, naming the field and the bad value.
#[test]
fn a_bad_duration_is_refused() {
    let limit = r#"{"type": "sliding_window", "limit": 25, "window": "5 sec"}"#;
    refused(&document(limit, ""), r#"policies[0].limits[0].window: invalid duration "5 sec""#);
}

/// An unknown field is refused, not ignored.
#[test]
fn an_unknown_field_is_refused() {
    refused(&document(GOOD_LIMIT, r#", "burst": 10"#), "unknown field `burst`");
}

/// Two policies with the same name are refused.
#[test]
fn a_duplicate_policy_name_is_refused() {
    let doc = format!(
        r#"{{"policies": [
            {{"name": "p", "limits": [{GOOD_LIMIT}]}},
            {{"name": "p", "limits": [{GOOD_LIMIT}]}}]}}"#
    );
    refused(&doc, r#"duplicate policy name "p" at policies[1]"#);
}

/// A limit of zero would deny everything: refused.
#[test]
fn a_zero_limit_is_refused() {
    let limit = r#"{"type": "sliding_window", "limit": 0, "window": "5s"}"#;
    refused(&document(limit, ""), "policies[0].limits[0].limit");
}

/// A document that is not JSON is refused.
#[test]
fn a_document_that_is_not_json_is_refused() {
    refused("shim: {cluster: sluice_shim}", "invalid policy document");
}

/// An empty configuration (Envoy hands the filter no bytes) is refused.
#[test]
fn an_empty_configuration_is_refused() {
    refused("", "no configuration given");
}

/// A policy with no limits is refused.
#[test]
fn a_policy_without_limits_is_refused() {
    refused(&document("", ""), "policies[0]: a policy needs at least one limit");
}
