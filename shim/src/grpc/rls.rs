//! The RLS face: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! what Envoy's native `envoy.filters.http.ratelimit` filter calls.
//!
//! Three steps, two of them plain functions:
//!
//! 1. [`decode`]: the request's `domain` and each descriptor's entries become
//!    one [`SimpleRequest`] per descriptor, with its cost (`hits_addend`,
//!    0 meaning 1). Bounded: a malformed or oversized request is refused
//!    with `INVALID_ARGUMENT`, never a panic.
//! 2. [`plan`]: the policy document evaluates each descriptor, as the filter
//!    evaluates an HTTP request. The checks of every descriptor's enforced
//!    policies go into one check request, the shadow policies' into
//!    another: the request is admitted, and charged, only if every limit of
//!    every descriptor allows it (the limiter's one decision flow).
//!    `unlimited` policies are counted, not checked. A descriptor that no
//!    policy matches is answered OK (no limit) and counted
//!    (`sluice_unmatched_descriptors_total`).
//! 3. [`answer`]: OK or OVER_LIMIT per descriptor and overall; each
//!    descriptor's most restrictive limit as `current_limit`,
//!    `limit_remaining` and `duration_until_reset`; and the IETF `RateLimit`
//!    and `RateLimit-Policy` headers (core's rendering) in
//!    `response_headers_to_add`, as the document's `headers` says.

use std::borrow::Cow;

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
use sluice_core::ratelimit_headers::{most_restrictive, wait_ms, RateLimitHeaders};
use sluice_policies::bounds::MAX_CHECKS;
use sluice_policies::key::MAX_SOURCE_NAME_LEN;
use sluice_policies::request::SimpleRequest;
use sluice_policies::wire::{Check, CheckRequest, CheckResponse, LimitOutcome, WireLimit};
use sluice_policies::{Document, HeadersMode, Limit, Policy};
use tonic::{Request, Response, Status};

use super::Faces;
use crate::decision::CheckError;

/// The face's name in metrics (`face="rls"`).
pub const FACE: &str = "rls";
/// The most descriptors one request may carry: each may bring a check.
pub const MAX_DESCRIPTORS: usize = MAX_CHECKS;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;
/// The longest domain.
pub const MAX_DOMAIN_LEN: usize = 256;
/// The longest entry value.
pub const MAX_VALUE_LEN: usize = 1024;
/// The largest request message read: every bound above at its largest fits.
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// One descriptor, as the policy document reads it.
#[derive(Debug, Clone)]
pub struct Descriptor {
    /// The domain and the descriptor's entries.
    pub request: SimpleRequest,
    /// Its cost: the descriptor's `hits_addend`, else the request's; 0 is 1.
    pub hits: u32,
}

/// The request's descriptors, or why it is refused (`INVALID_ARGUMENT`).
pub fn decode(req: &RateLimitRequest) -> Result<Vec<Descriptor>, String> {
    if req.domain.is_empty() || req.domain.len() > MAX_DOMAIN_LEN {
        return Err(format!("domain: expected 1 to {MAX_DOMAIN_LEN} bytes, got {}", req.domain.len()));
    }
    if req.descriptors.is_empty() || req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(format!(
            "descriptors: expected 1 to {MAX_DESCRIPTORS} descriptors, got {}",
            req.descriptors.len()
        ));
    }
    let mut out = Vec::with_capacity(req.descriptors.len());
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() || d.entries.len() > MAX_ENTRIES {
            return Err(format!(
                "descriptors[{i}].entries: expected 1 to {MAX_ENTRIES} entries, got {}",
                d.entries.len()
            ));
        }
        if d.is_negative_hits {
            return Err(format!(
                "descriptors[{i}].is_negative_hits: not supported: Sluice's windows are not refilled by a descriptor"
            ));
        }
        let hits = d.hits_addend.as_ref().map_or(u64::from(req.hits_addend), |h| h.value);
        let hits = u32::try_from(hits)
            .map_err(|_| format!("descriptors[{i}].hits_addend: {hits} is more than {}", u32::MAX))?
            .max(1);
        let mut request = SimpleRequest::default().domain(&req.domain);
        for (j, entry) in d.entries.iter().enumerate() {
            if entry.key.is_empty() || entry.key.len() > MAX_SOURCE_NAME_LEN {
                return Err(format!(
                    "descriptors[{i}].entries[{j}].key: expected 1 to {MAX_SOURCE_NAME_LEN} bytes, got {}",
                    entry.key.len()
                ));
            }
            if entry.value.len() > MAX_VALUE_LEN {
                return Err(format!(
                    "descriptors[{i}].entries[{j}].value: at most {MAX_VALUE_LEN} bytes, got {}",
                    entry.value.len()
                ));
            }
            request = request.entry(&entry.key, &entry.value);
        }
        out.push(Descriptor { request, hits });
    }
    Ok(out)
}

