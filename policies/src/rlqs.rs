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
//! refused at load time unless Envoy can enforce it exactly:
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

use crate::condition::Condition;
use crate::document::{grpc_face_fits, RawPolicy};
use crate::key::KeySource;
use crate::leased::Leased;
use crate::limit::WireLimit;
use crate::units::MAX_DURATION_MS;
use crate::{Document, Limit, Policy, Request};

/// How the messages name an RLQS-face policy.
const RLQS: &str = "an RLQS-face policy (its `match` names `bucket`)";

/// Whether an RLQS-face policy can be enforced by Envoy's filter; or why not.
pub(crate) fn fits(raw: &RawPolicy, matcher: &Condition) -> Result<(), String> {
    grpc_face_fits(raw, RLQS)?;
    if raw.shadow {
        return Err(format!(
            "{RLQS} cannot be `shadow`: Envoy enforces its assignments itself and reports no would-deny (preview a bucket with the matcher's `keep_matching` instead)"
        ));
    }
    let conditions = std::iter::once(("match", matcher)).chain(raw.bypass.iter().map(|b| ("bypass", b)));
    for (place, condition) in conditions {
        if let Some(field) = condition.http_field() {
            return Err(format!(
                "{RLQS} cannot read `{field}` in its `{place}`: an RLQS bucket has only a domain and a bucket id (`bucket`)"
            ));
        }
    }
    if let Some(source) = raw.key.iter().find(|s| !matches!(s, KeySource::Bucket(_))) {
        return Err(format!(
            "{RLQS} takes its key from the bucket id (\"bucket:NAME\"), not from key source \"{source}\""
        ));
    }
    if raw.unlimited {
        return match raw.leased {
            Some(_) => Err("an `unlimited` policy has no `leased`: it limits nothing".to_string()),
            None => Ok(()),
        };
    }
    match raw.limits.as_slice() {
        [Limit::FixedWindow { window, .. }] if window.as_millis() >= MAX_DURATION_MS => {
            return Err(format!(
                "{RLQS} needs a window shorter than 365d (limits[0] is {window}): Envoy refills a token bucket by at least one token a year"
            ))
        }
        [Limit::FixedWindow { .. }] => {}
        [other] => {
            return Err(format!(
                "{RLQS} can enforce only a fixed_window limit (limits[0] is a {}): Envoy spends an assignment's tokens anywhere in the window they were charged to",
                other.type_name()
            ))
        }
        many => {
            return Err(format!(
                "{RLQS} takes exactly one limit, a fixed_window (it has {}): Envoy enforces one token bucket per bucket",
                many.len()
            ))
        }
    }
    match raw.leased {
        None => Err(format!(
            "{RLQS} needs `leased` (e.g. {{\"tokens\": 100, \"ttl\": \"5s\"}}): the tokens of each assignment Envoy spends locally, and how long it lives"
        )),
        Some(lease) if lease.ttl_ms() % 1000 != 0 => Err(format!(
            "`leased.ttl` {}ms of {RLQS} is not a whole number of seconds: Envoy reads an assignment's time to live in whole seconds",
            lease.ttl_ms()
        )),
        Some(_) => Ok(()),
    }
}

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
/// ignored.
pub fn govern(doc: &Document, req: &impl Request) -> (Governed, Vec<String>) {
    let evaluation = match doc.evaluate(req) {
        Ok(evaluation) => evaluation,
        Err(policy) => {
            return (Governed::MissingKey { policy: policy.name.as_str().to_string() }, Vec::new())
        }
    };
    let mut applied = evaluation.iter();
    let Some(first) = applied.next() else { return (Governed::Unmatched, Vec::new()) };
    let ignored = applied.map(|a| a.policy.name.as_str().to_string()).collect();
    (of(first.policy, &first.key), ignored)
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
