//! `sluice import ratelimit-config.yaml`: an envoyproxy/ratelimit
//! configuration as a Sluice policy document, for the RLS face.
//!
//! Each descriptor level with a `rate_limit` (or `unlimited: true`) becomes
//! one gRPC-face policy: its `match` is the domain and the entries on the
//! path to it (`value` equal, a trailing `*` a prefix, no `value` present),
//! plus every other key of the configuration absent, so that a descriptor
//! with more entries goes to the deeper level's policy alone, as in
//! envoyproxy/ratelimit (which walks a descriptor's entries in order; Sluice
//! matches them in any order); its key is the entries
//! without a fixed value; its limit a `fixed_window` of `requests_per_unit`
//! per `unit` (envoyproxy/ratelimit counts fixed windows too). `shadow_mode`
//! becomes `shadow`, `unlimited` stays `unlimited`, the rate limit's `name`
//! names the policy.
//!
//! What cannot be carried over is returned as notes, each with why:
//! `replaces` (every matching Sluice policy applies), `detailed_metric`
//! (Sluice counts per policy, and the dashboard shows the busiest keys),
//! units without an exact window (`month`, `year`), fields it does not know.

use std::collections::BTreeMap;

use anyhow::Context;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Debug, Deserialize)]
struct Config {
    domain: String,
    #[serde(default)]
    descriptors: Vec<Descriptor>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
struct Descriptor {
    key: String,
    value: Option<String>,
    rate_limit: Option<RateLimit>,
    #[serde(default)]
    descriptors: Vec<Descriptor>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(flatten)]
    other: BTreeMap<String, serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
struct RateLimit {
    unit: Option<String>,
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<Replaces>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
struct Replaces {
    name: String,
}

/// The converted document, and what could not be carried over.
#[derive(Debug)]
pub struct Imported {
    pub document: Value,
    pub notes: Vec<String>,
}

pub fn run(path: &std::path::Path) -> anyhow::Result<Imported> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    convert(&text).with_context(|| path.display().to_string())
}

/// Converts the YAML text of one configuration.
pub fn convert(yaml: &str) -> anyhow::Result<Imported> {
    let config: Config = serde_norway::from_str(yaml).context("not an envoyproxy/ratelimit configuration")?;
    if config.domain.is_empty() {
        anyhow::bail!("domain: must not be empty");
    }
    let mut out = Imported { document: Value::Null, notes: Vec::new() };
    for key in config.other.keys() {
        out.notes.push(format!("{key}: not carried over: Sluice does not know this field"));
    }
    let mut keys = std::collections::BTreeSet::new();
    all_keys(&config.descriptors, &mut keys);
    let mut walk =
        Walk { domain: &config.domain, keys, policies: Vec::new(), names: Vec::new(), notes: out.notes };
    let mut path = Vec::new();
    for (i, d) in config.descriptors.iter().enumerate() {
        walk.level(d, &format!("descriptors[{i}]"), &mut path);
    }
    let Walk { policies, notes, .. } = walk;
    out.notes = notes;
    out.document = json!({"policies": policies});
    Ok(out)
}

/// Every descriptor key of the configuration, at any level.
fn all_keys<'a>(descriptors: &'a [Descriptor], out: &mut std::collections::BTreeSet<&'a str>) {
    for d in descriptors {
        out.insert(&d.key);
        all_keys(&d.descriptors, out);
    }
}

/// The conversion's state while it walks the descriptor tree.
struct Walk<'a> {
    domain: &'a str,
    keys: std::collections::BTreeSet<&'a str>,
    policies: Vec<Value>,
    names: Vec<String>,
    notes: Vec<String>,
}

impl<'a> Walk<'a> {
    fn level(&mut self, d: &'a Descriptor, at: &str, path: &mut Vec<&'a Descriptor>) {
        path.push(d);
        for key in d.other.keys() {
            self.notes.push(format!("{at}.{key}: not carried over: Sluice does not know this field"));
        }
        if let Some(policy) = policy(self.domain, d, at, path, &self.keys, &mut self.names, &mut self.notes) {
            self.policies.push(policy);
        }
        for (i, child) in d.descriptors.iter().enumerate() {
            self.level(child, &format!("{at}.descriptors[{i}]"), path);
        }
        path.pop();
    }
}

