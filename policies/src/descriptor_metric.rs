//! RLS face: the `descriptor` label a `descriptor_tree` node's decisions
//! carry in `sluice_descriptor_decisions_total`, when the policy says
//! `descriptor_metric`: the name envoyproxy/ratelimit gives the stats of
//! the descriptor, `DOMAIN.PART.PART…`, one part per entry:
//!
//! - `"value"`: the descriptor's own `key_value` (`key` alone for an empty
//!   value): envoyproxy/ratelimit's `detailed_metric` at every level, and
//!   its `value_to_metric` at its levels;
//! - `"step"`: the path's step as written: `key_value` for a fixed value,
//!   `key_pattern` for a wildcard, `key` for any value (its stats' name
//!   without either flag, and a `share_threshold` level's with them).
//!
//! Its values are as many as the peer's stats names; the shim caps them
//! (see the shim's metrics).

use crate::tree::StepValue;
use crate::{Policy, Request};

/// What one level of the path shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum MetricLevel {
    /// The descriptor's value.
    Value,
    /// The step as the path writes it.
    Step,
}

/// The `descriptor` label of `req`'s decisions by `policy`; `None` when
/// the policy has no `descriptor_metric` or `req` is not a descriptor of
/// its node.
pub fn label(policy: &Policy, req: &impl Request) -> Option<String> {
    let levels = policy.descriptor_metric.as_deref()?;
    let path = policy.matcher.descriptor_tree.as_deref()?;
    let entries = req.entries();
    if entries.len() != path.len() {
        return None;
    }
    let mut out = String::from_utf8_lossy(req.domain()?).into_owned();
    for ((level, step), (key, value)) in levels.iter().zip(path).zip(entries) {
        out.push('.');
        out.push_str(key);
        let shown = match (level, &step.value) {
            (MetricLevel::Value, _) => String::from_utf8_lossy(value),
            (MetricLevel::Step, StepValue::Exact(v) | StepValue::Wildcard(v)) => v.as_str().into(),
            (MetricLevel::Step, StepValue::Any) => "".into(),
        };
        if !shown.is_empty() {
            out.push('_');
            out.push_str(&shown);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::SimpleRequest;

    fn policy(path: &str, levels: &str) -> Policy {
        let json = format!(
            r#"{{"name": "p", "match": {{"domain": "d", "descriptor_tree": {path}}},
                "key": ["entry:route"], "descriptor_metric": {levels},
                "limits": [{{"type": "fixed_window", "limit": 1, "window": "1m"}}]}}"#
        );
        serde_json::from_str(&json).expect("a valid policy")
    }

    /// envoyproxy/ratelimit's README, example 10: `value_to_metric` on
    /// `route` and `http_method`, not on `subject_id`.
    #[test]
    fn value_to_metric_shows_the_values_of_its_levels() {
        let p = policy(
            r#"[{"key": "route"}, {"key": "http_method"}, {"key": "subject_id"}]"#,
            r#"["value", "value", "step"]"#,
        );
        let req = SimpleRequest::default().domain("d").entry("route", "api").entry("http_method", "GET");
        assert_eq!(label(&p, &req), None, "not a descriptor of the node");
        let req = req.entry("subject_id", "123");
        assert_eq!(label(&p, &req).as_deref(), Some("d.route_api.http_method_GET.subject_id"));
    }

    /// A wildcard shown as written keeps its pattern; a fixed value is itself.
    #[test]
    fn a_step_shows_the_path_as_written() {
        let p = policy(
            r#"[{"key": "route", "value": "api/*"}, {"key": "m", "value": "GET"}]"#,
            r#"["step", "step"]"#,
        );
        let req = SimpleRequest::default().domain("d").entry("route", "api/v1").entry("m", "GET");
        assert_eq!(label(&p, &req).as_deref(), Some("d.route_api/*.m_GET"));
        let detailed =
            policy(r#"[{"key": "route", "value": "api/*"}, {"key": "m"}]"#, r#"["value", "value"]"#);
        assert_eq!(label(&detailed, &req).as_deref(), Some("d.route_api/v1.m_GET"));
    }
}
