//! An envoyproxy/ratelimit configuration as a policy document.
//!
//! Every descriptor becomes a node of the domain's descriptor tree
//! (`match.descriptor_tree`), so the face finds a descriptor's limit as
//! envoyproxy/ratelimit does: most specific first at every level, wildcards
//! anywhere, no going back (see `sluice_policies::tree`). Each node with a
//! `rate_limit` is one policy:
//!
//! - `requests_per_unit` per `unit`: a `fixed_window` aligned to the epoch
//!   (`second` to `week`; `month` is 30 days and `year` 365, as
//!   envoyproxy/ratelimit divides time); `requests_per_unit: 0` is
//!   `blocked` (every request refused);
//! - `unlimited`, `shadow_mode`, `replaces` carried as they are,
//!   `quota_mode` as `quota` (the document charges each descriptor on its
//!   own, as a quota policy needs); `name` is
//!   the answer's `limit_name` (`""` when none is given: the policy's own
//!   name is made of the path, never answered);
//! - its key reads each entry whose value is not fixed (no `value`, or a
//!   wildcard without `share_threshold`: with it, every value shares one
//!   counter).
//!
//! A node with neither `rate_limit` nor children is a node that limits
//! nothing (`"limits": []`): a descriptor that reaches it has no limit. The
//! document charges each descriptor on its own, its refused hits counted
//! too (`charge: every_hit`), and sends no RateLimit headers of its own
//! (`headers: off`), as envoyproxy/ratelimit by default.
//!
//! `detailed_metric` and `value_to_metric` become the policy's
//! `descriptor_metric` (its decisions counted per descriptor, labelled as
//! envoyproxy/ratelimit names its stats); the document honours a
//! descriptor's own `limit` (`descriptor_limit: honour`), as
//! envoyproxy/ratelimit does.
//!
//! `metadata` is the policy's `metadata` (in the answer's
//! `dynamic_metadata` only with the document's `dynamic_metadata`, off as
//! envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA` is by default).
//!
//! Losses: none.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::{json, Value};

use super::Loss;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    domain: String,
    #[serde(default)]
    descriptors: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Descriptor {
    key: String,
    #[serde(default)]
    value: Option<String>,
    rate_limit: Option<RateLimit>,
    #[serde(default)]
    descriptors: Vec<Descriptor>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default)]
    metadata: Option<serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimit {
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<Replaces>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Replaces {
    name: String,
}

/// The document and the losses (none: every field is carried).
pub fn convert(yaml: &str) -> anyhow::Result<(Value, Vec<Loss>)> {
    let config: Config = serde_norway::from_str(yaml).context("not an envoyproxy/ratelimit configuration")?;
    if config.domain.is_empty() {
        bail!("domain: must not be empty (envoyproxy/ratelimit refuses it too)");
    }
    let mut walk = Walk { domain: &config.domain, policies: Vec::new(), names: BTreeSet::new() };
    walk.level(&config.descriptors, "descriptors", &mut Vec::new())?;
    let document = json!({
        "charge": "every_hit",
        "headers": "off",
        "descriptor_limit": "honour",
        "policies": walk.policies,
    });
    Ok((document, Vec::new()))
}

/// One step of a path, as the document writes it.
#[derive(Clone)]
struct Step<'a> {
    key: &'a str,
    value: Option<&'a str>,
    /// Whether the entry's value is part of the counter's key.
    keyed: bool,
    /// `value_to_metric`: the value is in the stats' name.
    value_to_metric: bool,
    /// A wildcard with `share_threshold`: its stats show the pattern.
    shared: bool,
}

struct Walk<'a> {
    domain: &'a str,
    policies: Vec<Value>,
    names: BTreeSet<String>,
}

impl<'a> Walk<'a> {
    fn level(
        &mut self,
        descriptors: &'a [Descriptor],
        at: &str,
        path: &mut Vec<Step<'a>>,
    ) -> anyhow::Result<()> {
        let mut composite = BTreeSet::new();
        for (i, d) in descriptors.iter().enumerate() {
            let at = format!("{at}[{i}]");
            if d.key.is_empty() {
                bail!("{at}: a descriptor has an empty key");
            }
            // envoyproxy/ratelimit: an empty value is no value.
            let value = d.value.as_deref().filter(|v| !v.is_empty());
            let wildcard = value.is_some_and(|v| v.contains('*'));
            if !composite.insert((d.key.as_str(), value)) {
                bail!(
                    "{at}: duplicate descriptor {}{}",
                    d.key,
                    value.map(|v| format!("_{v}")).unwrap_or_default()
                );
            }
            if d.share_threshold && !wildcard {
                bail!("{at}: share_threshold is only for a wildcard value (with `*`)");
            }
            let keyed = value.is_none() || (wildcard && !d.share_threshold);
            let shared = wildcard && d.share_threshold;
            path.push(Step { key: &d.key, value, keyed, value_to_metric: d.value_to_metric, shared });
            match &d.rate_limit {
                Some(rate) => {
                    let policy = self.policy(d, rate, &at, path)?;
                    self.policies.push(policy);
                }
                // A leaf that limits nothing still stops the walk.
                None if d.descriptors.is_empty() => {
                    let name = self.name(path);
                    let mut policy = self.node(&name, path);
                    policy["limits"] = json!([]);
                    self.policies.push(policy);
                }
                None => {}
            }
            self.level(&d.descriptors, &format!("{at}.descriptors"), path)?;
            path.pop();
        }
        Ok(())
    }

