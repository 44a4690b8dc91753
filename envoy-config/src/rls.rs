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
//! be absent (`{"present": false}`) sends nothing; an entry only the
//! policy's key reads (`entry:NAME`) is sent when the request has it
//! (`skip_if_absent`). The policies of one `descriptor_index` (Limitador's
//! `descriptors[N]`) share one descriptor with every entry they read, each
//! sent when present, first and in index order. Envoy sends one domain:
//! every gRPC-face policy that names one must name the same.

use anyhow::bail;
use serde_json::{json, Value};
use sluice_policies::condition::ValueCondition;
use sluice_policies::tree::StepValue;
use sluice_policies::{Document, Face, FailureMode, KeySource, Policy};

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
    // Limitador's `descriptors[N]`: every policy of index N reads the one
    // descriptor at N, so they share one, with every entry any of them
    // reads (each optional: a missing entry fails a condition on it, and a
    // key without it does not apply). First, in index order.
    let mut indexes: Vec<usize> = grpc.iter().filter_map(|p| p.matcher.descriptor_index).collect();
    indexes.sort_unstable();
    indexes.dedup();
    let mut rate_limits: Vec<Value> = indexes
        .iter()
        .map(|&n| {
            let mut actions: Vec<Value> = Vec::new();
            for p in grpc.iter().filter(|p| p.matcher.descriptor_index == Some(n)) {
                for (key, cond, _) in reads(p) {
                    let a = optional(action(key, &cond));
                    if !actions.contains(&a) {
                        actions.push(a);
                    }
                }
            }
            json!({"actions": actions})
        })
        .collect();
    rate_limits.extend(grpc.iter().filter(|p| p.matcher.descriptor_index.is_none()).map(|p| {
        let actions: Vec<Value> = reads(p)
            .into_iter()
            .map(|(key, cond, keyed)| if keyed { optional(action(key, &cond)) } else { action(key, &cond) })
            .collect();
        json!({"actions": actions})
    }));
    rate_limits.retain(|r| r["actions"].as_array().is_some_and(|a| !a.is_empty()));
    // One descriptor per distinct action list: a tree's nodes share paths,
    // and a descriptor sent twice is charged twice under `each_descriptor`
    // and `every_hit`.
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

/// The entries `policy` reads, in order, each with its condition and
/// whether only its key reads it: a tree node's path; else its `entries`
/// (an entry that must be absent sends nothing), then each `entry:NAME`
/// its key reads that its `match` does not (sent when the request has it:
/// a policy whose key lacks it follows its `on_missing_key`).
fn reads(policy: &Policy) -> Vec<(&str, ValueCondition, bool)> {
    let mut reads: Vec<(&str, ValueCondition, bool)> = match &policy.matcher.descriptor_tree {
        Some(path) => path
            .iter()
            .map(|step| match &step.value {
                StepValue::Exact(v) => (step.key.as_str(), ValueCondition::Equals(v.clone()), false),
                _ => (step.key.as_str(), ValueCondition::Present(true), false),
            })
            .collect(),
        None => policy
            .matcher
            .entries
            .iter()
            .filter(|(_, cond)| **cond != ValueCondition::Present(false))
            .map(|(key, cond)| (key.as_str(), cond.clone(), false))
            .collect(),
    };
    for source in &policy.key {
        if let KeySource::Entry(name) = source {
            if !reads.iter().any(|(k, _, _)| k == name) && !policy.matcher.entries.contains_key(name) {
                reads.push((name.as_str(), ValueCondition::Present(true), true));
            }
        }
    }
    reads
}

/// `action`, sent without its entry when the request lacks it (a request
/// header's `skip_if_absent`) rather than dropping the whole descriptor.
fn optional(mut action: Value) -> Value {
    if let Some(headers) = action.get_mut("request_headers").and_then(Value::as_object_mut) {
        headers.insert("skip_if_absent".to_string(), Value::Bool(true));
    }
    action
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

    /// Regression: a Limitador limit's variables (key-only entries) were
    /// never sent, so the limit never applied; and each limit of
    /// `descriptors[0]` was sent as its own descriptor, so only the first
    /// one sent was at index 0.
    #[test]
    fn the_policies_of_one_descriptor_index_share_one_descriptor() {
        let values = values(
            r#"{"policies": [
            {"name": "all", "match": {"domain": "ns", "descriptor_index": 0}, "limits": [{"type": "fixed_window", "limit": 9, "window": "1m"}]},
            {"name": "posts", "match": {"domain": "ns", "descriptor_index": 0, "entries": {"req.method": {"equals": "POST"}}},
             "key": ["entry:user_id"], "on_missing_key": "skip", "limits": [{"type": "fixed_window", "limit": 5, "window": "1m"}]},
            {"name": "users", "match": {"domain": "ns", "descriptor_index": 0},
             "key": ["entry:user_id"], "on_missing_key": "skip", "limits": [{"type": "fixed_window", "limit": 7, "window": "1m"}]}
        ]}"#,
        )
        .expect("renders");
        let rate_limits: Value = serde_json::from_str(&values[1].1).expect("json");
        assert_eq!(
            rate_limits,
            json!([{"actions": [
                {"request_headers": {"header_name": "req.method", "descriptor_key": "req.method", "skip_if_absent": true}},
                {"request_headers": {"header_name": "user_id", "descriptor_key": "user_id", "skip_if_absent": true}}
            ]}])
        );
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
