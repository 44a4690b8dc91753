//! A Limitador limits file as a policy document.
//!
//! Each limit is one RLS-face policy: `namespace` its `domain`,
//! `max_value` per `seconds` a `fixed_window` whose window starts at its
//! counter's first hit (`start: first_hit`, as Limitador's counter expires
//! `seconds` after the hit that created it; `max_value: 0` is `blocked`), `name` the answer's `limit_name`. Limitador evaluates each
//! limit once per call against `descriptors[N]`: the policy reads the
//! descriptor at that position alone (`descriptor_index`), 0 when the limit
//! names none. Its conditions, all of which must hold:
//!
//! - `descriptors[N]['k'] == 'v'` (or `descriptors[N].k`, either quote):
//!   `entries: {"k": {"equals": "v"}}`;
//! - `descriptors[N]['k'] != 'v'`: the entry present, and a `bypass` on
//!   `equals` (Limitador's condition on a missing entry is false);
//!
//! anything else (other operators, functions, `&&`, `||`, escapes) is
//! refused with the condition named. Each variable `descriptors[N]['k']`
//! is a key source `entry:k`, and a descriptor without it is skipped
//! (`on_missing_key: skip`), as Limitador skips a limit whose variables do
//! not resolve. Every matching limit applies, and one call is charged all
//! or none (`charge: all_or_none`), as Limitador's check-and-update; a key a
//! descriptor carries twice reads its last value (`repeated_entry: last`),
//! as Limitador reads a descriptor into a map; and the answer is the
//! overall code alone (`statuses: overall`), as Limitador's.

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{lines_of, Loss};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Limit {
    #[serde(default)]
    id: Option<String>,
    namespace: String,
    max_value: u64,
    seconds: u64,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    conditions: Option<Vec<String>>,
    #[serde(default)]
    variables: Option<Vec<String>>,
}

/// The document and the losses (none: every limit is carried or refused).
pub fn convert(yaml: &str) -> anyhow::Result<(Value, Vec<Loss>)> {
    let limits: Vec<Limit> = serde_norway::from_str(yaml).context("not a Limitador limits file")?;
    let lines = lines_of(yaml, "namespace");
    let mut policies = Vec::with_capacity(limits.len());
    let losses = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for (i, limit) in limits.iter().enumerate() {
        let at = format!("[{i}]");
        let line = lines.get(i).copied().filter(|_| lines.len() == limits.len());
        let policy = policy(limit, &at, &mut names).with_context(|| match line {
            Some(line) => format!("line {line}: {at}"),
            None => at.clone(),
        })?;
        policies.push(policy);
    }
    Ok((
        json!({
            "charge": "all_or_none",
            "repeated_entry": "last",
            "statuses": "overall",
            "headers": "off",
            "policies": policies
        }),
        losses,
    ))
}

fn policy(limit: &Limit, at: &str, names: &mut std::collections::BTreeSet<String>) -> anyhow::Result<Value> {
    let _ = &limit.id; // an identifier of the limit: decides nothing
    if limit.namespace.is_empty() {
        bail!("namespace: must not be empty");
    }
    if limit.seconds == 0 || limit.seconds > 365 * 86_400 {
        bail!("seconds: {} is not 1 to {} (a year)", limit.seconds, 365 * 86_400);
    }
    let mut index = None;
    let mut same_index = |n: usize, what: &str| -> anyhow::Result<()> {
        match index.replace(n) {
            Some(m) if m != n => bail!(
                "{what}: reads descriptors[{n}] beside descriptors[{m}]; Sluice decides each descriptor on its own"
            ),
            _ => Ok(()),
        }
    };
    let mut entries = Map::new();
    let mut bypass = Vec::new();
    for (j, text) in limit.conditions.iter().flatten().enumerate() {
        let what = format!("conditions[{j}] {text:?}");
        let (n, key, equal, value) = condition(text).map_err(|why| anyhow::anyhow!("{what}: {why}"))?;
        same_index(n, &what)?;
        if equal {
            match entries.get(&key) {
                Some(other) if other != &json!({"equals": value}) && other != &json!({"present": true}) => {
                    bail!("{what}: a second condition on {key:?}: the limit could never apply")
                }
                _ => {}
            }
            entries.insert(key, json!({"equals": value}));
        } else {
            entries.entry(key.clone()).or_insert(json!({"present": true}));
            bypass.push(json!({"entries": {key: {"equals": value}}}));
        }
    }
    let mut key = Vec::new();
    for (j, text) in limit.variables.iter().flatten().enumerate() {
        let what = format!("variables[{j}] {text:?}");
        let (n, name) = variable(text).map_err(|why| anyhow::anyhow!("{what}: {why}"))?;
        same_index(n, &what)?;
        key.push(json!(format!("entry:{name}")));
    }
    // A `!=` on the value an `==` requires: the limit never applies.
    for b in &bypass {
        let (k, cond) = b["entries"]
            .as_object()
            .and_then(|m| m.iter().next())
            .map(|(k, v)| (k.clone(), v.clone()))
            .unwrap_or_default();
        if entries.get(&k) == Some(&cond) {
            bail!("conditions on {k:?} contradict each other: the limit could never apply");
        }
    }
    let name = unique(limit.name.as_deref(), &limit.namespace, at, names);
    let mut matcher = json!({"domain": limit.namespace, "descriptor_index": index.unwrap_or(0)});
    if !entries.is_empty() {
        matcher["entries"] = Value::Object(entries);
    }
    let mut policy =
        json!({"name": name, "match": matcher, "limit_name": limit.name.clone().unwrap_or_default()});
    if !bypass.is_empty() {
        policy["bypass"] = json!(bypass);
    }
    if !key.is_empty() {
        policy["key"] = json!(key);
        policy["on_missing_key"] = json!("skip");
    }
    let window = format!("{}s", limit.seconds);
    match u32::try_from(limit.max_value) {
        Ok(0) => policy["blocked"] = json!(window),
        Ok(n) => {
            policy["limits"] =
                json!([{"type": "fixed_window", "limit": n, "window": window, "start": "first_hit"}])
        }
        Err(_) => bail!("max_value: {} is more than {}", limit.max_value, u32::MAX),
    }
    Ok(policy)
}