    /// The policy of a node with a `rate_limit`.
    fn policy(
        &mut self,
        d: &Descriptor,
        rate: &RateLimit,
        at: &str,
        path: &[Step<'_>],
    ) -> anyhow::Result<Value> {
        // The limit's name names the policy when it can (in Sluice's
        // metrics); the answer names it by `limit_name` either way.
        let name = match rate.name.as_deref() {
            Some(n) if sluice_policies::PolicyName::new(n).is_some() && !self.names.contains(n) => {
                self.names.insert(n.to_string());
                n.to_string()
            }
            _ => self.name(path),
        };
        let mut policy = self.node(&name, path);
        policy["limit_name"] = json!(rate.name.clone().unwrap_or_default());
        if let Some(levels) = descriptor_metric(d.detailed_metric, path) {
            policy["descriptor_metric"] = json!(levels);
        }
        if !rate.replaces.is_empty() {
            let replaced: Vec<&str> = rate.replaces.iter().map(|r| r.name.as_str()).collect();
            if replaced.iter().any(|r| r.is_empty()) {
                bail!("{at}.rate_limit.replaces: an empty name");
            }
            if replaced.iter().any(|r| Some(*r) == rate.name.as_deref()) {
                bail!("{at}.rate_limit.replaces: names its own limit");
            }
            policy["replaces"] = json!(replaced);
        }
        let window = rate.unit.as_deref().map(|u| window(&u.to_ascii_uppercase()));
        if rate.unlimited {
            if let Some(Some(_)) = window {
                bail!(
                    "{at}.rate_limit: an unlimited limit has no unit (envoyproxy/ratelimit refuses it too)"
                );
            }
            policy["unlimited"] = json!(true);
            return Ok(policy);
        }
        let Some(Some(window)) = window else {
            bail!(
                "{at}.rate_limit.unit: {:?} is not a unit (second, minute, hour, day, week, month, year)",
                rate.unit
            );
        };
        if d.shadow_mode {
            policy["shadow"] = json!(true);
        }
        if d.quota_mode {
            policy["quota"] = json!(true);
        }
        if let Some(metadata) = &d.metadata {
            let metadata = serde_json::to_value(metadata)
                .ok()
                .filter(Value::is_object)
                .with_context(|| format!("{at}.metadata: not a map of JSON values"))?;
            policy["metadata"] = metadata;
        }
        if rate.requests_per_unit == 0 {
            policy["blocked"] = json!(window);
        } else {
            policy["limits"] =
                json!([{"type": "fixed_window", "limit": rate.requests_per_unit, "window": window}]);
        }
        Ok(policy)
    }

    /// A policy at the end of `path`: its match and key.
    fn node(&self, name: &str, path: &[Step<'_>]) -> Value {
        let steps: Vec<Value> = path
            .iter()
            .map(|s| match s.value {
                Some(v) => json!({"key": s.key, "value": v}),
                None => json!({"key": s.key}),
            })
            .collect();
        let key: Vec<String> = path.iter().filter(|s| s.keyed).map(|s| format!("entry:{}", s.key)).collect();
        let mut policy = json!({"name": name, "match": {"domain": self.domain, "descriptor_tree": steps}});
        if !key.is_empty() {
            policy["key"] = json!(key);
        }
        policy
    }

    /// The policy's name, made of the domain and the path (never answered:
    /// the answer names the limit by `limit_name`): 1 to 64 of
    /// `A-Z a-z 0-9 _ -`, unique in the document.
    fn name(&mut self, path: &[Step<'_>]) -> String {
        let mut parts = vec![self.domain];
        for s in path {
            parts.push(s.key);
            parts.extend(s.value);
        }
        let raw = parts.join("_");
        let mut base: String = raw
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
            .collect();
        base.truncate(56);
        let mut name = base.clone();
        let mut n = 2;
        while self.names.contains(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        self.names.insert(name.clone());
        name
    }
}

/// How the stats of a rule at the end of `path` are named, as the
/// policy's `descriptor_metric`: with `detailed_metric` every value
/// (`share_threshold` wildcards as written), else with `value_to_metric`
/// on some level the values of those levels; `None` when the stats are
/// named by the path as written (the policy's own metrics).
fn descriptor_metric(detailed: bool, path: &[Step<'_>]) -> Option<Vec<&'static str>> {
    let shown = |s: &Step<'_>| if s.shared { "step" } else { "value" };
    if detailed {
        return Some(path.iter().map(shown).collect());
    }
    let open = |s: &Step<'_>| s.value.is_none_or(|v| v.contains('*')) && !s.shared;
    path.iter()
        .any(|s| s.value_to_metric && open(s))
        .then(|| path.iter().map(|s| if s.value_to_metric { shown(s) } else { "step" }).collect())
}

/// A unit as a window, as envoyproxy/ratelimit divides time.
fn window(unit: &str) -> Option<&'static str> {
    let table: BTreeMap<&str, &str> = [
        ("SECOND", "1s"),
        ("MINUTE", "1m"),
        ("HOUR", "1h"),
        ("DAY", "1d"),
        ("WEEK", "7d"),
        ("MONTH", "30d"),
        ("YEAR", "365d"),
    ]
    .into_iter()
    .collect();
    table.get(unit).copied()
}
