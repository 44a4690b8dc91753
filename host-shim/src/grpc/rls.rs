//! The RLS face: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! what Envoy's native `envoy.filters.http.ratelimit` filter calls.
//!
//! Three steps, two of them plain functions:
//!
//! 1. [`decode`]: the request's `domain` and each descriptor's entries (in
//!    order, with its position) become one request per descriptor, with its
//!    cost (`hits_addend`, 0 meaning 1); a key given twice keeps its first
//!    value, or its last when the document's `repeated_entry` is `last`;
//!    its own `limit` (Envoy's override) is read too, and planned as the
//!    document's `descriptor_limit` says; a descriptor may have no entries
//!    (Envoy sends one where every action of a rate limit was skipped).
//!    Bounded: a malformed or oversized
//!    request is refused with `INVALID_ARGUMENT`, never a panic.
//! 2. [`plan`] (the one planning function, `sluice_policies::plan`): the
//!    policy document evaluates each descriptor; the checks of the enforced
//!    policies and of the shadow ones, grouped as the document's `charge`
//!    says; `unlimited`, `blocked`, `replaces` and tree nodes that limit
//!    nothing decided without a check. Each group is one decision of the
//!    limiter, in order: refused from memory when the over-limit cache
//!    holds a live denial for each of its checks ([`super::memory`]), else
//!    decided in Redis.
//! 3. [`answer`]: a view of the plan and the outcomes: OK or OVER_LIMIT per
//!    descriptor and overall (the plan's rule, `Plan::refuses`: quota
//!    descriptors refuse the call only all together); each descriptor's most restrictive limit
//!    (shadow ones too, as envoyproxy/ratelimit answers a shadow limit) as
//!    `current_limit`, `limit_remaining` and `duration_until_reset` (core's
//!    [`draft03`]: a refusing limit's read from its wait alone, so memory
//!    and Redis answer alike); and the IETF `RateLimit` and
//!    `RateLimit-Policy` headers (core's rendering) in
//!    `response_headers_to_add`, as the document's `headers` says, or with
//!    its `header_format` `draft_version_03` draft 03's over every limit
//!    the call met ([`x_ratelimit`]; memory is not asked then). The
//!    decisions of policies with a `descriptor_metric` are counted per
//!    descriptor too ([`count_descriptors`]); with the document's
//!    `dynamic_metadata`, the answer's `dynamic_metadata`
//!    ([`super::dynamic_metadata`]). The
//!    statuses are left out when the document's `statuses` is `overall`
//!    (Limitador's answer: the overall code alone).

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluice_core::ratelimit_headers::{draft03, most_restrictive, RateLimitHeaders};
use sluice_core::x_ratelimit;
use sluice_policies::algorithm::Refusals;
use sluice_policies::descriptor_limit::DescriptorLimit;
use sluice_policies::document::{RepeatedEntry, Statuses};
use sluice_policies::key::MAX_SOURCE_NAME_LEN;
use sluice_policies::request::SimpleRequest;
use sluice_policies::wire::{CheckOutcome, LimitOutcome, WireLimit};
use sluice_policies::{Document, HeaderFormat, HeadersMode, Invalid, Limit, Policy};
use tonic::{Request, Response, Status};

use super::Faces;
use crate::decision::CheckError;
use crate::metrics::Metrics;

/// The face's name in metrics (`face="rls"`).
pub const FACE: &str = "rls";
/// The most descriptors one request may carry: each may bring a check.
pub const MAX_DESCRIPTORS: usize = sluice_policies::tree::MAX_CALL_DESCRIPTORS;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;
/// The longest domain.
pub const MAX_DOMAIN_LEN: usize = 256;
/// The longest entry value.
pub const MAX_VALUE_LEN: usize = 1024;
/// The largest request message read: every bound above at its largest fits.
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

pub use sluice_policies::plan::{plan, Checks, Descriptor, Plan, Planned};

