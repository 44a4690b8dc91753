//! Token budgets for LLM traffic, as one request's flow meters them: the
//! policies with an `llm` reserve at the check (`sluice_policies::llm`),
//! and once the request is admitted its response is read for the true
//! count, streamed or not, and settled to it exactly once, whatever way the
//! response ends: the difference is charged or refunded through the
//! points correction (`POST /v1/adjust`), the same as `actual_cost_header`
//! with the body as its source.
//!
//! - [`json`]: an incremental reader of a JSON document that watches a few paths.
//! - [`sse`]: server-sent events, each event's data read as JSON as it comes.
//! - [`meter`]: one response read for one `llm`: its usage, its content, its charge.
//!
//! [`Metered`] ties them to the flow: a meter per distinct `llm` among the
//! request's admitted policies, the adjustments at the end, the stats, and
//! (a policy's `end_stream`) the stream ended once its running count passes
//! what the key has left.

pub mod json;
pub mod meter;
pub mod sse;

use sluice_policies::llm::{Api, Llm, Reservation};
use sluice_policies::wire::{AdjustResponse, Adjustment, WireLimit};
use sluice_policies::{Document, Limit};

use crate::check_call::CheckCall;
use crate::effect::Effects;
use crate::host::Host;
use crate::stats::PolicyStat;
use meter::{Charge, End, Meter, Source};

/// The metering of one admitted request's response.
pub struct Metered {
    /// One meter per distinct `llm`: the policy whose `llm` it reads, and the meter.
    meters: Vec<(usize, Meter)>,
    /// Each admitted policy with an `llm`: (its index, its meter).
    policies: Vec<(usize, usize)>,
    /// With a policy's `end_stream`: the fewest tokens any of its limits
    /// had left for this request (its reservation included); the policy.
    budget: Option<(u64, usize)>,
    /// The stream was ended to the client; the rest of the body is dropped.
    ended: bool,
    settled: bool,
    /// Parallel to the adjustments the settlement sent: the policy whose
    /// `llm_tokens_given_back` the shim's answer to each counts (its first
    /// `llm_tokens` limit's), if any.
    answered_for: Vec<Option<usize>>,
}

impl Metered {
    /// The metering of the admitted calls' policies that have an `llm`,
    /// each with its reservation; `None` if there are none.
    pub fn new(
        doc: &Document,
        calls: &[CheckCall],
        reservations: &[(usize, Reservation)],
    ) -> Option<Metered> {
        let mut metered = Metered {
            meters: Vec::new(),
            policies: Vec::new(),
            budget: None,
            ended: false,
            settled: false,
            answered_for: Vec::new(),
        };
        for call in calls.iter().filter(|c| c.admitted) {
            for (i, &index) in call.policies.iter().enumerate() {
                let Some(llm) = doc.policies.get(index).and_then(|p| p.llm.as_ref()) else { continue };
                let reservation = reservations.iter().find(|(p, _)| *p == index).map(|(_, r)| *r);
                let meter = match metered.meters.iter().position(|(p, _)| llm_of(doc, *p) == Some(llm)) {
                    Some(m) => m,
                    None => {
                        let reservation = reservation.unwrap_or_else(|| llm.reserve(None));
                        metered.meters.push((index, Meter::new(llm, reservation)));
                        metered.meters.len() - 1
                    }
                };
                metered.policies.push((index, meter));
                if llm.end_stream {
                    let left = left_for(call, i);
                    if metered.budget.is_none_or(|(b, _)| left < b) {
                        metered.budget = Some((left, index));
                    }
                }
            }
        }
        (!metered.policies.is_empty()).then_some(metered)
    }

    /// The response's headers have come: each meter learns how to read its
    /// body. A compressed body is counted (`llm_unreadable`), never guessed.
    pub fn start(&mut self, host: &dyn Host, fx: &mut Effects) {
        let status =
            host.response_header(":status").and_then(|s| std::str::from_utf8(&s).ok()?.trim().parse().ok());
        let content_type = host.response_header("content-type").unwrap_or_default();
        let encoding = host.response_header("content-encoding").unwrap_or_default();
        let mut unreadable = false;
        for (_, meter) in &mut self.meters {
            unreadable |= !meter.start(status, &content_type, &encoding);
        }
        if unreadable {
            for &(index, _) in &self.policies {
                fx.count(index, PolicyStat::LlmUnreadable);
            }
            log::debug!(
                "a response with content-encoding {:?} cannot be metered",
                String::from_utf8_lossy(&encoding)
            );
        }
    }

