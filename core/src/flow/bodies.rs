//! The flow's bodies: the request's, read whole before the decision when a
//! policy that reads bodies may apply (bounded by the document's
//! `max_request_body_bytes`, a 413 past it); the response's, read for its
//! token count by the policies with an `llm` (see [`crate::llm`]).

use sluice_policies::body::Body;
use sluice_policies::request::WithBody;
use sluice_policies::wire::{AdjustRequest, Encoding, ADJUST_PATH};
use sluice_policies::Request;

use sluice_policies::llm::Reservation;

use super::{Phase, State};
use crate::effect::{CallId, CallResult, Effect, Effects, Outgoing};
use crate::host::Host;
use crate::llm::meter::End;
use crate::llm::Metered;
use crate::local_reply::LocalReply;
use crate::now::Now;
use crate::stats::FilterStat;
use crate::verdict::Verdict;
use crate::worker::Worker;

/// What the bodies keep of a request between its events.
#[derive(Default)]
pub(super) struct Bodies {
    /// What each policy with an `llm` reserved (the document's index), from the request's body.
    reservations: Vec<(usize, Reservation)>,
    /// The response's metering, for an admitted request with an `llm` policy.
    metered: Option<Box<Metered>>,
    /// The token settlement sent at the response's end, whose answer holds
    /// its last byte.
    settling: Option<(CallId, AdjustRequest)>,
}

impl Bodies {
    /// Whether the token settlement in flight holds the response's end.
    pub(super) fn holds(&self) -> bool {
        self.settling.is_some()
    }

    /// Whether call `id` is the settlement.
    pub(super) fn settles(&self, id: CallId) -> bool {
        self.settling.as_ref().is_some_and(|(c, _)| *c == id)
    }
}

impl State {
    /// The request's body as the host has buffered it so far, `size`
    /// bytes in all, while the flow is `Reading`: once it is whole, the
    /// request is decided with it; past the document's bound, refused (413).
    /// A face calls it with `end_of_stream` at once for a request without a
    /// body, and on the request's trailers.
    pub(super) fn handle_request_body(
        &mut self,
        worker: &Worker,
        now: &Now,
        req: &impl Request,
        size: usize,
        end_of_stream: bool,
        host: &dyn Host,
    ) -> Vec<Effect> {
        if self.phase != Phase::Reading {
            return Vec::new();
        }
        let limit = worker.doc.max_request_body_bytes.get();
        if size as u64 > u64::from(limit) {
            let mut fx = Effects::default();
            fx.filter(FilterStat::RequestBodyTooLarge, 1);
            self.refuse(worker, too_large(limit), Verdict::BodyTooLarge, &mut fx);
            return fx.0;
        }
        if !end_of_stream {
            return Vec::new();
        }
        let bytes = if size == 0 { Vec::new() } else { host.request_body(0, size).unwrap_or_default() };
        let body = Body::parse(&bytes);
        drop(bytes);
        self.bodies.reservations = worker
            .doc
            .policies
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((i, p.llm.as_ref()?.reserve(Some(&body)))))
            .collect();
        self.phase = Phase::Matching;
        self.decide(worker, now, &WithBody { req, body: &body }, host)
    }

    /// The response's headers: the metering of the admitted `llm` policies starts.
    pub(super) fn start_metering(&mut self, worker: &Worker, host: &dyn Host, fx: &mut Effects) {
        let bodies = &mut self.bodies;
        bodies.metered = Metered::new(&worker.doc, &self.calls, &bodies.reservations).map(Box::new);
        if let Some(metered) = &mut bodies.metered {
            metered.start(host, fx);
        }
    }

    /// A chunk of the response's body, to the meters; the chunk replaced if
    /// a stream is ended past its budget; settled at the body's end.
    pub(super) fn meter_body(
        &mut self,
        worker: &Worker,
        size: usize,
        end_of_stream: bool,
        host: &dyn Host,
        fx: &mut Effects,
    ) {
        let Some(metered) = self.bodies.metered.as_mut().filter(|m| !m.settled()) else { return };
        let chunk = if size == 0 { Vec::new() } else { host.response_body(0, size).unwrap_or_default() };
        let was_ended = metered.ended();
        if let Some(body) = metered.feed(&worker.doc, &chunk, fx) {
            fx.push(Effect::ReplaceResponseBody(body));
            if !was_ended && metered.ended() && !end_of_stream {
                // Its last event is out: the upstream's rest is not.
                fx.push(Effect::EndResponse);
            }
        }
        if end_of_stream {
            self.settle_metering(worker, true, fx);
        }
    }

    /// The response has ended (`whole`: its last byte came; else the
    /// stream ended first): the `llm` policies are settled to what it used,
    /// once. An admitted request that ends before its response's headers
    /// settles too, as a response cut short.
    pub(super) fn settle_metering(&mut self, worker: &Worker, whole: bool, fx: &mut Effects) {
        let bodies = &mut self.bodies;
        if bodies.metered.is_none() && !whole && !bodies.reservations.is_empty() {
            bodies.metered = Metered::new(&worker.doc, &self.calls, &bodies.reservations).map(Box::new);
        }
        let Some(metered) = &mut bodies.metered else { return };
        let end = match (whole, self.phase) {
            (true, _) => End::Whole,
            // A shadow policy admitted a request another policy refused.
            (false, Phase::Refused) => End::NeverSent,
            (false, _) => End::CutShort,
        };
        let adjustments = metered.settle(&worker.doc, end, &self.calls, fx);
        if adjustments.is_empty() {
            return;
        }
        let request = AdjustRequest { adjustments, now_us: None };
        if !whole {
            fx.defer_settlement(&request, metered.settles());
            return;
        }
        // Sent from the stream, its answer holding the response's last
        // byte: a client that sends its next request once it has this
        // response whole finds it settled.
        match serde_json::to_vec(&request) {
            Ok(body) => {
                let id = self.ids.next();
                let timeout_ms = worker.doc.shim.timeout_ms.get().into();
                let encoding = Encoding::Json;
                fx.push(Effect::Send(Outgoing {
                    id,
                    path: ADJUST_PATH,
                    encoding,
                    body,
                    timeout_ms,
                    shared: false,
                }));
                self.bodies.settling = Some((id, request));
            }
            Err(err) => log::warn!("cannot encode {ADJUST_PATH}: {err}"),
        }
    }

    /// The settlement's answer: the response goes on. One that could not be
    /// sent goes through the worker. One that failed is not sent again: an
    /// adjustment the shim may have applied must not be applied twice.
    pub(super) fn settled(&mut self, result: CallResult, fx: &mut Effects) {
        let Some((_, request)) = self.bodies.settling.take() else { return };
        match result {
            CallResult::NotSent(reason) => {
                log::debug!("cannot settle from the stream ({reason}); the worker will");
                let settles = self.bodies.metered.as_ref().map(|m| m.settles()).unwrap_or_default();
                fx.defer_settlement(&request, settles);
            }
            CallResult::Answered { status, .. } if status.as_deref() != Some(b"200") => {
                log::warn!("the shim did not settle a response's tokens: {status:?}");
            }
            CallResult::Answered { body, .. } => {
                if let Some(metered) = &self.bodies.metered {
                    metered.answered(body.as_deref().unwrap_or_default(), fx);
                }
            }
        }
        self.resume_response(fx);
    }
}

/// 413 for a body larger than the document reads.
fn too_large(limit: u32) -> LocalReply {
    let body = serde_json::json!({"error": "request_body_too_large", "max_request_body_bytes": limit});
    LocalReply {
        status: 413,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.to_string().into_bytes(),
    }
}
