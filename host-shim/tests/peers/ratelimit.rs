//! A model of envoyproxy/ratelimit's decision, written from its README and
//! its documented rules (not from Sluice's code), for the differential
//! tests (`host-shim/tests/rls_peers.rs`, and through Envoy
//! `tests/e2e/tests/envoy_rls.rs`).

use std::collections::HashMap;

use serde::Deserialize;

/// RLS codes.
pub const OK: i32 = 1;
pub const OVER: i32 = 2;

/// What a model answers, as compared: overall code, and per descriptor its
/// code and `(name, requests_per_unit, unit, remaining, reset seconds)`
/// (`None`: no `current_limit`); `limit_remaining` of the statuses without
/// a limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub overall: i32,
    pub statuses: Vec<(i32, Option<Shown>)>,
    pub bare_remaining: Vec<u32>,
}

/// A status's limit: `(name, requests_per_unit, unit, remaining, reset seconds)`.
pub type Shown = (String, u32, i32, u32, i64);

/// The node a descriptor reaches, and each level's shared pattern.
type Found<'c> = Option<(&'c Node, Vec<Option<String>>)>;

/// A call: its descriptors, each a list of entries.
pub type Call = Vec<Vec<(String, String)>>;

// The rules: the descriptor tree walked most specific first (key_value, then
// the first matching wildcard, then the bare key), no going back, the limit
// of the node at the last entry; `replaces` by name over the whole call;
// `unlimited` (OK, remaining MaxUint32); each descriptor's counter (domain,
// the entries' values, a shared wildcard's pattern) incremented by the
// call's hits (`hits_addend`, 0 read as 1) whatever the others say, and
// whatever its own answer (a refused call's hits are counted too, past the
// limit), over when the count passes `requests_per_unit`; shadow
// answered OK with its limit; the reset the seconds to the unit's end; a
// `quota_mode` descriptor over is answered over, the call over only when a
// descriptor not in quota mode is over or every quota-mode descriptor of
// the call is (a shadow one never is; unlimited, replaced and unmatched
// descriptors and a descriptor's own limit are not in quota mode).

#[derive(Debug, Deserialize)]
pub struct Config {
    domain: String,
    descriptors: Vec<Node>,
}

#[derive(Debug, Deserialize)]
struct Node {
    key: String,
    value: Option<String>,
    rate_limit: Option<Rate>,
    #[serde(default)]
    descriptors: Vec<Node>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    share_threshold: bool,
}

#[derive(Debug, Deserialize)]
struct Rate {
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<Replaces>,
}

#[derive(Debug, Deserialize)]
struct Replaces {
    name: String,
}

fn glob(pattern: &str, value: &str) -> bool {
    // Each `*` any run of characters: a plain recursive match.
    match pattern.split_once('*') {
        None => pattern == value,
        Some((head, tail)) => {
            value.starts_with(head)
                && (0..=value.len() - head.len())
                    .any(|i| value.is_char_boundary(head.len() + i) && glob(tail, &value[head.len() + i..]))
        }
    }
}

pub struct Ratelimit {
    config: Config,
    counters: HashMap<String, u64>,
}

impl Ratelimit {
    /// The model of a configuration (YAML).
    pub fn new(yaml: &str) -> Ratelimit {
        Ratelimit {
            config: serde_norway::from_str(yaml).expect("the model's configuration"),
            counters: HashMap::new(),
        }
    }
}