/// What the document makes of one descriptor.
#[derive(Debug, Clone, Default)]
pub struct Planned {
    /// Indexes into [`Plan::enforced`].
    pub enforced: Vec<usize>,
    /// Indexes into [`Plan::shadow`].
    pub shadow: Vec<usize>,
    /// The `unlimited` policies that matched.
    pub unlimited: Vec<String>,
    /// The policy that refuses the descriptor for a missing key
    /// (`on_missing_key: deny`): answered OVER_LIMIT.
    pub missing_key: Option<String>,
}

impl Planned {
    /// Whether any policy matched.
    pub fn matched(&self) -> bool {
        !self.enforced.is_empty()
            || !self.shadow.is_empty()
            || !self.unlimited.is_empty()
            || self.missing_key.is_some()
    }
}

/// The checks of one request, each with its policy.
#[derive(Debug, Clone, Default)]
pub struct Checks<'d> {
    pub checks: Vec<Check>,
    pub policies: Vec<&'d Policy>,
}

impl<'d> Checks<'d> {
    /// The index of `check`; a policy and key that two descriptors reach is
    /// one check, charged once.
    fn add(&mut self, policy: &'d Policy, check: Check) -> usize {
        match self.checks.iter().position(|c| c.policy == check.policy && c.key == check.key) {
            Some(i) => i,
            None => {
                self.checks.push(check);
                self.policies.push(policy);
                self.checks.len() - 1
            }
        }
    }

    pub fn request(&self) -> Option<CheckRequest<'_>> {
        (!self.checks.is_empty()).then(|| CheckRequest {
            checks: Cow::Borrowed(&self.checks),
            id: None,
            now_us: None,
            wait_ms: None,
            // Every descriptor's answer carries its `duration_until_reset`.
            views: sluice_policies::wire::Views::All,
        })
    }
}

/// A request's checks: one entry per descriptor, and the checks of all.
#[derive(Debug, Clone, Default)]
pub struct Plan<'d> {
    pub descriptors: Vec<Planned>,
    pub enforced: Checks<'d>,
    pub shadow: Checks<'d>,
}

/// Evaluates each descriptor; `Err` (`INVALID_ARGUMENT`) when a cost cannot
/// be charged as asked or the checks are more than the shim takes at once.
pub fn plan<'d>(doc: &'d Document, descriptors: &[Descriptor]) -> Result<Plan<'d>, String> {
    let mut plan = Plan::default();
    for (i, d) in descriptors.iter().enumerate() {
        let mut planned = Planned::default();
        match doc.evaluate(&d.request) {
            Err(policy) => planned.missing_key = Some(policy.name.as_str().to_string()),
            Ok(evaluation) => {
                for applied in evaluation.iter() {
                    let policy = applied.policy;
                    if policy.unlimited {
                        planned.unlimited.push(policy.name.as_str().to_string());
                        continue;
                    }
                    let check = charged(applied.check(&d.request), policy, d.hits)
                        .map_err(|e| format!("descriptors[{i}]: {e}"))?;
                    if policy.shadow {
                        planned.shadow.push(plan.shadow.add(policy, check));
                    } else {
                        planned.enforced.push(plan.enforced.add(policy, check));
                    }
                }
            }
        }
        plan.descriptors.push(planned);
    }
    for checks in [&plan.enforced, &plan.shadow] {
        if checks.checks.len() > MAX_CHECKS {
            return Err(format!(
                "the descriptors reach {} checks, more than the {MAX_CHECKS} the shim decides at once",
                checks.checks.len()
            ));
        }
    }
    Ok(plan)
}

/// `check` with a cost of `hits`: a `points` limit's cost (at most its
/// capacity, as every cost). The other limits count requests: a cost above
/// 1 on them is refused rather than under-counted.
fn charged(mut check: Check, policy: &Policy, hits: u32) -> Result<Check, String> {
    for limit in &mut check.limits {
        match limit {
            WireLimit::Points { cost, capacity, .. } | WireLimit::CalendarPoints { cost, capacity, .. } => {
                *cost = hits.min(*capacity)
            }
            other if hits > 1 => {
                return Err(format!(
                    "hits_addend {hits} reaches policy {}, whose {} limit counts requests one by one: only a points limit charges a cost",
                    policy.name,
                    other.kind().name()
                ))
            }
            _ => {}
        }
    }
    Ok(check)
}