/// The request's descriptors, or why it is refused (`INVALID_ARGUMENT`).
pub fn decode(req: &RateLimitRequest) -> Result<Vec<Descriptor>, Invalid> {
    if req.domain.is_empty() || req.domain.len() > MAX_DOMAIN_LEN {
        return Err(Invalid::at(
            "domain",
            format!("expected 1 to {MAX_DOMAIN_LEN} bytes, got {}", req.domain.len()),
        ));
    }
    if req.descriptors.is_empty() || req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Invalid::at(
            "descriptors",
            format!("expected 1 to {MAX_DESCRIPTORS} descriptors, got {}", req.descriptors.len()),
        ));
    }
    let mut out = Vec::with_capacity(req.descriptors.len());
    for (i, d) in req.descriptors.iter().enumerate() {
        // No entries is a descriptor too: Envoy sends one, in its place,
        // where every action of a rate limit was skipped.
        if d.entries.len() > MAX_ENTRIES {
            return Err(Invalid::at(
                format!("descriptors[{i}].entries"),
                format!("expected at most {MAX_ENTRIES} entries, got {}", d.entries.len()),
            ));
        }
        if d.is_negative_hits {
            return Err(Invalid::at(
                format!("descriptors[{i}].is_negative_hits"),
                "not supported: Sluice's windows are not refilled by a descriptor",
            ));
        }
        let hits = d.hits_addend.as_ref().map_or(u64::from(req.hits_addend), |h| h.value);
        let hits = u32::try_from(hits)
            .map_err(|_| {
                Invalid::at(
                    format!("descriptors[{i}].hits_addend"),
                    format!("{hits} is more than {}", u32::MAX),
                )
            })?
            .max(1);
        let mut request = SimpleRequest::default().domain(&req.domain).index(i);
        for (j, entry) in d.entries.iter().enumerate() {
            if entry.key.is_empty() || entry.key.len() > MAX_SOURCE_NAME_LEN {
                return Err(Invalid::at(
                    format!("descriptors[{i}].entries[{j}].key"),
                    format!("expected 1 to {MAX_SOURCE_NAME_LEN} bytes, got {}", entry.key.len()),
                ));
            }
            if entry.value.len() > MAX_VALUE_LEN {
                return Err(Invalid::at(
                    format!("descriptors[{i}].entries[{j}].value"),
                    format!("at most {MAX_VALUE_LEN} bytes, got {}", entry.value.len()),
                ));
            }
            request = request.entry(&entry.key, &entry.value);
        }
        if let Some(limit) = &d.limit {
            request = request.limit(DescriptorLimit::new(limit.requests_per_unit, unit_ms(limit.unit)));
        }
        out.push(Descriptor { request, hits });
    }
    Ok(out)
}

/// Envoy's rate-limit units and their windows in ms, as envoyproxy/ratelimit
/// divides time (a month is 30 days, a year 365). The override's
/// `envoy.type.v3.RateLimitUnit` numbers them as the answer's `Unit` does.
const UNITS: [(Unit, u64); 7] = [
    (Unit::Second, 1_000),
    (Unit::Minute, 60_000),
    (Unit::Hour, 3_600_000),
    (Unit::Day, DAY_MS),
    (Unit::Week, 7 * DAY_MS),
    (Unit::Month, 30 * DAY_MS),
    (Unit::Year, 365 * DAY_MS),
];
const DAY_MS: u64 = 86_400_000;

/// The window of an RLS override's unit, in ms ([`UNITS`]).
fn unit_ms(unit: i32) -> Option<u64> {
    UNITS.iter().find(|(u, _)| *u as i32 == unit).map(|&(_, ms)| ms)
}

/// The outcomes of a plan's checks, one per check in order (`None`: the
/// plan had none).
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcomes<'a> {
    pub enforced: Option<&'a [CheckOutcome]>,
    pub shadow: Option<&'a [CheckOutcome]>,
}

