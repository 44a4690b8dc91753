//! The RLQS face: `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`,
//! what Envoy's `envoy.filters.http.rate_limit_quota` filter streams its
//! buckets' usage to, and takes each bucket's assignment from.
//!
//! The decisions are `sluice_core::rlqs::Stream`'s, one per gRPC stream (one
//! per Envoy); this module only drives it:
//!
//! 1. [`decode`]: each usage report becomes [`Report`]s, bounded: a
//!    malformed or oversized one ends the stream with `INVALID_ARGUMENT`,
//!    never a panic.
//! 2. Each bucket is governed by the document
//!    (`sluice_policies::rlqs::govern`, on its domain and bucket id), then
//!    handed to the machine with the time; its usage is counted as the
//!    face's decisions (`face="rlqs"`).
//! 3. The machine's lease calls run on the limiter (`lua/scripts/lease.lua`,
//!    leased mode's script), their answers go back to it; its actions go
//!    to Envoy as one `RateLimitQuotaResponse` at a time; it ticks every
//!    [`TICK_MS`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy as ProtoStrategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Which, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId as ProtoBucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};
use sluice_core::rlqs::{
    Action, BucketId, LeaseCall, LeaseResult, Report, Strategy, Stream, FILL_INTERVAL_S, TICK_MS,
};
use sluice_policies::key::MAX_SOURCE_NAME_LEN;
use sluice_policies::request::SimpleRequest;
use sluice_policies::rlqs::{govern, Governed};
use sluice_policies::Invalid;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::Faces;
use crate::decision::CheckError;
use crate::logs::Throttled;

/// The face's name in metrics (`face="rlqs"`).
pub const FACE: &str = "rlqs";
/// The most buckets one usage report may carry.
pub const MAX_REPORTED: usize = 4096;
/// The most buckets one stream may hold; a report of more ends the stream
/// with `RESOURCE_EXHAUSTED`.
pub const MAX_BUCKETS: usize = 16_384;
/// The most entries of one bucket id.
pub const MAX_ID_ENTRIES: usize = 32;
/// The longest domain.
pub const MAX_DOMAIN_LEN: usize = 256;
/// The longest value of a bucket id.
pub const MAX_VALUE_LEN: usize = 1024;
/// The largest message read: every bound above at its largest fits.
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// Policies that apply to a bucket beside the one that governs it: one line a minute.
static IGNORED_LOG: Throttled = Throttled::per_minute();

/// One usage report, read: the domain (the stream's) and each bucket's usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub domain: String,
    pub reports: Vec<Report>,
}

/// A usage report of a stream whose domain is `domain` (`None` before its
/// first report), or why it is refused (`INVALID_ARGUMENT`). Reports of
/// one bucket within a message are added up.
pub fn decode(msg: &RateLimitQuotaUsageReports, domain: Option<&str>) -> Result<Decoded, Invalid> {
    let domain = match (domain, msg.domain.as_str()) {
        (None, "") => return Err(Invalid::at("domain", "the stream's first report must name its domain")),
        (None, d) if d.len() > MAX_DOMAIN_LEN => {
            return Err(Invalid::at(
                "domain",
                format!("expected 1 to {MAX_DOMAIN_LEN} bytes, got {}", d.len()),
            ))
        }
        (None, d) => d,
        (Some(d), "") => d,
        (Some(d), other) if other == d => d,
        (Some(d), other) => {
            return Err(Invalid::at(
                "domain",
                format!(
                    "the stream's domain is {d:?}; a report cannot change it to {:?}",
                    other.get(..64).unwrap_or(other)
                ),
            ))
        }
    };
    if msg.bucket_quota_usages.len() > MAX_REPORTED {
        return Err(Invalid::at(
            "bucket_quota_usages",
            format!("at most {MAX_REPORTED} buckets in a report, got {}", msg.bucket_quota_usages.len()),
        ));
    }
    let mut reports: Vec<Report> = Vec::with_capacity(msg.bucket_quota_usages.len());
    for (i, usage) in msg.bucket_quota_usages.iter().enumerate() {
        let id = bucket_id(usage.bucket_id.as_ref())
            .map_err(|e| e.within(&format!("bucket_quota_usages[{i}].bucket_id")))?;
        match reports.iter_mut().find(|r| r.id == id) {
            Some(r) => {
                r.allowed = r.allowed.saturating_add(usage.num_requests_allowed);
                r.denied = r.denied.saturating_add(usage.num_requests_denied);
            }
            None => reports.push(Report {
                id,
                allowed: usage.num_requests_allowed,
                denied: usage.num_requests_denied,
            }),
        }
    }
    Ok(Decoded { domain: domain.to_string(), reports })
}