impl Ratelimit {
    /// The node a descriptor reaches, and each level's shared pattern.
    fn find<'c>(config: &'c Config, entries: &[(String, String)]) -> Found<'c> {
        let mut level = &config.descriptors;
        let mut shared = Vec::new();
        for (i, (k, v)) in entries.iter().enumerate() {
            let full = format!("{k}_{v}");
            let node = level
                .iter()
                .find(|n| n.key == *k && n.value.as_deref() == Some(v.as_str()) && !v.contains('*'))
                .or_else(|| {
                    level.iter().find(|n| {
                        n.value
                            .as_deref()
                            .is_some_and(|p| p.contains('*') && glob(&format!("{}_{p}", n.key), &full))
                    })
                })
                .or_else(|| level.iter().find(|n| n.key == *k && n.value.is_none()))?;
            shared.push(node.share_threshold.then(|| node.value.clone().unwrap_or_default()));
            if i + 1 == entries.len() {
                return Some((node, shared));
            }
            if node.descriptors.is_empty() {
                return None;
            }
            level = &node.descriptors;
        }
        None
    }

    /// The answer to a call of `hits` (its `hits_addend`, 0 read as 1).
    pub fn decide_hits(&mut self, call: &Call, now_s: u64, hits: u64) -> Answer {
        let hits = hits.max(1);
        let (call, limits) = split_limits(call);
        let call = &call;
        let (config, counters) = (&self.config, &mut self.counters);
        let found: Vec<Found<'_>> = call.iter().map(|d| Ratelimit::find(config, d)).collect();
        let replacing: Vec<String> = found
            .iter()
            .zip(&limits)
            .filter_map(|(f, l)| f.as_ref().filter(|_| l.is_none()))
            .filter_map(|(n, _)| n.rate_limit.as_ref())
            .flat_map(|r| r.replaces.iter().map(|x| x.name.clone()))
            .collect();
        let mut out = Answer { overall: OK, statuses: Vec::new(), bare_remaining: Vec::new() };
        let mut charges = Vec::new();
        // Each quota-mode descriptor's code.
        let mut quotas = Vec::new();
        for ((d, found), limit) in call.iter().zip(found).zip(&limits) {
            if let Some((requests_per_unit, unit_name)) = limit {
                let status =
                    overridden(config, counters, d, found, (*requests_per_unit, unit_name), now_s, hits);
                if status.0 == OVER {
                    out.overall = OVER;
                }
                out.statuses.push(status);
                continue;
            }
            let Some((node, shared)) = found else {
                out.statuses.push((OK, None));
                out.bare_remaining.push(0);
                continue;
            };
            let Some(rate) = &node.rate_limit else {
                out.statuses.push((OK, None));
                out.bare_remaining.push(0);
                continue;
            };
            let name = rate.name.clone().unwrap_or_default();
            if !name.is_empty() && replacing.contains(&name) {
                out.statuses.push((OK, None));
                out.bare_remaining.push(0);
                continue;
            }
            if rate.unlimited {
                out.statuses.push((OK, None));
                out.bare_remaining.push(u32::MAX);
                continue;
            }
            let (divider, unit) = unit(rate.unit.as_deref().unwrap_or_default());
            let mut key = format!("{}|", config.domain);
            for ((k, v), shared) in d.iter().zip(&shared) {
                key.push_str(&format!("{k}={}|", shared.as_deref().unwrap_or(v)));
            }
            key.push_str(&format!("{:?}|{divider}|{}", node as *const Node, now_s / divider));
            charges.push(key.clone());
            let count = counters.entry(key).or_default();
            *count += hits;
            let over = *count > u64::from(rate.requests_per_unit);
            let remaining = if over { 0 } else { rate.requests_per_unit - *count as u32 };
            let reset = (divider - now_s % divider) as i64;
            let code = if over && !node.shadow_mode { OVER } else { OK };
            if node.quota_mode {
                quotas.push(code);
            } else if code == OVER {
                out.overall = OVER;
            }
            out.statuses.push((code, Some((name, rate.requests_per_unit, unit, remaining, reset))));
        }
        if !quotas.is_empty() && quotas.iter().all(|&c| c == OVER) {
            out.overall = OVER;
        }
        out
    }
}

/// The entry that stands, in a model's call, for the descriptor's own
/// `limit` (Envoy's override): `"N/UNIT"`, the descriptor's last entry.
pub const LIMIT: &str = "@limit";