/// The whole answer to `req`, a view of the plan and its checks' outcomes
/// at `now_ms` (a `blocked` policy's reset is read from it).
pub fn answer(
    doc: &Document,
    req: &RateLimitRequest,
    plan: &Plan<'_>,
    outcomes: Outcomes<'_>,
    now_ms: u64,
) -> RateLimitResponse {
    let mut statuses = Vec::with_capacity(plan.descriptors.len());
    let mut all = Vec::new();
    let mut counters = Vec::new();
    let mut overs = Vec::with_capacity(plan.descriptors.len());
    for planned in &plan.descriptors {
        let enforced = limits_of(&plan.enforced, &planned.enforced, outcomes.enforced);
        let shadow = limits_of(&plan.shadow, &planned.shadow, outcomes.shadow);
        let over = planned.refused() || enforced.iter().any(|(_, _, _, o)| !o.allowed);
        overs.push(over);
        let mut status = DescriptorStatus { code: code(over), ..DescriptorStatus::default() };
        let both: Vec<_> = enforced.iter().chain(&shadow).collect();
        // Chosen and shown as sent: a points limit with the call's cost.
        let named = both.iter().map(|&&(p, _, w, o)| (p.answer_name(), w, o));
        if let Some(policy) = planned.blocked_shown() {
            // A limit of 0: refused whatever any other limit says.
            let reset = sluice_policies::plan::blocked_reset_ms(policy, now_ms).unwrap_or(0);
            let window = policy.blocked.map(|w| w.as_millis());
            status.current_limit = Some(RateLimit {
                name: policy.answer_name().to_string(),
                requests_per_unit: 0,
                unit: unit(window, false) as i32,
            });
            status.duration_until_reset = Some(duration(reset));
        } else if let Some((name, wire, outcome)) = most_restrictive(named) {
            let limit =
                both.iter().find(|(_, _, _, o)| std::ptr::eq(*o, outcome)).and_then(|(_, l, _, _)| *l);
            status.current_limit = Some(rate_limit(name, wire, limit));
            let fields = draft03(wire, outcome);
            status.limit_remaining = u32::try_from(fields.remaining).unwrap_or(u32::MAX);
            status.duration_until_reset = Some(duration(fields.wait_ms));
        } else if !planned.unlimited.is_empty() {
            // envoyproxy/ratelimit: an unlimited descriptor has all it wants.
            status.limit_remaining = u32::MAX;
        }
        statuses.push(status);
        // Draft 03's headers alone list every limit: gathered only for them.
        if doc.header_format == HeaderFormat::DraftVersion03 {
            counters.extend(planned.blocked.iter().map(|p| blocked_counter(p, now_ms)));
            counters.extend(enforced.iter().map(|&(p, _, w, o)| counter(p, w, o)));
        }
        all.extend(enforced.into_iter().map(|(p, _, w, o)| (p.answer_name(), w, o)));
    }
    // Quota descriptors refuse the call only all together.
    let over = plan.refuses(&overs);
    let response_headers_to_add = match sluice_policies::plan::sends_headers(doc.headers, over) {
        false => Vec::new(),
        true => match doc.header_format {
            HeaderFormat::Ietf => RateLimitHeaders::most_restrictive(all)
                .map(|h| {
                    vec![
                        header(RateLimitHeaders::POLICY, h.policy),
                        header(RateLimitHeaders::RATELIMIT, h.ratelimit),
                    ]
                })
                .unwrap_or_default(),
            HeaderFormat::DraftVersion03 => {
                x_ratelimit::headers(counters).into_iter().map(|(k, v)| header(k, v)).collect()
            }
        },
    };
    RateLimitResponse {
        overall_code: code(over),
        statuses: match doc.statuses {
            Statuses::Each => statuses,
            Statuses::Overall => Vec::new(),
        },
        response_headers_to_add,
        dynamic_metadata: doc.dynamic_metadata.then(|| super::dynamic_metadata::of(req, plan, &overs)),
        ..RateLimitResponse::default()
    }
}

/// Each limit of the checks at `indexes`, with its policy, the policy's
/// limit (none for a descriptor's own `limit`), the limit as sent (a
/// points limit with the call's `hits_addend` as its cost) and its outcome.
#[allow(clippy::type_complexity)]
fn limits_of<'d, 'c, 'o>(
    checks: &'c Checks<'d>,
    indexes: &[usize],
    outcomes: Option<&'o [CheckOutcome]>,
) -> Vec<(&'d Policy, Option<&'d Limit>, &'c WireLimit, &'o LimitOutcome)> {
    let outcomes = outcomes.unwrap_or_default();
    indexes
        .iter()
        .filter_map(|&c| Some((*checks.policies.get(c)?, checks.checks.get(c)?, outcomes.get(c)?)))
        .flat_map(|(policy, check, outcome)| {
            check
                .limits
                .iter()
                .zip(&outcome.limits)
                .enumerate()
                .map(move |(j, (w, o))| (policy, policy.limits.get(j), w, o))
        })
        .collect()
}

