//! The shim's metrics, served at `GET /metrics` in the OpenMetrics text
//! format (which Prometheus scrapes) by `prometheus-client`.
//!
//! One [`Metrics`] per shim, shared by the router, the limiter, its store
//! and its wake-up subscriber. What each metric counts, and where:
//!
//! - decisions, per policy and result, where the shim answers `/v1/check`;
//! - Redis latency, script errors and script reloads, around each script
//!   call in [`crate::store::RedisClient::invoke`];
//! - requests in flight, around the `/v1/*` and `/healthz` handlers;
//! - waiters held and hand-overs, in egress waiting;
//! - per policy, for the dashboard: rates, totals, the last minutes and the
//!   busiest keys ([`traffic`], with [`history`], a fixed ring of time
//!   buckets, and [`sketch`], Space-Saving in fixed memory), where decisions
//!   are counted, and failure-mode passes where the filters report them
//!   (`/v1/report`); the dashboard shows them.
//!
//! The policy label comes from the caller's request, so its values are
//! capped: the first [`MAX_POLICY_LABELS`] valid policy names seen keep
//! their own label, every other name counts as `(other)`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use sluice_policies::wire::{CheckRequest, CheckResponse};
use sluice_policies::PolicyName;

use crate::decision::CheckError;

pub mod history;
pub mod sketch;
pub mod traffic;

/// Distinct policy names that get a label of their own.
pub const MAX_POLICY_LABELS: usize = 256;
/// The label of every policy name past the cap, and of invalid ones.
pub const OTHER_POLICY: &str = "(other)";
/// Distinct `descriptor` labels (`sluice_descriptor_decisions_total`) that
/// get a label of their own; every other counts as [`OTHER_POLICY`].
pub const MAX_DESCRIPTOR_LABELS: usize = 1024;
/// The longest `descriptor` label: a longer one is cut to it.
pub const MAX_DESCRIPTOR_LABEL_LEN: usize = 512;

