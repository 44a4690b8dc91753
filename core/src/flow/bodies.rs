//! The flow's bodies: the request's, read whole before the decision when a
//! policy that reads bodies may apply (bounded by the document's
//! `max_request_body_bytes`, a 413 past it); the response's, read for its
//! token count by the policies with an `llm` (see [`crate::llm`]).

use sluice_policies::body::Body;
use sluice_policies::request::WithBody;
use sluice_policies::wire::{AdjustRequest, Encoding, ADJUST_PATH};
use sluice_policies::Request;

use super::{Flow, Phase};
use crate::effect::{CallResult, Effect, Effects, Outgoing};
use crate::host::Host;
use crate::llm::meter::End;
use crate::llm::Metered;
use crate::local_reply::LocalReply;
use crate::stats::FilterStat;
use crate::verdict::Verdict;

impl Flow {
    /// The request's body as the host has buffered it so far, `size`
    /// bytes in all, while the flow is `Reading`: once it is whole, the
    /// request is decided with it; past the document's bound, refused (413).
    /// A face calls it with `end_of_stream` at once for a request without a
    /// body, and on the request's trailers.
    pub fn handle_request_body(
        &mut self,
        req: &impl Request,
        size: usize,
        end_of_stream: bool,
        host: &dyn Host,
    ) -> Vec<Effect> {
        if self.phase != Phase::Reading {
            return Vec::new();
        }
        let limit = self.worker.doc.max_request_body_bytes.get();
        if size as u64 > u64::from(limit) {
            let mut fx = Effects::default();
            fx.filter(FilterStat::RequestBodyTooLarge, 1);
            self.refuse(too_large(limit), Verdict::BodyTooLarge, &mut fx);
            return fx.0;
        }
        if !end_of_stream {
            return Vec::new();
        }
        let bytes = if size == 0 { Vec::new() } else { host.request_body(0, size).unwrap_or_default() };
        let body = Body::parse(&bytes);
        drop(bytes);
        let worker = self.worker.clone();
        self.reservations = worker
            .doc
            .policies
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((i, p.llm.as_ref()?.reserve(Some(&body)))))
            .collect();
        self.phase = Phase::Matching;
        self.decide(&WithBody { req, body: &body }, host)
    }

    /// The response's headers: the metering of the admitted `llm` policies starts.
    pub(super) fn start_metering(&mut self, host: &dyn Host, fx: &mut Effects) {
        let worker = self.worker.clone();
        self.metered = Metered::new(&worker.doc, &self.calls, &self.reservations).map(Box::new);
        if let Some(metered) = &mut self.metered {
            metered.start(host, fx);
        }
    }

    /// A chunk of the response's body, to the meters; the chunk replaced if
    /// a stream is ended past its budget; settled at the body's end.
    pub(super) fn meter_body(&mut self, size: usize, end_of_stream: bool, host: &dyn Host, fx: &mut Effects) {
        let worker = self.worker.clone();
        let Some(metered) = self.metered.as_mut().filter(|m| !m.settled()) else { return };
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
            self.settle_metering(true, fx);
        }
    }

    /// The response has ended (`whole`: its last byte came; else the
    /// stream ended first): the `llm` policies are settled to what it used,
    /// once. An admitted request that ends before its response's headers
    /// settles too, as a response cut short.
    pub(super) fn settle_metering(&mut self, whole: bool, fx: &mut Effects) {
        let worker = self.worker.clone();
        if self.metered.is_none() && !whole && !self.reservations.is_empty() {
            self.metered = Metered::new(&worker.doc, &self.calls, &self.reservations).map(Box::new);
        }
        let Some(metered) = &mut self.metered else { return };
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
            worker.send_later(ADJUST_PATH, &request, Vec::new());
            return;
        }
        // Sent from the stream, its answer holding the response's last
        // byte: a client that sends its next request once it has this
        // response whole finds it settled.
        match serde_json::to_vec(&request) {
            Ok(body) => {
                let id = self.call_id();
                let timeout_ms = worker.doc.shim.timeout_ms.get().into();
                let encoding = Encoding::Json;
                fx.push(Effect::Send(Outgoing { id, path: ADJUST_PATH, encoding, body, timeout_ms }));
                self.settling = Some((id, request));
            }
            Err(err) => log::warn!("cannot encode {ADJUST_PATH}: {err}"),
        }
    }

    /// The settlement's answer: the response goes on. One that could not be
    /// sent goes through the worker. One that failed is not sent again: an
    /// adjustment the shim may have applied must not be applied twice.
    pub(super) fn settled(&mut self, result: CallResult, fx: &mut Effects) {
        let Some((_, request)) = self.settling.take() else { return };
        match result {
            CallResult::NotSent(reason) => {
                log::debug!("cannot settle from the stream ({reason}); the worker will");
                self.worker.send_later(ADJUST_PATH, &request, Vec::new());
            }
            CallResult::Answered { status, .. } if status.as_deref() != Some(b"200") => {
                log::warn!("the shim did not settle a response's tokens: {status:?}");
            }
            CallResult::Answered { body, .. } => {
                if let Some(metered) = &self.metered {
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