/// The whole answer, from the enforced checks' outcome (`None`: there were
/// none).
pub fn answer(doc: &Document, plan: &Plan<'_>, enforced: Option<&CheckResponse>) -> RateLimitResponse {
    let limits_of = |planned: &Planned| -> Vec<(&str, &Limit, &LimitOutcome)> {
        let Some(resp) = enforced else { return Vec::new() };
        planned
            .enforced
            .iter()
            .filter_map(|&c| Some((plan.enforced.policies.get(c)?, resp.checks.get(c)?)))
            .flat_map(|(policy, outcome)| {
                policy.limits.iter().zip(&outcome.limits).map(move |(l, o)| (policy.name.as_str(), l, o))
            })
            .collect()
    };
    let mut statuses = Vec::with_capacity(plan.descriptors.len());
    let mut all = Vec::new();
    for planned in &plan.descriptors {
        let limits = limits_of(planned);
        let over = planned.missing_key.is_some() || limits.iter().any(|(_, _, o)| !o.allowed);
        let mut status = DescriptorStatus { code: code(over), ..DescriptorStatus::default() };
        if let Some((name, limit, outcome)) = most_restrictive(limits.iter().copied()) {
            status.current_limit = Some(rate_limit(name, limit));
            status.limit_remaining = u32::try_from(outcome.remaining).unwrap_or(u32::MAX);
            status.duration_until_reset = Some(duration(wait_ms(outcome)));
        }
        statuses.push(status);
        all.extend(limits);
    }
    let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
    let send_headers = match doc.headers {
        HeadersMode::Off => false,
        HeadersMode::OnDeny => over,
        HeadersMode::Always => true,
    };
    let headers = send_headers.then(|| RateLimitHeaders::most_restrictive(all)).flatten();
    RateLimitResponse {
        overall_code: code(over),
        statuses,
        response_headers_to_add: headers
            .map(|h| {
                vec![
                    header(RateLimitHeaders::POLICY, h.policy),
                    header(RateLimitHeaders::RATELIMIT, h.ratelimit),
                ]
            })
            .unwrap_or_default(),
        ..RateLimitResponse::default()
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
/// when the window is exactly one (else `UNKNOWN`, the quota per window);
/// a calendar month's is `MONTH`.
fn rate_limit(name: &str, limit: &Limit) -> RateLimit {
    let (quota, window) = WireLimit::with_cost(limit, 1).quota();
    let month =
        matches!(limit.calendar().map(|c| c.period), Some(sluice_policies::calendar::Period::Month { .. }));
    let unit = match window.map(|w| w.get()) {
        _ if month => Unit::Month,
        Some(1_000) => Unit::Second,
        Some(60_000) => Unit::Minute,
        Some(3_600_000) => Unit::Hour,
        Some(86_400_000) => Unit::Day,
        Some(604_800_000) => Unit::Week,
        _ => Unit::Unknown,
    };
    RateLimit { name: name.to_string(), requests_per_unit: quota, unit: unit as i32 }
}

fn duration(ms: u64) -> ProtoDuration {
    let seconds = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    // Below 1e9: fits.
    let nanos = ((ms % 1000) * 1_000_000) as i32;
    ProtoDuration { seconds, nanos }
}

/// Decides one request: decode, plan, the limiter's decision, the answer.
pub async fn decide(faces: &Faces, req: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
    let descriptors = decode(req).map_err(Status::invalid_argument)?;
    let document = faces.document();
    let plan = plan(&document, &descriptors).map_err(Status::invalid_argument)?;
    let metrics = &faces.limiter.metrics;
    for planned in &plan.descriptors {
        if !planned.matched() {
            metrics.unmatched(FACE);
        }
        for name in &planned.unlimited {
            metrics.unlimited(FACE, name);
        }
    }
    let (enforced, shadow) = tokio::join!(run(faces, &plan.enforced), run(faces, &plan.shadow));
    if let Err(err) = shadow {
        // A shadow policy never refuses; its failure is only logged.
        tracing::debug!(?err, "a shadow check failed");
    }
    let enforced = enforced.map_err(|err| match err {
        CheckError::BadRequest(reason) => Status::invalid_argument(reason),
        CheckError::Store(reason) => {
            tracing::warn!(%reason, "redis call failed");
            Status::unavailable(reason)
        }
    })?;
    Ok(answer(&document, &plan, enforced.as_ref()))
}

/// The limiter's decision on `checks`, counted as the RLS face's.
async fn run(faces: &Faces, checks: &Checks<'_>) -> Result<Option<CheckResponse>, CheckError> {
    let Some(req) = checks.request() else { return Ok(None) };
    let limiter = &faces.limiter;
    limiter.metrics.decided_via(FACE, &req, limiter.check(&req).await).map(Some)
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
