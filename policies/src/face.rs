//! What each face can enforce of a policy, where it needs more than the
//! document's own checks: an RLQS-face policy (a `match` naming `bucket`,
//! see docs/rlqs.md) is refused at load time unless Envoy's
//! `rate_limit_quota` filter can enforce it exactly.

use crate::condition::Condition;
use crate::invalid::Invalid;
use crate::key::KeySource;
use crate::leased::Leased;
use crate::limit::WindowStart;
use crate::units::MAX_DURATION_MS;
use crate::Limit;

/// How the messages name an RLQS-face policy.
pub(crate) const RLQS: &str = "an RLQS-face policy (its `match` names `bucket`)";

/// What of a policy [`rlqs_fits`] judges.
pub(crate) struct Parts<'a> {
    pub(crate) matcher: &'a Condition,
    pub(crate) bypass: &'a [Condition],
    pub(crate) key: &'a [KeySource],
    pub(crate) limits: &'a [Limit],
    pub(crate) leased: Option<Leased>,
    pub(crate) shadow: bool,
    pub(crate) unlimited: bool,
}

/// Whether an RLQS-face policy can be enforced by Envoy's filter, beyond
/// what no gRPC face can (the document's checks); or why not.
pub(crate) fn rlqs_fits(raw: &Parts<'_>) -> Result<(), Invalid> {
    let matcher = raw.matcher;
    if raw.shadow {
        return Err(Invalid::new(format!(
            "{RLQS} cannot be `shadow`: Envoy enforces its assignments itself and reports no would-deny (preview a bucket with the matcher's `keep_matching` instead)"
        )));
    }
    let conditions = std::iter::once(("match", matcher)).chain(raw.bypass.iter().map(|b| ("bypass", b)));
    for (place, condition) in conditions {
        if let Some(field) = condition.http_field() {
            return Err(Invalid::new(format!(
                "{RLQS} cannot read `{field}` in its `{place}`: an RLQS bucket has only a domain and a bucket id (`bucket`)"
            )));
        }
    }
    if let Some(source) = raw.key.iter().find(|s| !matches!(s, KeySource::Bucket(_))) {
        return Err(Invalid::new(format!(
            "{RLQS} takes its key from the bucket id (\"bucket:NAME\"), not from key source \"{source}\""
        )));
    }
    if raw.unlimited {
        return match raw.leased {
            Some(_) => Err(Invalid::new("an `unlimited` policy has no `leased`: it limits nothing")),
            None => Ok(()),
        };
    }
    match raw.limits {
        [Limit::FixedWindow { window, .. }] if window.as_millis() >= MAX_DURATION_MS => {
            return Err(Invalid::new(format!(
                "{RLQS} needs a window shorter than 365d (limits[0] is {window}): Envoy refills a token bucket by at least one token a year"
            )))
        }
        [Limit::FixedWindow { start: WindowStart::FirstHit, .. }] => {
            return Err(Invalid::new(format!(
                "{RLQS} needs a fixed_window aligned to the epoch, not `start: first_hit`: its tokens are leased from a window named by its index since the epoch"
            )))
        }
        [Limit::FixedWindow { .. }] => {}
        [other] => {
            return Err(Invalid::new(format!(
                "{RLQS} can enforce only a fixed_window limit (limits[0] is a {}): Envoy spends an assignment's tokens anywhere in the window they were charged to",
                other.type_name()
            )))
        }
        many => {
            return Err(Invalid::new(format!(
                "{RLQS} takes exactly one limit, a fixed_window (it has {}): Envoy enforces one token bucket per bucket",
                many.len()
            )))
        }
    }
    match raw.leased {
        None => Err(Invalid::new(format!(
            "{RLQS} needs `leased` (e.g. {{\"tokens\": 100, \"ttl\": \"5s\"}}): the tokens of each assignment Envoy spends locally, and how long it lives"
        ))),
        Some(lease) if lease.ttl_ms() % 1000 != 0 => Err(Invalid::new(format!(
            "`leased.ttl` {}ms of {RLQS} is not a whole number of seconds: Envoy reads an assignment's time to live in whole seconds",
            lease.ttl_ms()
        ))),
        Some(_) => Ok(()),
    }
}