    /// A chunk of the response's body: read by every meter. `Some` bytes
    /// replace the chunk: once a stream's running count passes its budget,
    /// the chunk up to the end of that event, then the API's error event;
    /// after that, nothing.
    pub fn feed(&mut self, doc: &Document, chunk: &[u8], fx: &mut Effects) -> Option<Vec<u8>> {
        // The end of the first event past the budget, if any.
        let mut cut: Option<usize> = None;
        let left = self.budget.map(|(left, _)| left);
        for (policy, meter) in &mut self.meters {
            let Some(llm) = llm_of(doc, *policy) else { continue };
            meter.feed(chunk, llm, |end, running| {
                if left.is_some_and(|left| running > left) {
                    cut = Some(cut.map_or(end, |c| c.min(end)));
                }
            });
        }
        if self.ended {
            return Some(Vec::new());
        }
        let at = cut?;
        let (_, index) = self.budget?;
        let policy = doc.policies.get(index)?;
        let api = policy.llm.as_ref()?.api?;
        self.ended = true;
        fx.count(index, PolicyStat::LlmStreamsEnded);
        log::debug!("policy {} ends a stream past its token budget", policy.name);
        let mut body = chunk.get(..at).unwrap_or(chunk).to_vec();
        body.extend_from_slice(&error_event(api, policy.name.as_str()));
        Some(body)
    }

    /// The response has ended: what each policy's limits are charged, once.
    /// The adjustments to send, and the stats counted.
    pub fn settle(
        &mut self,
        doc: &Document,
        end: End,
        calls: &[CheckCall],
        fx: &mut Effects,
    ) -> Vec<Adjustment> {
        if std::mem::replace(&mut self.settled, true) {
            return Vec::new();
        }
        let charges: Vec<Option<Charge>> = self
            .meters
            .iter_mut()
            .map(|(policy, meter)| Some(meter.end(end, llm_of(doc, *policy)?)))
            .collect();
        let charge_of = |index: usize| {
            let meter = self.policies.iter().find(|(p, _)| *p == index)?.1;
            *charges.get(meter)?
        };
        let mut out = Vec::new();
        for call in calls.iter().filter(|c| c.admitted) {
            let adjustments = call.corrections(doc, |index, limit: &Limit, capacity| {
                limit.costs_llm_tokens().then(|| charge_of(index)).flatten().map(|c| c.tokens.min(capacity))
            });
            let counted = reservations(doc, call);
            for &(index, reserved, capacity, _) in &counted {
                let Some(charge) = charge_of(index) else { continue };
                let charged = charge.tokens.min(capacity);
                fx.add(index, PolicyStat::LlmTokensReserved, u64::from(reserved));
                fx.add(index, PolicyStat::LlmTokensCharged, u64::from(charged));
                let asked = reserved.saturating_sub(charged);
                fx.add(index, PolicyStat::LlmTokensRefundRequested, u64::from(asked));
                if let Source::Fallback(_) = charge.source {
                    fx.add(index, PolicyStat::LlmTokensFallback, u64::from(charged));
                    fx.count(index, PolicyStat::LlmFallbacks);
                }
            }
            for a in adjustments.into_iter().filter(|a| Some(a.actual) != a.limit.points_cost()) {
                // The adjustment of a policy's first `llm_tokens` limit
                // (at most one per policy: its check is one key's).
                let of = counted.iter().find(|(index, _, _, first)| {
                    a.level.is_none() && a.limit == *first && !self.answered_for.contains(&Some(*index))
                });
                self.answered_for.push(of.map(|(index, ..)| *index));
                out.push(a);
            }
        }
        out
    }

    /// The shim's answer to the settlement's adjustments (an
    /// `AdjustResponse`): what each gave back, counted for its policy. An
    /// answer that cannot be read counts nothing: a refund asked for is
    /// not a refund given.
    pub fn answered(&self, body: &[u8], fx: &mut Effects) {
        given_back(body, &self.answered_for, fx);
    }