/// The call without its [`LIMIT`] entries, and each descriptor's limit.
fn split_limits(call: &Call) -> (Call, Vec<Option<(u32, String)>>) {
    call.iter()
        .map(|d| match d.split_last() {
            Some(((k, v), rest)) if k == LIMIT => {
                let (n, unit) = v.split_once('/').expect("N/UNIT");
                (rest.to_vec(), Some((n.parse().expect("a number"), unit.to_string())))
            }
            _ => (d.clone(), None),
        })
        .unzip()
}

/// A descriptor's own limit (envoyproxy/ratelimit's `GetLimit` with an
/// override): its number per its unit alone, whatever the tree says,
/// unnamed, never shadow, no `replaces` either way; counted on the
/// descriptor's counter (domain, the entries' own values, the unit's
/// window: the node is a function of the entries, so its rule of the same
/// unit counts on it too). The peer's key holds the window's start and not
/// its unit, so two units' windows that start at the same second share it
/// there; these runs never reach such a second.
fn overridden(
    config: &Config,
    counters: &mut HashMap<String, u64>,
    d: &[(String, String)],
    found: Found<'_>,
    (requests_per_unit, unit_name): (u32, &str),
    now_s: u64,
    hits: u64,
) -> (i32, Option<Shown>) {
    let (divider, unit) = unit(unit_name);
    let mut key = format!("{}|", config.domain);
    for (k, v) in d {
        key.push_str(&format!("{k}={v}|"));
    }
    let node = found.map_or(std::ptr::null(), |(n, _)| n as *const Node);
    key.push_str(&format!("{node:?}|{divider}|{}", now_s / divider));
    let count = counters.entry(key).or_default();
    *count += hits;
    let over = *count > u64::from(requests_per_unit);
    let remaining = if over { 0 } else { requests_per_unit - *count as u32 };
    let reset = (divider - now_s % divider) as i64;
    (if over { OVER } else { OK }, Some((String::new(), requests_per_unit, unit, remaining, reset)))
}

/// A unit's divider in seconds and its protobuf number.
pub fn unit(name: &str) -> (u64, i32) {
    match name {
        "day" => (86_400, 4),
        "week" => (7 * 86_400, 7),
        "month" => (30 * 86_400, 5),
        "year" => (365 * 86_400, 6),
        other => panic!("the model's configurations use day and longer units, not {other}"),
    }
}

/// The configuration the differential runs use: every rule of the README
/// at once, in day and longer units.
pub const RATELIMIT: &str = r#"
domain: edge
descriptors:
  - key: plan
    rate_limit: {name: plan, unit: day, requests_per_unit: 6}
  - key: plan
    value: pro
    rate_limit: {name: pro, unit: day, requests_per_unit: 9}
  - key: plan
    value: internal
    rate_limit: {unlimited: true}
  - key: plan
    value: free
  - key: ip
    rate_limit: {unit: month, requests_per_unit: 5}
  - key: ip
    value: 10.0.0.66
    rate_limit: {name: blocked, unit: day, requests_per_unit: 0}
  - key: path
    value: /api/*/action
    rate_limit: {unit: year, requests_per_unit: 4}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {name: api, unit: day, requests_per_unit: 7}
  - key: org
    descriptors:
      - key: user
        rate_limit: {name: base, unit: day, requests_per_unit: 3}
      - key: user
        value: vip
        rate_limit: {unit: week, requests_per_unit: 8, replaces: [{name: plan}]}
  - key: org
    value: acme
    descriptors:
      - key: user
        value: alice
        shadow_mode: true
        rate_limit: {name: trial, unit: day, requests_per_unit: 2}
  - key: team
    rate_limit: {unit: day, requests_per_unit: 4, replaces: [{name: base}]}
  - key: quota
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: quota
    value: shadow
    quota_mode: true
    shadow_mode: true
    rate_limit: {name: trial_quota, unit: day, requests_per_unit: 1}
  - key: credits
    quota_mode: true
    rate_limit: {name: credits, unit: week, requests_per_unit: 5}
"#;