/// A limit the call met, as the draft-03 `X-RateLimit-*` headers show it
/// (an empty `limit_name` is none, as in `current_limit`).
fn counter<'a>(policy: &'a Policy, wire: &WireLimit, o: &LimitOutcome) -> x_ratelimit::Counter<'a> {
    let (quota, window) = wire.quota();
    x_ratelimit::Counter {
        quota: quota.into(),
        window_ms: window.map(|w| w.get()),
        name: policy.limit_name.as_deref().filter(|n| !n.is_empty()),
        remaining: o.remaining,
        reset_ms: o.reset_ms.get(),
    }
}

/// A `blocked` policy (a limit of 0), as the draft-03 headers show it.
fn blocked_counter(policy: &Policy, now_ms: u64) -> x_ratelimit::Counter<'_> {
    x_ratelimit::Counter {
        quota: 0,
        window_ms: policy.blocked.map(|w| w.as_millis()),
        name: policy.limit_name.as_deref().filter(|n| !n.is_empty()),
        remaining: 0,
        reset_ms: sluice_policies::plan::blocked_reset_ms(policy, now_ms).unwrap_or(0),
    }
}

fn code(over: bool) -> i32 {
    if over {
        Code::OverLimit as i32
    } else {
        Code::Ok as i32
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue { key: key.to_string(), value, ..HeaderValue::default() }
}

/// A limit as RLS states it: its quota per window, in the window's unit
/// when the window is exactly one (envoyproxy/ratelimit's month is 30
/// days, its year 365; else `UNKNOWN`, the quota per window); a calendar
/// month's is `MONTH`.
fn rate_limit(name: &str, wire: &WireLimit, limit: Option<&Limit>) -> RateLimit {
    let (quota, window) = limit.map_or(*wire, |l| WireLimit::with_cost(l, 1)).quota();
    let month = matches!(
        limit.and_then(Limit::calendar).map(|c| c.period),
        Some(sluice_policies::calendar::Period::Month { .. })
    );
    let unit = unit(window.map(|w| w.get()), month);
    RateLimit { name: name.to_string(), requests_per_unit: quota, unit: unit as i32 }
}

/// The RLS unit of a window of `window_ms`.
fn unit(window_ms: Option<u64>, calendar_month: bool) -> Unit {
    if calendar_month {
        return Unit::Month;
    }
    window_ms.and_then(|w| UNITS.iter().find(|&&(_, ms)| ms == w)).map_or(Unit::Unknown, |&(u, _)| u)
}

/// A wait in whole seconds, rounded up: Envoy's `x-ratelimit-reset` reads
/// the seconds alone, and envoyproxy/ratelimit answers the seconds to the
/// window's end from a clock in whole seconds, which is this rounding.
fn duration(ms: u64) -> ProtoDuration {
    let seconds = i64::try_from(ms.div_ceil(1000)).unwrap_or(i64::MAX);
    ProtoDuration { seconds, nanos: 0 }
}

/// Decides one request: decode, plan, the limiter's decisions, the answer.
pub async fn decide(faces: &Faces, req: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
    let document = faces.document();
    let mut descriptors = decode(req).map_err(|e| Status::invalid_argument(e.to_string()))?;
    if document.repeated_entry == RepeatedEntry::Last {
        for d in &mut descriptors {
            d.request = std::mem::take(&mut d.request).last_entries_win();
        }
    }
    let plan = plan(&document, &descriptors).map_err(|e| Status::invalid_argument(e.to_string()))?;
    let metrics = &faces.limiter.metrics;
    for planned in &plan.descriptors {
        if !planned.matched() {
            metrics.unmatched(FACE);
        }
        for policy in &planned.unlimited {
            metrics.unlimited(FACE, policy.name.as_str());
        }
        for policy in &planned.blocked {
            metrics.blocked(FACE, policy.name.as_str());
        }
    }
    // Draft 03's headers show every limit the call met, which a refusal
    // from memory does not know: with them, Redis answers every call.
    let every_limit =
        document.header_format == HeaderFormat::DraftVersion03 && document.headers != HeadersMode::Off;
    let slots = if every_limit { 0 } else { document.over_limit_cache_slots.get() };
    let refusals = if document.charge.counts_refused() { Refusals::Counted } else { Refusals::Uncharged };
    let (enforced, shadow) =
        tokio::join!(run(faces, &plan.enforced, slots, refusals), run(faces, &plan.shadow, slots, refusals));
    let shadow = shadow.unwrap_or_else(|err| {
        // A shadow policy never refuses; its failure is only logged.
        tracing::debug!(?err, "a shadow check failed");
        None
    });
    let enforced = enforced.map_err(|err| match err {
        CheckError::BadRequest(reason) => Status::invalid_argument(reason),
        CheckError::Store(reason) => {
            tracing::warn!(%reason, "redis call failed");
            Status::unavailable(reason)
        }
    })?;
    let outcomes = Outcomes { enforced: enforced.as_deref(), shadow: shadow.as_deref() };
    count_descriptors(metrics, &plan, &descriptors, outcomes);
    Ok(answer(&document, req, &plan, outcomes, faces.now_ms()))
}

/// Counts each descriptor's decisions by the policies that label them
/// (`descriptor_metric`) in `sluice_descriptor_decisions_total`, as
/// `sluice_decisions_total` counts a policy's: a check that refused, a
/// check whose whole group was admitted, `blocked` and `unlimited`.
fn count_descriptors(metrics: &Metrics, plan: &Plan<'_>, descriptors: &[Descriptor], outcomes: Outcomes<'_>) {
    let allows = |o: &CheckOutcome| o.limits.iter().all(|l| l.allowed);
    for (planned, d) in plan.descriptors.iter().zip(descriptors) {
        let count = |policy: &Policy, result: &'static str| {
            if let Some(label) = sluice_policies::descriptor_metric::label(policy, &d.request) {
                metrics.descriptor_decided(FACE, policy.name.as_str(), &label, result);
            }
        };
        planned.blocked.iter().for_each(|p| count(p, "denied"));
        planned.unlimited.iter().for_each(|p| count(p, "unlimited"));
        let roles = [
            (&plan.enforced, &planned.enforced, outcomes.enforced),
            (&plan.shadow, &planned.shadow, outcomes.shadow),
        ];
        for (checks, indexes, outcomes) in roles {
            let outcomes = outcomes.unwrap_or_default();
            for &c in indexes {
                let (Some(policy), Some(outcome)) = (checks.policies.get(c), outcomes.get(c)) else {
                    continue;
                };
                if policy.descriptor_metric.is_none() {
                    continue;
                }
                let group = checks.groups.iter().find(|g| g.contains(&c));
                let admitted =
                    group.and_then(|g| outcomes.get(g.clone())).is_some_and(|os| os.iter().all(allows));
                match (allows(outcome), admitted) {
                    (false, _) => count(policy, "denied"),
                    (true, true) => count(policy, "allowed"),
                    (true, false) => {}
                }
            }
        }
    }
}