/// The policy of the level at the end of `path`, if it has a rate limit.
fn policy(
    domain: &str,
    d: &Descriptor,
    at: &str,
    path: &[&Descriptor],
    keys: &std::collections::BTreeSet<&str>,
    names: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Option<Value> {
    let Some(rate) = &d.rate_limit else {
        if d.shadow_mode || d.detailed_metric {
            notes.push(format!("{at}: no rate_limit: nothing to limit, no policy"));
        }
        return None;
    };
    let name = unique_name(rate.name.as_deref(), domain, path, names);
    for key in rate.other.keys() {
        notes.push(format!("{at}.rate_limit.{key}: not carried over: Sluice does not know this field"));
    }
    if !rate.replaces.is_empty() {
        let replaced: Vec<&str> = rate.replaces.iter().map(|r| r.name.as_str()).collect();
        notes.push(format!(
            "{at} ({name}): replaces {replaced:?} not carried over: every Sluice policy that matches a descriptor applies; give the replaced policies conditions that exclude these descriptors"
        ));
    }
    if d.detailed_metric {
        notes.push(format!(
            "{at} ({name}): detailed_metric not carried over: Sluice counts every policy's decisions, and the dashboard shows its busiest keys"
        ));
    }
    let mut entries = serde_json::Map::new();
    let mut key = Vec::new();
    for level in path {
        let cond = match level.value.as_deref() {
            None => {
                key.push(json!(format!("entry:{}", level.key)));
                json!({"present": true})
            }
            Some(v) if v.ends_with('*') => {
                key.push(json!(format!("entry:{}", level.key)));
                json!({"prefix": v.trim_end_matches('*')})
            }
            Some(v) => json!({"equals": v}),
        };
        entries.insert(level.key.clone(), cond);
    }
    for other in keys {
        entries.entry(other.to_string()).or_insert_with(|| json!({"present": false}));
    }
    let mut policy = json!({
        "name": name,
        "match": {"domain": domain, "entries": entries},
    });
    if !key.is_empty() {
        policy["key"] = json!(key);
    }
    if d.shadow_mode {
        policy["shadow"] = json!(true);
    }
    if rate.unlimited {
        policy["unlimited"] = json!(true);
        return Some(policy);
    }
    let unit = rate.unit.as_deref().unwrap_or_default().to_ascii_lowercase();
    let window = match unit.as_str() {
        "second" => "1s",
        "minute" => "1m",
        "hour" => "1h",
        "day" => "1d",
        "week" => "7d",
        other => {
            notes.push(format!(
                "{at} ({name}): unit {other:?} not carried over: Sluice's windows are exact durations up to 365d; the level has no policy"
            ));
            return None;
        }
    };
    let limit = rate.requests_per_unit.unwrap_or_default();
    if limit == 0 || limit > u64::from(u32::MAX) {
        notes.push(format!(
            "{at} ({name}): requests_per_unit {limit} not carried over: a Sluice limit is 1 to {}; the level has no policy",
            u32::MAX
        ));
        return None;
    }
    policy["limits"] = json!([{"type": "fixed_window", "limit": limit, "window": window}]);
    Some(policy)
}

/// The descriptor's `name` (or one made of the domain and the path), as a
/// policy name (1 to 64 of `A-Z a-z 0-9 _ -`), unique in the document.
fn unique_name(given: Option<&str>, domain: &str, path: &[&Descriptor], names: &mut Vec<String>) -> String {
    let made = || {
        let mut parts = vec![domain.to_string()];
        for level in path {
            parts.push(level.key.clone());
            parts.extend(level.value.clone());
        }
        parts.join("_")
    };
    let raw = given.map_or_else(made, str::to_string);
    let mut base: String = raw
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
        .collect();
    if base.is_empty() {
        base = "descriptor".to_string();
    }
    base.truncate(56);
    let mut name = base.clone();
    let mut n = 2;
    while names.contains(&name) {
        name = format!("{base}-{n}");
        n += 1;
    }
    names.push(name.clone());
    name
}
