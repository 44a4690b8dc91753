//! What the upstream's response tells the policies of an admitted request:
//! the load it reports (for load shedding) and the partner's "slow down"
//! (upstream feedback), which is sent to the shim from the stream while the
//! response's headers wait for it.

use sluice_policies::wire::{Encoding, FeedbackRequest, FEEDBACK_PATH};

use super::CallIds;
use crate::check_call::CheckCall;
use crate::effect::{CallId, CallResult, Effect, Effects, Outgoing};
use crate::feedback;
use crate::host::Host;
use crate::now::Now;
use crate::stats::PolicyStat;
use crate::worker::Worker;

#[derive(Default)]
pub(super) struct Upstream {
    /// Upstream feedback sent from this stream, while the response's
    /// headers wait for the shim to record the pause.
    reporting: Option<(CallId, FeedbackRequest)>,
}

impl Upstream {
    /// Whether a feedback report in flight holds the response's headers.
    pub(super) fn holds(&self) -> bool {
        self.reporting.is_some()
    }

    /// The utilization the upstream's response reports, for each admitted
    /// policy that sheds by a response header.
    pub(super) fn observe_load(worker: &Worker, call: &CheckCall, host: &dyn Host) {
        for &index in &call.policies {
            let Some(shed) = worker.doc.policies.get(index).and_then(|p| p.shed.as_ref()) else { continue };
            if let Some(utilization) = shed.signal.read(|name: &str| host.response_header(name)) {
                worker.change_shedding(|shedding| shedding.observe(index, utilization));
            }
        }
    }

    /// The partner's answer to an admitted request (`call`, the enforced
    /// one): pauses for the policies that read upstream feedback, counted
    /// and sent to the shim from this stream. The response's headers wait
    /// until the shim has recorded the pause, so every call checked after the
    /// client sees the partner's "slow down" is paused, on every gateway. A
    /// pause that cannot be sent from here goes through the worker.
    pub(super) fn report(
        &mut self,
        worker: &Worker,
        call: &CheckCall,
        ids: &mut CallIds,
        now: &Now,
        host: &dyn Host,
        fx: &mut Effects,
    ) {
        let reads = |&i: &usize| worker.doc.policies.get(i).is_some_and(|p| p.upstream.is_some());
        if !call.admitted || !call.policies.iter().any(reads) {
            return;
        }
        let Some(status) = host
            .response_header(":status")
            .and_then(|s| std::str::from_utf8(&s).ok()?.trim().parse::<u16>().ok())
        else {
            return;
        };
        let header = |name: &str| host.response_header(name);
        let got = feedback::read(&worker.doc, &call.policies, &call.checks, status, header, now.ms());
        if got.pauses.is_empty() {
            return;
        }
        for &index in &got.throttled {
            fx.count(index, PolicyStat::UpstreamThrottled);
        }
        for &index in &got.clamped {
            fx.count(index, PolicyStat::UpstreamClamped);
        }
        let request = FeedbackRequest { pauses: got.pauses, now_us: None };
        match serde_json::to_vec(&request) {
            Ok(body) => {
                let id = ids.next();
                let timeout_ms = worker.doc.shim.timeout_ms.get().into();
                let encoding = Encoding::Json;
                fx.push(Effect::Send(Outgoing {
                    id,
                    path: FEEDBACK_PATH,
                    encoding,
                    body,
                    timeout_ms,
                    shared: false,
                }));
                self.reporting = Some((id, request));
            }
            Err(err) => log::warn!("cannot encode {FEEDBACK_PATH}: {err}"),
        }
    }

    /// The answer to call `id`, if it is the report (else `result` comes back).
    pub(super) fn answered(
        &mut self,
        id: CallId,
        result: CallResult,
        fx: &mut Effects,
    ) -> Option<CallResult> {
        if !self.reporting.as_ref().is_some_and(|(c, _)| *c == id) {
            return Some(result);
        }
        let (_, feedback) = self.reporting.take()?;
        match result {
            CallResult::NotSent(reason) => {
                log::debug!("cannot send upstream feedback from the stream ({reason}); the worker will");
                fx.defer(FEEDBACK_PATH, &feedback, Vec::new());
            }
            CallResult::Answered { status, .. } if status.as_deref() != Some(b"200") => {
                log::debug!("the shim did not record upstream feedback: {status:?}");
            }
            CallResult::Answered { .. } => {}
        }
        None
    }

    /// The stream ended: a report in flight is cancelled with it, so the
    /// worker sends it again (recording a pause twice extends nothing).
    pub(super) fn at_stream_end(&mut self, fx: &mut Effects) {
        if let Some((_, feedback)) = self.reporting.take() {
            fx.defer(FEEDBACK_PATH, &feedback, Vec::new());
        }
    }
}