/// The limiter's decisions on `checks`, group after group, counted as the
/// RLS face's: every check's outcome in order (`None`: no checks). A group
/// whose every check the over-limit cache of `slots` holds a live denial
/// for is refused from memory, with no Redis call ([`super::memory`]);
/// every other goes to Redis, and its refusals are recorded there. Under
/// `charge: every_hit` Redis counts a refusal (`refusals`), and memory
/// skips that count ([`super::memory`] says why no decision changes).
async fn run(
    faces: &Faces,
    checks: &Checks<'_>,
    slots: u32,
    refusals: Refusals,
) -> Result<Option<Vec<CheckOutcome>>, CheckError> {
    let limiter = &faces.limiter;
    let mut out: Option<Vec<CheckOutcome>> = None;
    for (group, mut req) in checks.groups.iter().zip(checks.requests()) {
        let policies = checks.policies.get(group.clone()).unwrap_or_default();
        // Read per group: a group after another's Redis call is sent later.
        let now_ms = faces.now_ms();
        let resp = match faces.memory.deny(slots, policies, &req.checks, now_ms) {
            Some(resp) => limiter.metrics.denied_from_cache(FACE, &req, resp)?,
            None => {
                req.now_us = faces.check_time(now_ms);
                let decided = limiter.check_charging(&req, refusals).await;
                let resp = limiter.metrics.decided_via(FACE, &req, decided)?;
                faces.memory.record(slots, policies, &req.checks, &resp, now_ms, refusals);
                resp
            }
        };
        out.get_or_insert_with(Vec::new).extend(resp.checks);
    }
    Ok(out)
}

/// The tonic service.
pub struct Rls(Faces);

#[tonic::codegen::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        decide(&self.0, request.get_ref()).await.map(Response::new)
    }
}

pub fn service(faces: Faces) -> RateLimitServiceServer<Rls> {
    RateLimitServiceServer::new(Rls(faces)).max_decoding_message_size(MAX_MESSAGE)
}