/// A bucket id, sorted by key; or what is wrong with it.
fn bucket_id(id: Option<&ProtoBucketId>) -> Result<BucketId, Invalid> {
    let Some(id) = id else { return Err(Invalid::new("missing")) };
    if id.bucket.is_empty() || id.bucket.len() > MAX_ID_ENTRIES {
        return Err(Invalid::at(
            "bucket",
            format!("expected 1 to {MAX_ID_ENTRIES} entries, got {}", id.bucket.len()),
        ));
    }
    let mut pairs = Vec::with_capacity(id.bucket.len());
    for (key, value) in &id.bucket {
        if key.is_empty() || key.len() > MAX_SOURCE_NAME_LEN {
            return Err(Invalid::at(
                "bucket",
                format!("a key of {} bytes (expected 1 to {MAX_SOURCE_NAME_LEN})", key.len()),
            ));
        }
        if value.len() > MAX_VALUE_LEN {
            return Err(Invalid::at(
                format!("bucket[{key:?}]"),
                format!("at most {MAX_VALUE_LEN} bytes, got {}", value.len()),
            ));
        }
        pairs.push((key.clone(), value.clone()));
    }
    pairs.sort();
    Ok(pairs)
}

/// The request the document matches for a bucket of `domain`.
pub fn bucket_request(domain: &str, id: &BucketId) -> SimpleRequest {
    id.iter().fold(SimpleRequest::default().domain(domain), |r, (k, v)| r.bucket(k, v))
}

/// The machine's actions as one response to Envoy.
pub fn response(actions: &[Action]) -> RateLimitQuotaResponse {
    let bucket_action = actions
        .iter()
        .map(|action| match action {
            Action::Assign { id, strategy, ttl_s } => BucketAction {
                bucket_id: Some(proto_id(id)),
                bucket_action: Some(Which::QuotaAssignmentAction(QuotaAssignmentAction {
                    assignment_time_to_live: Some(seconds(*ttl_s)),
                    rate_limit_strategy: Some(RateLimitStrategy { strategy: Some(strategy_of(*strategy)) }),
                })),
            },
            Action::Abandon { id } => BucketAction {
                bucket_id: Some(proto_id(id)),
                bucket_action: Some(Which::AbandonAction(AbandonAction {})),
            },
        })
        .collect();
    RateLimitQuotaResponse { bucket_action }
}

fn strategy_of(strategy: Strategy) -> ProtoStrategy {
    match strategy {
        Strategy::TokenBucket { tokens } => ProtoStrategy::TokenBucket(TokenBucket {
            max_tokens: tokens,
            tokens_per_fill: Some(UInt32Value { value: 1 }),
            fill_interval: Some(seconds(FILL_INTERVAL_S)),
        }),
        Strategy::AllowAll => ProtoStrategy::BlanketRule(BlanketRule::AllowAll as i32),
        Strategy::DenyAll => ProtoStrategy::BlanketRule(BlanketRule::DenyAll as i32),
    }
}

fn strategy_name(action: &Action) -> &'static str {
    match action {
        Action::Assign { strategy: Strategy::TokenBucket { .. }, .. } => "token_bucket",
        Action::Assign { strategy: Strategy::AllowAll, .. } => "allow_all",
        Action::Assign { strategy: Strategy::DenyAll, .. } => "deny_all",
        Action::Abandon { .. } => "abandon",
    }
}

fn proto_id(id: &BucketId) -> ProtoBucketId {
    ProtoBucketId { bucket: id.iter().cloned().collect::<HashMap<String, String>>() }
}

fn seconds(s: u64) -> ProtoDuration {
    ProtoDuration { seconds: i64::try_from(s).unwrap_or(i64::MAX), nanos: 0 }
}

