//! The RLS face's envoy.yaml: Envoy's native `envoy.filters.http.ratelimit`
//! filter pointed at `sluice serve --grpc-listen`, from the template
//! `envoy/rls.yaml`. The route's `rate_limits` come from the document: one
//! rate limit per gRPC-face policy, whose actions send the entries its
//! `match` reads.
//!
//! Each entry key becomes the action Envoy has for it: `generic_key` (with
//! `equals`) a `generic_key` action, `remote_address` the client address,
//! `destination_cluster` and `source_cluster` theirs; any other key
//! `request_headers`, the request header of that name. An entry that must
//! be absent (`{"present": false}`) sends nothing. Envoy sends one domain:
//! every gRPC-face policy that names one must name the same.

use anyhow::bail;
use serde_json::{json, Value};
use sluice_policies::condition::ValueCondition;
use sluice_policies::tree::StepValue;
use sluice_policies::{Document, Face, FailureMode};

/// `envoy/rls.yaml`, built in.
pub const RLS_TEMPLATE: &str = include_str!("../../envoy/rls.yaml");

/// The domain when no policy names one.
pub const DEFAULT_DOMAIN: &str = "sluice";

/// The template's `DOMAIN`, `RATE_LIMITS`, `FAILURE_MODE_DENY` and `TIMEOUT`.
pub fn rls_values(doc: &Document) -> anyhow::Result<Vec<(String, String)>> {
    let grpc: Vec<_> = doc.policies.iter().filter(|p| p.matcher.face() == Face::Rls).collect();
    if grpc.is_empty() {
        bail!("the document has no gRPC-face policy (a `match` naming `domain` or `entries`): nothing for the RLS face to send");
    }
    let mut domains: Vec<&str> = grpc.iter().filter_map(|p| p.matcher.domain.as_deref()).collect();
    domains.dedup();
    let domain = match domains.as_slice() {
        [] => DEFAULT_DOMAIN,
        [one] => one,
        [first, second, ..] => {
            bail!("policies name the domains {first:?} and {second:?}: Envoy's rate-limit filter sends one domain")
        }
    };
    let mut rate_limits: Vec<Value> = grpc
        .iter()
        .map(|p| {
            let actions: Vec<Value> = match &p.matcher.descriptor_tree {
                // A tree node: its path's entries, in order.
                Some(path) => path
                    .iter()
                    .map(|step| match &step.value {
                        StepValue::Exact(v) => action(&step.key, &ValueCondition::Equals(v.clone())),
                        _ => action(&step.key, &ValueCondition::Present(true)),
                    })
                    .collect(),
                None => p
                    .matcher
                    .entries
                    .iter()
                    .filter(|(_, cond)| **cond != ValueCondition::Present(false))
                    .map(|(key, cond)| action(key, cond))
                    .collect(),
            };
            json!({"actions": actions})
        })
        .filter(|r| r["actions"].as_array().is_some_and(|a| !a.is_empty()))
        .collect();
    // One descriptor per distinct action list: a tree's nodes share paths,
    // and a descriptor sent twice is charged twice under `each_descriptor`.
    let mut seen = Vec::new();
    rate_limits.retain(|r| {
        if seen.contains(r) {
            false
        } else {
            seen.push(r.clone());
            true
        }
    });
    if rate_limits.is_empty() {
        bail!("no gRPC-face policy reads an entry: Envoy sends no descriptor without an action");
    }
    let deny = grpc.iter().any(|p| doc.failure_of(p).0 == FailureMode::Deny);
    let timeout_ms = doc.shim.timeout_ms.get();
    Ok(vec![
        ("DOMAIN".to_string(), serde_json::to_string(domain)?),
        ("RATE_LIMITS".to_string(), serde_json::to_string(&rate_limits)?),
        ("FAILURE_MODE_DENY".to_string(), deny.to_string()),
        ("TIMEOUT".to_string(), format!("{}s", f64::from(timeout_ms) / 1000.0)),
    ])
}

/// The action that sends entry `key`.
fn action(key: &str, cond: &ValueCondition) -> Value {
    match (key, cond) {
        ("generic_key", ValueCondition::Equals(v)) => json!({"generic_key": {"descriptor_value": v}}),
        ("remote_address", _) => json!({"remote_address": {}}),
        ("destination_cluster", _) => json!({"destination_cluster": {}}),
        ("source_cluster", _) => json!({"source_cluster": {}}),
        _ => json!({"request_headers": {"header_name": key, "descriptor_key": key}}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(doc: &str) -> anyhow::Result<Vec<(String, String)>> {
        rls_values(&sluice_policies::parse(doc).expect("a document"))
    }

    #[test]
    fn each_grpc_policy_becomes_a_rate_limit_of_its_entries() {
        let v = values(
            r#"{"failure_mode": "deny", "policies": [
              {"name": "a", "match": {"domain": "edge", "entries": {"generic_key": {"equals": "api"}, "x-user": {"present": true}, "gone": {"present": false}}},
               "key": ["entry:x-user"], "limits": [{"type": "fixed_window", "limit": 1, "window": "1s"}]},
              {"name": "http", "match": {"path_prefix": "/"}, "limits": [{"type": "fixed_window", "limit": 1, "window": "1s"}]}]}"#,
        )
        .expect("values");
        let get = |name: &str| v.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str()).expect(name);
        assert_eq!(get("DOMAIN"), "\"edge\"");
        assert_eq!(get("FAILURE_MODE_DENY"), "true");
        assert_eq!(
            get("RATE_LIMITS"),
            r#"[{"actions":[{"generic_key":{"descriptor_value":"api"}},{"request_headers":{"descriptor_key":"x-user","header_name":"x-user"}}]}]"#
        );
    }

    #[test]
    fn two_domains_or_no_grpc_policy_is_refused() {
        let two = r#"{"policies": [
          {"name": "a", "match": {"domain": "x"}, "unlimited": true},
          {"name": "b", "match": {"domain": "y"}, "unlimited": true}]}"#;
        assert!(values(two).unwrap_err().to_string().contains("one domain"));
        let http = r#"{"policies": [{"name": "h", "limits": [{"type": "interval", "every": "1s"}]}]}"#;
        assert!(values(http).is_err());
    }

    #[test]
    fn a_descriptor_tree_sends_each_path_once() {
        let values = values(
            r#"{"charge": "each_descriptor", "policies": [
            {"name": "plan", "match": {"domain": "edge", "descriptor_tree": [{"key": "plan"}]},
             "key": ["entry:plan"], "limits": [{"type": "fixed_window", "limit": 7, "window": "1m"}]},
            {"name": "pro", "match": {"domain": "edge", "descriptor_tree": [{"key": "plan", "value": "pro"}]},
             "limits": [{"type": "fixed_window", "limit": 12, "window": "1m"}]},
            {"name": "deep", "match": {"domain": "edge", "descriptor_tree": [{"key": "org"}, {"key": "user", "value": "u*"}]},
             "key": ["entry:org", "entry:user"], "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]}
        ]}"#,
        )
        .expect("renders");
        let rate_limits: Value = serde_json::from_str(&values[1].1).expect("json");
        assert_eq!(
            rate_limits,
            json!([
                {"actions": [{"request_headers": {"header_name": "plan", "descriptor_key": "plan"}}]},
                {"actions": [
                    {"request_headers": {"header_name": "org", "descriptor_key": "org"}},
                    {"request_headers": {"header_name": "user", "descriptor_key": "user"}}
                ]}
            ])
        );
    }
}