/// A Limitador condition or variable that Sluice does not carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum NotCarried {
    #[error("not a condition Sluice carries: `descriptors[N]['key'] == 'value'` or `!=` (also `descriptors[N].key`, either quote)")]
    Condition,
    #[error("not a descriptor entry: expected `descriptors[N]['key']` or `descriptors[N].key`")]
    Entry,
}

/// `descriptors[N]['k'] OP 'v'`: (N, k, OP is `==`, v).
fn condition(text: &str) -> Result<(usize, String, bool, String), NotCarried> {
    let (op_at, equal) = match (text.find("=="), text.find("!=")) {
        (Some(i), None) => (i, true),
        (None, Some(i)) => (i, false),
        _ => return Err(NotCarried::Condition),
    };
    let (left, right) = (text[..op_at].trim(), text[op_at + 2..].trim());
    let (n, key) = variable(left)?;
    let value = literal(right).ok_or(NotCarried::Condition)?;
    Ok((n, key, equal, value))
}

/// `descriptors[N]['k']`, `descriptors[N]["k"]` or `descriptors[N].k`: (N, k).
fn variable(text: &str) -> Result<(usize, String), NotCarried> {
    let bad = || NotCarried::Entry;
    let rest = text.trim().strip_prefix("descriptors[").ok_or_else(bad)?;
    let close = rest.find(']').ok_or_else(bad)?;
    let n: usize = rest[..close].trim().parse().map_err(|_| bad())?;
    let rest = &rest[close + 1..];
    let key = if let Some(dotted) = rest.strip_prefix('.') {
        let ident = !dotted.is_empty()
            && dotted.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !dotted.starts_with(|c: char| c.is_ascii_digit());
        ident.then(|| dotted.to_string()).ok_or_else(bad)?
    } else {
        let inner = rest.strip_prefix('[').and_then(|r| r.strip_suffix(']')).ok_or_else(bad)?;
        literal(inner).ok_or_else(bad)?
    };
    if key.is_empty() || key.len() > sluice_policies::key::MAX_SOURCE_NAME_LEN {
        return Err(bad());
    }
    Ok((n, key))
}

/// A quoted string without escapes.
fn literal(text: &str) -> Option<String> {
    let text = text.trim();
    let quote = text.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let inner = text.strip_prefix(quote)?.strip_suffix(quote)?;
    (!inner.contains(quote) && !inner.contains('\\')).then(|| inner.to_string())
}

/// The limit's name if it is a valid policy name not taken, else one made
/// of the namespace and its position.
fn unique(
    given: Option<&str>,
    namespace: &str,
    at: &str,
    names: &mut std::collections::BTreeSet<String>,
) -> String {
    let taken = |n: &str, names: &std::collections::BTreeSet<String>| {
        sluice_policies::PolicyName::new(n).is_none() || names.contains(n)
    };
    let mut name = match given {
        Some(n) if !taken(n, names) => n.to_string(),
        _ => {
            let mut base: String = format!("{namespace}_{}", at.trim_matches(['[', ']']))
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
                .collect();
            base.truncate(56);
            base
        }
    };
    let base: String = name.chars().take(56).collect();
    let mut n = 2;
    while taken(&name, names) {
        name = format!("{base}-{n}");
        n += 1;
    }
    names.insert(name.clone());
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_and_variables_of_the_documented_forms() {
        assert_eq!(
            condition("descriptors[0]['req.method'] == 'GET'"),
            Ok((0, "req.method".into(), true, "GET".into()))
        );
        assert_eq!(
            condition("descriptors[0].req_method != \"GET\""),
            Ok((0, "req_method".into(), false, "GET".into()))
        );
        assert_eq!(variable("descriptors[1]['user_id']"), Ok((1, "user_id".into())));
        assert_eq!(variable("descriptors[0].user_id"), Ok((0, "user_id".into())));
        for bad in [
            "descriptors[0]['a'] == 'x' && descriptors[0]['b'] == 'y'",
            "descriptors[0]['a'].startsWith('x')",
            "'x' in descriptors[0]",
            "descriptors[0]['a'] == 'x\\'y'",
            "req.method == GET",
        ] {
            assert!(condition(bad).is_err(), "{bad}");
        }
    }
}