/// One stream's driver: reads Envoy's reports, runs the machine's calls,
/// sends its actions, until Envoy closes the stream, a report is refused
/// (the stream ends with its status), or the shim's drain closes it.
async fn drive(
    faces: Faces,
    mut inbound: Streaming<RateLimitQuotaUsageReports>,
    out: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
) {
    let metrics = faces.limiter.metrics.clone();
    metrics.rlqs_streams.inc();
    let started = Instant::now();
    let now = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX).saturating_add(1);
    let mut stream = Stream::new(rand::random());
    let mut domain: Option<String> = None;
    let (answers, mut answered) = mpsc::unbounded_channel::<(BucketId, u64, LeaseResult)>();
    let mut tick = tokio::time::interval(Duration::from_millis(TICK_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let drain = faces.limiter.drain().clone();
    loop {
        tokio::select! {
            // The shim is closing (SIGTERM): the stream ends, and Envoy opens
            // its next one to another shim; its assignments stand meanwhile.
            _ = drain.closed() => break,
            message = inbound.message() => match message {
                Ok(Some(msg)) => {
                    let decoded = decode(&msg, domain.as_deref()).map_err(|e| Status::invalid_argument(e.to_string())).and_then(|d| {
                        let new = d.reports.iter().filter(|r| !stream.knows(&r.id)).count();
                        if stream.len() + new > MAX_BUCKETS {
                            Err(Status::resource_exhausted(format!("a stream holds at most {MAX_BUCKETS} buckets")))
                        } else {
                            Ok(d)
                        }
                    });
                    match decoded {
                        Ok(decoded) => {
                            let document = faces.document();
                            for report in &decoded.reports {
                                tracing::debug!(id = ?report.id, report.allowed, report.denied, "rlqs report");
                                let governed = governed(&faces, &document, &decoded.domain, report, stream.knows(&report.id));
                                stream.handle_report(now(), report, governed);
                            }
                            domain = Some(decoded.domain);
                        }
                        Err(status) => {
                            let _ = out.send(Err(status)).await;
                            break;
                        }
                    }
                }
                Ok(None) | Err(_) => break,
            },
            Some((id, seq, result)) = answered.recv() => {
                tracing::debug!(?id, seq, ?result, "rlqs lease answer");
                stream.handle_lease(now(), &id, seq, result)
            }
            _ = tick.tick() => stream.tick(now()),
            _ = out.closed() => break,
        }
        for call in stream.poll_calls() {
            tracing::debug!(id = ?call.id, call.seq, want = call.request.want, give_back = ?call.request.give_back, "rlqs lease call");
            tokio::spawn(lease(faces.clone(), call, answers.clone()));
        }
        let actions = stream.poll_actions();
        if !actions.is_empty() {
            // A `deny_all` right before a token bucket only makes it fresh:
            // not counted as what the bucket holds.
            let counted = actions.iter().enumerate().filter(|(i, a)| {
                !matches!(
                    (a, actions.get(i + 1)),
                    (
                        Action::Assign { strategy: Strategy::DenyAll, id, .. },
                        Some(Action::Assign { strategy: Strategy::TokenBucket { .. }, id: next, .. })
                    ) if id == next
                )
            });
            tracing::debug!(?actions, "rlqs actions");
            for (_, action) in counted {
                metrics.assigned(strategy_name(action));
            }
            if out.send(Ok(response(&actions))).await.is_err() {
                break;
            }
        }
    }
    metrics.rlqs_streams.dec();
}

/// What governs a reported bucket, and its usage counted as the face's decisions.
fn governed(
    faces: &Faces,
    document: &sluice_policies::Document,
    domain: &str,
    report: &Report,
    known: bool,
) -> Governed {
    let (governed, ignored) = govern(document, &bucket_request(domain, &report.id));
    let metrics = &faces.limiter.metrics;
    match &governed {
        Governed::Leased(window) => {
            metrics.enforced(&window.policy, &window.key, window.limit, report.allowed, report.denied)
        }
        Governed::Unlimited { policy } if !known => metrics.unlimited(FACE, policy),
        Governed::Unmatched if !known => metrics.unmatched(FACE),
        _ => {}
    }
    if !known && !ignored.is_empty() {
        if let Some(suppressed) = IGNORED_LOG.admit() {
            tracing::warn!(
                ?ignored,
                suppressed,
                "an RLQS bucket matches several policies: the first in the document governs it, the others are ignored"
            );
        }
    }
    governed
}

/// Runs one lease call and sends its result back to the stream.
async fn lease(faces: Faces, call: LeaseCall, answers: mpsc::UnboundedSender<(BucketId, u64, LeaseResult)>) {
    let result = match faces.limiter.lease(&call.request).await {
        Ok(answer) => {
            let given = call.request.give_back.map_or(0, |b| u64::from(b.tokens));
            faces.limiter.metrics.leased(u64::from(answer.granted), given);
            LeaseResult::Answered(answer)
        }
        Err(CheckError::BadRequest(reason)) => {
            tracing::warn!(%reason, "an RLQS lease call was refused");
            LeaseResult::Refused
        }
        // It may have run: sent again, charged once.
        Err(CheckError::Store(_)) => LeaseResult::Lost,
    };
    let _ = answers.send((call.id, call.seq, result));
}

/// The tonic service.
pub struct Rlqs(Faces);

#[tonic::codegen::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let (out, responses) = mpsc::channel(64);
        tokio::spawn(drive(self.0.clone(), request.into_inner(), out));
        Ok(Response::new(ReceiverStream::new(responses)))
    }
}

pub fn service(faces: Faces) -> RateLimitQuotaServiceServer<Rlqs> {
    RateLimitQuotaServiceServer::new(Rlqs(faces)).max_decoding_message_size(MAX_MESSAGE)
}
