//! The RLQS face in the policy language: which policies Envoy's
//! `rate_limit_quota` filter can enforce, and which one governs a bucket.
//!
//! ```json
//! {"name": "per-client",
//!  "match": {"domain": "edge", "bucket": {"client": {"present": true}}},
//!  "key": ["bucket:client"],
//!  "leased": {"tokens": 100, "ttl": "5s"},
//!  "limits": [{"type": "fixed_window", "limit": 6000, "window": "1m"}]}
//! ```
//!
//! A policy whose `match` names `bucket` is an *RLQS-face* policy: only the
//! buckets an RLQS stream reports reach it (their domain and bucket id, the
//! map Envoy's `bucket_id_builder` builds), and its key reads the bucket id
//! (`bucket:NAME`). Envoy enforces each bucket itself, from an assignment
//! (a token bucket, `deny_all` or `allow_all`) that spends locally: the
//! same job as leased mode, so such a policy is a leased window. It is
//! refused at load time (`crate::face::rlqs_fits`) unless Envoy can
//! enforce it exactly:
//!
//! - exactly one `fixed_window` (an assignment's tokens are spent anywhere
//!   in the window they were charged to; Envoy enforces one token bucket per
//!   bucket, and charges every request one token), shorter than 365 days
//!   (Envoy refills a token bucket at least one token a year);
//! - `leased` (the tokens of one assignment and its time to live, in whole
//!   seconds as Envoy reads it), unless `unlimited`;
//! - no `shadow` (Envoy reports no would-deny), and none of what no gRPC
//!   face can use (`concurrency`, `wait`, `upstream`, `shed`,
//!   `actual_cost_header`);
//! - a `match` and `bypass` reading only `domain`, `bucket` and `keys`, and
//!   a key only from `bucket:NAME`: a bucket has nothing else.

use crate::leased::Leased;
use crate::limit::WireLimit;
use crate::plan::plan_evaluated;
use crate::{Document, Limit, Policy, Request};

/// What governs one RLQS bucket: the first RLQS-face policy, in document
/// order, that applies to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Governed {
    /// No policy applies: no limit (Envoy is told `allow_all`), counted.
    Unmatched,
    /// An `unlimited` policy: `allow_all`, counted.
    Unlimited { policy: String },
    /// A policy with `on_missing_key: deny` whose key the bucket id lacks:
    /// `deny_all`.
    MissingKey { policy: String },
    /// A leased window, on this encoded key.
    Leased(Window),
}

/// A leased window an RLQS bucket spends: the lease calls' policy, key and
/// limit (`wire::LeaseRequest`), and the size and life of each assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub policy: String,
    pub key: String,
    /// The policy's `fixed_window`.
    pub limit: WireLimit,
    pub lease: Leased,
}

impl Window {
    /// The window's limit.
    pub fn limit(&self) -> u64 {
        match self.limit {
            WireLimit::FixedWindow { limit, .. } => u64::from(limit),
            _ => 0,
        }
    }

    /// An assignment's longest time to live, in whole seconds (at least 1).
    pub fn ttl_s(&self) -> u64 {
        (self.lease.ttl_ms() / 1000).max(1)
    }
}

/// What governs the bucket `req` (an RLQS request: its domain and bucket
/// id), and the names of the other policies that apply to it too and are
/// ignored: a view of the request's plan ([`crate::plan`]).
pub fn govern(doc: &Document, req: &impl Request) -> (Governed, Vec<String>) {
    let evaluation = doc.evaluate(req);
    // One request reaches at most the checks the document's bounds allow:
    // its plan cannot fail; were it to, the bucket is denied.
    let planned = plan_evaluated(doc, [(req, None, &evaluation)]);
    let (plan, planned) = match &planned {
        Ok(plan) => match plan.descriptors.first() {
            Some(planned) => (plan, planned),
            None => return (Governed::Unmatched, Vec::new()),
        },
        Err(_) => {
            let first = evaluation.as_ref().ok().and_then(|e| e.first()).map(|a| a.policy.name.as_str());
            return (Governed::MissingKey { policy: first.unwrap_or_default().to_string() }, Vec::new());
        }
    };
    if let Some(policy) = planned.missing_key {
        return (Governed::MissingKey { policy: policy.name.as_str().to_string() }, Vec::new());
    }
    // The policies the plan decided, in document order: the first governs.
    let unlimited = planned.unlimited.iter().map(|p| (*p, None));
    let checked = planned.enforced.iter().filter_map(|&c| {
        Some((*plan.enforced.policies.get(c)?, Some(plan.enforced.checks.get(c)?.key.as_str())))
    });
    let mut decided: Vec<(&Policy, Option<&str>)> = unlimited.chain(checked).collect();
    decided.sort_by_key(|(p, _)| doc.index_of(p));
    let mut decided = decided.into_iter();
    let Some((first, key)) = decided.next() else { return (Governed::Unmatched, Vec::new()) };
    let ignored = decided.map(|(p, _)| p.name.as_str().to_string()).collect();
    (of(first, key.unwrap_or_default()), ignored)
}

fn of(policy: &Policy, key: &str) -> Governed {
    let name = policy.name.as_str().to_string();
    match (policy.unlimited, policy.leased, policy.limits.first()) {
        (true, _, _) => Governed::Unlimited { policy: name },
        (false, Some(lease), Some(limit @ Limit::FixedWindow { .. })) => Governed::Leased(Window {
            policy: name,
            key: key.to_string(),
            limit: WireLimit::with_cost(limit, 1),
            lease,
        }),
        // The parser admits no other RLQS-face policy.
        _ => Governed::MissingKey { policy: name },
    }
}