/// `Content-Type` of `GET /metrics`.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Decision {
    policy: String,
    /// `allowed`, `waited`, `denied`, `error` (503) or `invalid` (400);
    /// on a gRPC face also `unlimited` (an `unlimited` policy matched).
    result: &'static str,
    /// Where the request came from: `filter` (the Sluice filter's
    /// `/v1/check`) or a gRPC face (`rls`, `rlqs`: as Envoy reported what
    /// it enforced from its assignments).
    face: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DescriptorDecision {
    policy: String,
    /// The descriptor as envoyproxy/ratelimit names its stats (the
    /// policy's `descriptor_metric`), capped ([`MAX_DESCRIPTOR_LABELS`]).
    descriptor: String,
    /// `allowed`, `denied` or `unlimited`.
    result: &'static str,
    face: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheDenied {
    policy: String,
    /// The face that answered from its over-limit cache (`rls`).
    face: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Assignment {
    /// `token_bucket`, `allow_all`, `deny_all` or `abandon`.
    strategy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseTokens {
    /// `granted` (taken from a window for an RLQS assignment) or
    /// `given_back` (unspent, returned to its window).
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Unmatched {
    face: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Feedback {
    policy: String,
    /// `paused` (a pause moved later) or `slowed` (the key's rate was lowered).
    effect: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Settled {
    policy: String,
    /// `charged` (a true cost above the estimate) or `given_back` (below it:
    /// what actually came back, once, at most what the charge still held).
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScriptError {
    /// `timeout`, `connection`, `server` (Redis answered an error) or `other`.
    kind: &'static str,
}

pub struct Metrics {
    registry: Registry,
    decisions: Family<Decision, Counter>,
    descriptor_decisions: Family<DescriptorDecision, Counter>,
    /// The `descriptor` labels with a label of their own.
    descriptors: Mutex<HashSet<String>>,
    cache_denied: Family<CacheDenied, Counter>,
    unmatched: Family<Unmatched, Counter>,
    feedback: Family<Feedback, Counter>,
    settled: Family<Settled, Counter>,
    redis_seconds: Histogram,
    script_errors: Family<ScriptError, Counter>,
    script_reloads: Counter,
    in_flight: Gauge,
    waiters: Gauge,
    pub(crate) handovers: Counter,
    /// How late a request held for a time slot woke after its slot.
    wait_late_seconds: Histogram,
    /// Held requests that woke later than their margin allows and were
    /// given a new slot instead of being sent.
    wait_shifted: Counter,
    /// Checks per shared-callout batch (`POST /v1/checks`).
    batch_checks: Histogram,
    /// The policy names with a label of their own.
    policies: Mutex<HashSet<String>>,
    /// Per policy, for the dashboard: rates, totals and the busiest keys.
    pub(crate) traffic: traffic::Traffic,
    /// The RLQS face: assignments sent, tokens taken and given back, open streams.
    rlqs_assignments: Family<Assignment, Counter>,
    rlqs_tokens: Family<LeaseTokens, Counter>,
    pub(crate) rlqs_streams: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut metrics = Metrics {
            registry: Registry::default(),
            decisions: Family::default(),
            descriptor_decisions: Family::default(),
            descriptors: Mutex::new(HashSet::new()),
            cache_denied: Family::default(),
            unmatched: Family::default(),
            feedback: Family::default(),
            settled: Family::default(),
            // 100 µs to about 3.3 s.
            redis_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            script_errors: Family::default(),
            script_reloads: Counter::default(),
            in_flight: Gauge::default(),
            waiters: Gauge::default(),
            handovers: Counter::default(),
            // 50 µs to about 1.6 s.
            wait_late_seconds: Histogram::new(exponential_buckets(0.00005, 2.0, 16)),
            wait_shifted: Counter::default(),
            // 1 to 256 checks.
            batch_checks: Histogram::new(exponential_buckets(1.0, 2.0, 9)),
            policies: Mutex::new(HashSet::new()),
            traffic: Default::default(),
            rlqs_assignments: Family::default(),
            rlqs_tokens: Family::default(),
            rlqs_streams: Gauge::default(),
        };
        let r = &mut metrics.registry;
        r.register(
            "sluice_decisions",
            "Checks answered, per policy, result (allowed, waited, denied, error, invalid, unlimited) and face (filter, rls; rlqs: requests Envoy reported it admitted or denied from its assignments)",
            metrics.decisions.clone(),
        );
        r.register(
            "sluice_descriptor_decisions",
            "RLS face: decisions of the policies with a descriptor_metric, per policy, descriptor (as envoyproxy/ratelimit names its stats, detailed_metric and value_to_metric; at most 1024 values, the rest (other)), result (allowed, denied, unlimited) and face",
            metrics.descriptor_decisions.clone(),
        );
        r.register(
            "sluice_cache_denied",
            "Of the denials in sluice_decisions_total, those a face answered from the shim's over-limit cache, with no Redis call, per policy and face (rls)",
            metrics.cache_denied.clone(),
        );
        r.register(
            "sluice_unmatched_descriptors",
            "gRPC faces: descriptors (RLS) and buckets (RLQS) no policy matched, answered OK or allow_all (no limit), per face",
            metrics.unmatched.clone(),
        );
        r.register(
            "sluice_upstream_feedback",
            "The partner's answers recorded, per policy and effect (paused: a pause moved later; slowed: the key's rate was lowered)",
            metrics.feedback.clone(),
        );
        r.register(
            "sluice_points_settled",
            "Points limits' settlements (actual_cost_header, llm_tokens), per policy and direction: the units charged beyond the estimates, and those given back (what actually came back: a settlement sent again gives nothing, a refund at most what its charge still held)",
            metrics.settled.clone(),
        );
        r.register(
            "sluice_redis_call_seconds",
            "Time of each Redis script call, NOSCRIPT reloads included",
            metrics.redis_seconds.clone(),
        );
        r.register(
            "sluice_script_errors",
            "Redis script calls that failed, by kind",
            metrics.script_errors.clone(),
        );
        r.register(
            "sluice_script_reloads",
            "Scripts loaded again because Redis answered NOSCRIPT (first use, restart, failover, SCRIPT FLUSH)",
            metrics.script_reloads.clone(),
        );
        r.register("sluice_requests_in_flight", "HTTP requests being handled", metrics.in_flight.clone());
        r.register("sluice_waiters", "Waiting checks held right now (egress wait)", metrics.waiters.clone());
        r.register(
            "sluice_handovers",
            "Wake-ups delivered to a waiting check: a slot handed over by a release, reclaim or leave",
            metrics.handovers.clone(),
        );
        r.register(
            "sluice_wait_late_seconds",
            "How late a request held for a time slot woke after its slot (an upper bound: from the reservation's call to Redis)",
            metrics.wait_late_seconds.clone(),
        );
        r.register(
            "sluice_wait_shifted",
            "Held requests that woke later than their margin allows (sent, they could crowd the next call at the partner) and were given a new slot instead",
            metrics.wait_shifted.clone(),
        );
        r.register(
            "sluice_batch_checks",
            "Checks per shared-callout batch (POST /v1/checks): its count is the batches, its sum the checks they carried",
            metrics.batch_checks.clone(),
        );
        r.register(
            "sluice_rlqs_assignments",
            "RLQS face: bucket actions sent to Envoy, per strategy (token_bucket, allow_all, deny_all, abandon)",
            metrics.rlqs_assignments.clone(),
        );
        r.register(
            "sluice_rlqs_tokens",
            "RLQS face: tokens taken from windows for assignments (granted) and unspent tokens returned (given_back)",
            metrics.rlqs_tokens.clone(),
        );
        r.register(
            "sluice_rlqs_streams",
            "RLQS face: streams open (one per Envoy)",
            metrics.rlqs_streams.clone(),
        );
        metrics
    }

    /// The page `GET /metrics` serves.
    pub fn render(&self) -> String {
        let mut page = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut page, &self.registry);
        page
    }

    /// Counts a check's answer and passes it on. An admission counts for
    /// every policy of the request (`waited` if the shim held it); a denial
    /// for the policy that denied, as the filter's `sluice.P.denied` does;
    /// a failure for every policy.
    pub(crate) fn decided(
        &self,
        req: &CheckRequest<'_>,
        result: Result<CheckResponse, CheckError>,
    ) -> Result<CheckResponse, CheckError> {
        self.decided_via("filter", req, result)
    }

    /// [`Metrics::decided`], for a request that came through `face`.
    pub(crate) fn decided_via(
        &self,
        face: &'static str,
        req: &CheckRequest<'_>,
        result: Result<CheckResponse, CheckError>,
    ) -> Result<CheckResponse, CheckError> {
        let (result_label, only) = classify(&result);
        self.traffic.record(req, &result, result_label, only);
        for (i, check) in req.checks.iter().enumerate() {
            if only.is_none_or(|only| only == i) {
                let policy = self.policy_label(&check.policy);
                self.decisions.get_or_create(&Decision { policy, result: result_label, face }).inc();
            }
        }
        result
    }

    /// A face's denial answered from the shim's over-limit cache, with no
    /// Redis call: counted as the same denial from Redis would be
    /// ([`Metrics::decided_via`]), and, where it was answered, in
    /// `sluice_cache_denied` and the dashboard's `cache_denied`.
    pub(crate) fn denied_from_cache(
        &self,
        face: &'static str,
        req: &CheckRequest<'_>,
        resp: CheckResponse,
    ) -> Result<CheckResponse, CheckError> {
        let check = resp.denied_check().and_then(|i| req.checks.get(i));
        if let Some(check) = check {
            let policy = self.policy_label(&check.policy);
            self.cache_denied.get_or_create(&CacheDenied { policy, face }).inc();
            self.traffic.answered_from_cache(&check.policy);
        }
        self.decided_via(face, req, Ok(resp))
    }

    /// One decision of `policy` on a descriptor it labels `descriptor`
    /// (its `descriptor_metric`).
    pub(crate) fn descriptor_decided(
        &self,
        face: &'static str,
        policy: &str,
        descriptor: &str,
        result: &'static str,
    ) {
        let policy = self.policy_label(policy);
        let descriptor = self.descriptor_label(descriptor);
        self.descriptor_decisions
            .get_or_create(&DescriptorDecision { policy, descriptor, result, face })
            .inc();
    }

    /// `descriptor`, cut to [`MAX_DESCRIPTOR_LABEL_LEN`], if it may have a
    /// label of its own, else [`OTHER_POLICY`].
    fn descriptor_label(&self, descriptor: &str) -> String {
        let mut end = descriptor.len().min(MAX_DESCRIPTOR_LABEL_LEN);
        while !descriptor.is_char_boundary(end) {
            end -= 1;
        }
        capped(&self.descriptors, &descriptor[..end], MAX_DESCRIPTOR_LABELS)
    }

    /// A gRPC face's request that a `blocked` policy refused, with no check.
    pub(crate) fn blocked(&self, face: &'static str, policy: &str) {
        let policy = self.policy_label(policy);
        self.decisions.get_or_create(&Decision { policy, result: "denied", face }).inc();
    }

    /// A gRPC face's request that an `unlimited` policy answered.
    pub(crate) fn unlimited(&self, face: &'static str, policy: &str) {
        let policy = self.policy_label(policy);
        self.decisions.get_or_create(&Decision { policy, result: "unlimited", face }).inc();
    }

    /// What Envoy reported it enforced for one RLQS bucket of `policy`, on
    /// `key`, since its last report: counted as decisions of face `rlqs`
    /// and in the dashboard's traffic, as the filter's are.
    pub(crate) fn enforced(
        &self,
        policy: &str,
        key: &str,
        limit: sluice_policies::wire::WireLimit,
        allowed: u64,
        denied: u64,
    ) {
        let label = self.policy_label(policy);
        for (result, count) in [("allowed", allowed), ("denied", denied)] {
            if count > 0 {
                self.decisions
                    .get_or_create(&Decision { policy: label.clone(), result, face: "rlqs" })
                    .inc_by(count);
            }
        }
        self.traffic.enforced(policy, key, limit, allowed, denied);
    }

    /// An RLQS bucket action sent.
    pub(crate) fn assigned(&self, strategy: &'static str) {
        self.rlqs_assignments.get_or_create(&Assignment { strategy }).inc();
    }

    /// Tokens an RLQS lease call took from a window, and gave back.
    pub(crate) fn leased(&self, granted: u64, given_back: u64) {
        for (direction, n) in [("granted", granted), ("given_back", given_back)] {
            if n > 0 {
                self.rlqs_tokens.get_or_create(&LeaseTokens { direction }).inc_by(n);
            }
        }
    }

    /// A gRPC face's descriptor that no policy matched.
    pub(crate) fn unmatched(&self, face: &'static str) {
        self.unmatched.get_or_create(&Unmatched { face }).inc();
    }

    /// Counts what one answer of the partner did to `policy`'s key.
    pub(crate) fn fed_back(&self, policy: &str, paused: bool, slowed: bool) {
        for (effect, happened) in [("paused", paused), ("slowed", slowed)] {
            if happened {
                let policy = self.policy_label(policy);
                self.feedback.get_or_create(&Feedback { policy, effect }).inc();
            }
        }
    }

    /// Counts what each adjustment of a settlement moved (`moved`, in
    /// order: units charged, positive, or given back, negative).
    pub(crate) fn settled(&self, adjustments: &[sluice_policies::wire::Adjustment], moved: &[i64]) {
        for (a, &n) in adjustments.iter().zip(moved).filter(|(_, n)| **n != 0) {
            let direction = if n > 0 { "charged" } else { "given_back" };
            let policy = self.policy_label(&a.policy);
            self.settled.get_or_create(&Settled { policy, direction }).inc_by(n.unsigned_abs());
        }
    }

    /// `name` if it may have a label of its own, else [`OTHER_POLICY`].
    fn policy_label(&self, name: &str) -> String {
        if PolicyName::new(name).is_none() {
            return OTHER_POLICY.to_string();
        }
        capped(&self.policies, name, MAX_POLICY_LABELS)
    }

    /// Records one script call that took from `started` until now.
    pub(crate) fn script_call<T>(&self, started: Instant, result: &redis::RedisResult<T>) {
        self.redis_seconds.observe(started.elapsed().as_secs_f64());
        if let Err(err) = result {
            let kind = if err.is_timeout() {
                "timeout"
            } else if err.code() == Some("OOM") {
                // Redis is full under `noeviction`: it refuses writes.
                "oom"
            } else if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
                "connection"
            } else if matches!(err.kind(), redis::ErrorKind::Server(_)) {
                "server"
            } else {
                "other"
            };
            self.script_errors.get_or_create(&ScriptError { kind }).inc();
        }
    }

    pub(crate) fn script_reloaded(&self) {
        self.script_reloads.inc();
    }

    /// Counts a waiting check as held until the guard drops.
    /// A request held for a time slot woke `late` after it.
    pub(crate) fn woke(&self, late: std::time::Duration) {
        self.wait_late_seconds.observe(late.as_secs_f64());
    }

    /// A shared-callout batch of `checks` checks came.
    pub(crate) fn batch(&self, checks: usize) {
        self.batch_checks.observe(checks as f64);
    }

    /// A held request found a late send in its way and waits longer.
    pub(crate) fn shifted(&self) {
        self.wait_shifted.inc();
    }

    pub(crate) fn hold(&self) -> Held {
        self.waiters.inc();
        Held(self.waiters.clone())
    }
}

/// What a check's answer counts as: its result label, and the one check
/// it counts for (the one that denied), or `None` for every check.
pub(crate) fn classify(result: &Result<CheckResponse, CheckError>) -> (&'static str, Option<usize>) {
    match result {
        Ok(resp) if resp.allowed && resp.waited_ms.is_some_and(|ms| ms.get() > 0) => ("waited", None),
        Ok(resp) if resp.allowed => ("allowed", None),
        Ok(resp) => ("denied", Some(resp.denied_check().unwrap_or(0))),
        Err(CheckError::Store(_)) => ("error", None),
        Err(CheckError::BadRequest(_)) => ("invalid", None),
    }
}

/// A waiting check counted in `sluice_waiters`.
pub(crate) struct Held(Gauge);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// `app` with its requests counted in flight, and `GET /metrics` (not
/// counted: a scrape would always see itself).
pub fn serve(app: Router, metrics: Arc<Metrics>) -> Router {
    count(app, metrics.clone()).merge(page_route(metrics))
}

/// `app` with its requests counted in flight.
pub fn count(app: Router, metrics: Arc<Metrics>) -> Router {
    app.layer(InFlight(metrics))
}

/// `GET /metrics` alone.
pub fn page_route(metrics: Arc<Metrics>) -> Router {
    Router::new().route("/metrics", get(page).with_state(metrics))
}

/// Counts each request in `sluice_in_flight` until its answer is ready (or
/// it is dropped). A plain tower layer: `middleware::from_fn` boxed every
/// request's future for this (docs/performance.md, "Levers measured").
#[derive(Clone)]
struct InFlight(Arc<Metrics>);

impl<S> tower_layer::Layer<S> for InFlight {
    type Service = InFlightService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        InFlightService { inner, metrics: self.0.clone() }
    }
}

#[derive(Clone)]
struct InFlightService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S: tower_service::Service<Request>> tower_service::Service<Request> for InFlightService<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = Counted<S::Future>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        self.metrics.in_flight.inc();
        Counted { inner: self.inner.call(req), _held: Held(self.metrics.in_flight.clone()) }
    }
}

pin_project_lite::pin_project! {
    /// A request's future, holding the in-flight count until it completes or
    /// is dropped.
    struct Counted<F> {
        #[pin]
        inner: F,
        _held: Held,
    }
}

impl<F: std::future::Future> std::future::Future for Counted<F> {
    type Output = F::Output;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        self.project().inner.poll(cx)
    }
}

async fn page(State(metrics): State<Arc<Metrics>>) -> Response {
    ([(header::CONTENT_TYPE, OPENMETRICS)], metrics.render()).into_response()
}

/// `value` as a label if it is one of the first `max` values `seen`, else
/// [`OTHER_POLICY`]: a label's values stay bounded.
fn capped(seen: &Mutex<HashSet<String>>, value: &str, max: usize) -> String {
    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    if seen.contains(value) || (seen.len() < max && seen.insert(value.to_string())) {
        value.to_string()
    } else {
        OTHER_POLICY.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_labels_are_capped() {
        let metrics = Metrics::new();
        for i in 0..MAX_POLICY_LABELS {
            assert_eq!(metrics.policy_label(&format!("p{i}")), format!("p{i}"));
        }
        assert_eq!(metrics.policy_label("one-too-many"), OTHER_POLICY);
        assert_eq!(metrics.policy_label("p7"), "p7", "a name seen before keeps its label");
        assert_eq!(metrics.policy_label("not a name"), OTHER_POLICY);
    }
}