    /// For each adjustment of the settlement, the policy whose
    /// `llm_tokens_given_back` its answer counts, if any.
    pub fn settles(&self) -> Vec<Option<usize>> {
        self.answered_for.clone()
    }

    /// Whether it has settled.
    pub fn settled(&self) -> bool {
        self.settled
    }

    /// Whether the stream was ended to the client (`end_stream`).
    pub fn ended(&self) -> bool {
        self.ended
    }
}

fn llm_of(doc: &Document, index: usize) -> Option<&Llm> {
    doc.policies.get(index)?.llm.as_ref()
}

/// Each policy of `call` with an `llm`: its index, the reservation its
/// first `llm_tokens` limit was charged, that limit's capacity, and the
/// limit as sent.
fn reservations(doc: &Document, call: &CheckCall) -> Vec<(usize, u32, u32, WireLimit)> {
    let mut out = Vec::new();
    for (&index, check) in call.policies.iter().zip(&call.checks) {
        let Some(policy) = doc.policies.get(index) else { continue };
        let first = policy.limits.iter().zip(&check.limits).find(|(l, _)| l.costs_llm_tokens());
        if let Some((
            _,
            wire @ &(WireLimit::Points { cost, capacity, .. }
            | WireLimit::CalendarPoints { cost, capacity, .. }),
        )) = first
        {
            out.push((index, cost, capacity, *wire));
        }
    }
    out
}

/// The fewest tokens any `llm_tokens` limit of check `i` of an admitted
/// `call` had left for its request: what remains after its reservation,
/// plus the reservation.
fn left_for(call: &CheckCall, i: usize) -> u64 {
    let (Some(check), Some(outcome)) = (call.checks.get(i), call.charged.get(i)) else { return u64::MAX };
    check
        .limits
        .iter()
        .zip(&outcome.limits)
        .filter_map(|(wire, o)| Some(o.remaining.saturating_add(u64::from(wire.points_cost()?))))
        .min()
        .unwrap_or(u64::MAX)
}

/// The event that ends a stream whose budget is spent, in the API's own
/// error shape (the ones its SDKs raise on), after a complete event; the
/// response ends right after it ([`crate::effect::Effect::EndResponse`]).
pub fn error_event(api: Api, policy: &str) -> Vec<u8> {
    let message = format!("the token budget of policy {policy} is spent: the gateway ended this response");
    let event = match api {
        Api::OpenaiChat => {
            let error = serde_json::json!({"error": {
                "message": message, "type": "tokens", "param": null, "code": "rate_limit_exceeded"}});
            format!("data: {error}\n\ndata: [DONE]\n\n")
        }
        Api::OpenaiResponses => {
            // The API's `error` event, and its error as an `error` member
            // too: the OpenAI SDK raises an `APIError` on an `error` event
            // only when it has one (else it yields the event and reads on).
            let error = serde_json::json!({
                "type": "error", "code": "rate_limit_exceeded", "message": message, "param": null,
                "error": {"type": "tokens", "code": "rate_limit_exceeded", "message": message, "param": null}});
            format!("event: error\ndata: {error}\n\n")
        }
        Api::AnthropicMessages => {
            let error = serde_json::json!({"type": "error", "error": {"type": "rate_limit_error", "message": message}});
            format!("event: error\ndata: {error}\n\n")
        }
    };
    event.into_bytes()
}

/// The shim's answer to a settlement (an `AdjustResponse`), whether the
/// stream or its worker sent it: what each adjustment gave back, counted
/// for the policy `settles` names. An answer that cannot be read counts
/// nothing: a refund asked for is not a refund given.
pub fn given_back(body: &[u8], settles: &[Option<usize>], fx: &mut Effects) {
    let Ok(answer) = serde_json::from_slice::<AdjustResponse>(body) else {
        log::debug!("an unreadable answer to a settlement");
        return;
    };
    for (moved, index) in answer.moved.iter().zip(settles) {
        if let (Some(index), true) = (index, *moved < 0) {
            fx.add(*index, PolicyStat::LlmTokensGivenBack, moved.unsigned_abs());
        }
    }
}
