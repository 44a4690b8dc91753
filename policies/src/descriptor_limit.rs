//! RLS face: a descriptor's own `limit` (Envoy's rate limit override, which
//! a route's `rate_limits[].limit.dynamic_metadata` sets), and the
//! document's `descriptor_limit` setting that says whether it counts.
//!
//! `ignore` (the default): the policies hold the limits. `honour`, as
//! envoyproxy/ratelimit (its `GetLimit` and cache key):
//!
//! - in a domain the document has RLS policies for, a descriptor with a
//!   `limit` is limited by it alone, `requests_per_unit` per `unit`, a
//!   window aligned to the epoch; whatever the policies would make of the
//!   descriptor is not consulted (no policy, `unlimited`, `shadow`,
//!   `blocked`, a higher or a lower limit alike). In another domain it is
//!   ignored, and the descriptor has no limit;
//! - the limit has no name (`current_limit.name` is `""`), is never shadow,
//!   replaces nothing, and no `replaces` drops it;
//! - its counter is the descriptor's, whatever `requests_per_unit` says: a
//!   descriptor tree's node whose key reads every entry the node does not
//!   fix lends its own counter (the node's rule and the override of the
//!   same unit count together, as the peer's key is the domain, the entries
//!   and the window); any other descriptor counts on a counter of its domain
//!   and entries. Another unit is another window, another counter;
//! - `requests_per_unit: 0` refuses every request; an unknown unit is an
//!   invalid call.
//!
//! An override can admit what the policies would refuse (a raised limit, a
//! `blocked` value): it comes from Envoy's route configuration, which
//! whoever writes it already controls. Sluice's own documents ignore it
//! unless they say `honour`.

use crate::invalid::Invalid;
use crate::key::{self, KeySource};
use crate::tree::StepValue;
use crate::units::{Duration, PolicyName};
use crate::wire::{Check, WireLimit};
use crate::{Applied, Condition, DenyResponse, Document, Policy, Request};

/// The name an override's counters and metrics carry when no tree node
/// lends its own (its key, `!:…`, is none a policy's).
pub const NAME: &str = "descriptor-limit";

/// Whether a descriptor's own `limit` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum DescriptorLimitMode {
    /// The policies hold the limits.
    #[default]
    Ignore,
    /// As envoyproxy/ratelimit: the descriptor's `limit` alone decides it.
    Honour,
}

pub use crate::request::DescriptorLimit;
use crate::request::UNITS_MS;

/// The template policies an override is planned with: a limit, and a
/// `blocked` one per unit (for `requests_per_unit: 0`). Built once per
/// document; the check carries the number.
#[derive(Debug, Clone, PartialEq)]
pub struct Overrides {
    limited: Policy,
    blocked: Vec<Policy>,
}

impl Default for Overrides {
    fn default() -> Self {
        let windows = UNITS_MS.iter().filter_map(|&ms| Duration::from_millis(ms));
        Overrides { limited: template(None), blocked: windows.map(|w| template(Some(w))).collect() }
    }
}

fn template(blocked: Option<Duration>) -> Policy {
    Policy {
        name: PolicyName::new(NAME).unwrap_or_else(|| unreachable!("a valid name")),
        matcher: Condition::default(),
        bypass: Vec::new(),
        key: Vec::new(),
        on_missing_key: Default::default(),
        limits: Vec::new(),
        levels: Vec::new(),
        shadow: false,
        failure_mode: None,
        failure_status: None,
        response: DenyResponse::default(),
        wait: None,
        upstream: None,
        shed: None,
        leased: None,
        llm: None,
        budget: None,
        unlimited: false,
        blocked,
        limit_name: Some(String::new()),
        replaces: Vec::new(),
        descriptor_metric: None,
        quota: false,
        metadata: None,
    }
}

/// What an honoured override makes of one descriptor.
pub enum Planned<'d> {
    /// Refused, with no counter (`requests_per_unit: 0`).
    Blocked(&'d Policy),
    /// One check, of the template policy.
    Check(&'d Policy, Check),
}

/// The override of `req` (evaluated as `applied`, with its cost `hits`),
/// if `doc` honours it; `Err` for an unknown unit.
pub fn plan<'d>(
    doc: &'d Document,
    req: &impl Request,
    limit: Option<DescriptorLimit>,
    applied: &[Applied<'d>],
    hits: u32,
) -> Result<Option<Planned<'d>>, Invalid> {
    let Some(limit) = limit.filter(|_| doc.descriptor_limit == DescriptorLimitMode::Honour) else {
        return Ok(None);
    };
    if !req.domain().is_some_and(|d| serves(doc, d)) {
        return Ok(None);
    }
    let Some(window) = limit.window else {
        return Err(Invalid::at("limit.unit", "unknown (expected SECOND to YEAR)"));
    };
    if limit.requests_per_unit == 0 {
        let blocked = doc.overrides.blocked.iter().find(|p| p.blocked == Some(window));
        return Ok(blocked.map(Planned::Blocked));
    }
    let (policy, key) = counter(req, applied);
    let check = Check {
        policy,
        key,
        limits: vec![WireLimit::FixedWindow {
            limit: limit.requests_per_unit,
            window_ms: window.to_millis(),
            cost: hits,
        }],
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    };
    Ok(Some(Planned::Check(&doc.overrides.limited, check)))
}

/// Whether `doc` has RLS policies for `domain` (naming it, or no domain).
fn serves(doc: &Document, domain: &[u8]) -> bool {
    doc.policies.iter().any(|p| {
        p.matcher.face() == crate::Face::Rls
            && p.matcher.domain.as_deref().is_none_or(|d| d.as_bytes() == domain)
    })
}

/// The counter an override counts on: the tree node's that `req` reached
/// when that node's key reads every entry its path does not fix, in order
/// (so the node's rule of the same unit counts on it too); else one of
/// the domain and every entry.
fn counter(req: &impl Request, applied: &[Applied<'_>]) -> (String, String) {
    let node = applied.iter().find(|a| {
        let Some(path) = &a.policy.matcher.descriptor_tree else { return false };
        let open = path.iter().filter(|s| !matches!(s.value, StepValue::Exact(_)));
        let reads: Vec<KeySource> = open.map(|s| KeySource::Entry(s.key.clone())).collect();
        a.policy.levels.is_empty() && a.policy.key == reads
    });
    if let Some(node) = node {
        return (node.policy.state_name().to_string(), node.key.clone());
    }
    let mut whole = req.domain().unwrap_or_default().to_vec();
    for (k, v) in req.entries() {
        whole.push(0);
        whole.extend_from_slice(k.as_bytes());
        whole.push(0);
        whole.extend_from_slice(v);
    }
    (NAME.to_string(), format!("{}:{}", key::MISSING, key::encode(&whole)))
}
