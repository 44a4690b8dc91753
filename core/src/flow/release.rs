//! Releases. A lease is released when the response's last bytes reach the
//! flow, and they are held until the shim confirms the release: a client
//! that sends its next request the moment it sees the response end finds
//! its slot free. The last bytes are the chunk that ends the stream, or,
//! when the response has a `content-length`, the chunk that completes it:
//! an HTTP/1.1 client has the whole response then, before the stream's end
//! reaches the filter. A stream that ends any other way (reset, error,
//! timeout) leaves its release to the worker, whose calls outlive the
//! stream. Each lease is released exactly once.

use sluice_policies::wire::{Encoding, ReleaseRequest, RELEASE_PATH};

use super::CallIds;
use crate::check_call::CheckCall;
use crate::effect::{CallId, CallResult, Effect, Effects, Outgoing};
use crate::host::Host;
use crate::now::Now;
use crate::stats::PolicyStat;
use crate::wait::overran_lease;
use crate::worker::Worker;

/// A release and the policies (document indexes) whose slots it frees.
type Releasing = (ReleaseRequest, Vec<usize>);

#[derive(Default)]
pub(super) struct Release {
    /// Releases sent at the response's end, whose answers hold its last byte.
    in_flight: Vec<(CallId, Releasing)>,
    /// For a response with a `content-length` whose end releases leases:
    /// the bytes still to come.
    body_left: Option<u64>,
}

impl Release {
    /// Whether a release in flight holds the response's end.
    pub(super) fn holds(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// The response's headers, not its end: a request that holds a lease
    /// counts the bytes its `content-length` announces.
    pub(super) fn expect_body(&mut self, calls: &[CheckCall; 2], host: &dyn Host) {
        if calls.iter().any(|c| c.lease.is_some()) {
            self.body_left = host
                .response_header("content-length")
                .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok());
        }
    }

    /// A body chunk of `size` bytes: whether it completes the response.
    pub(super) fn completes(&mut self, size: usize) -> bool {
        match &mut self.body_left {
            Some(left) if *left <= size as u64 => true,
            Some(left) => {
                *left -= size as u64;
                false
            }
            None => false,
        }
    }

    /// The response's last byte has reached the flow: release the leases
    /// now, from this stream, and hold that byte until the shim has
    /// answered, so the slot is free before the client sees the end. A
    /// release that cannot be sent goes to the worker instead.
    pub(super) fn at_end(
        &mut self,
        worker: &Worker,
        calls: &mut [CheckCall; 2],
        ids: &mut CallIds,
        now: &Now,
        fx: &mut Effects,
    ) {
        let releases = to_release(worker, calls, now, fx);
        if releases.is_empty() {
            return;
        }
        for (request, policies, confirmed) in releases {
            if !confirmed {
                // Most likely the shim failed and took nothing: not worth
                // holding the response's end for; the worker releases it.
                fx.defer(RELEASE_PATH, &request, policies);
                continue;
            }
            match serde_json::to_vec(&request) {
                Ok(body) => {
                    let id = ids.next();
                    let timeout_ms = worker.doc.shim.timeout_ms.get().into();
                    let encoding = Encoding::Json;
                    fx.push(Effect::Send(Outgoing {
                        id,
                        path: RELEASE_PATH,
                        encoding,
                        body,
                        timeout_ms,
                        shared: false,
                    }));
                    self.in_flight.push((id, (request, policies)));
                }
                Err(err) => log::warn!("cannot encode {RELEASE_PATH}: {err}"),
            }
        }
    }

    /// Exactly once per admitted request that holds leases, when the stream
    /// ends without a released response end: left to the worker, whose
    /// calls outlive the stream. A release still in flight here is
    /// cancelled with the stream, so it is sent again (a second release of
    /// one lease ends nothing).
    pub(super) fn at_stream_end(
        &mut self,
        worker: &Worker,
        calls: &mut [CheckCall; 2],
        now: &Now,
        fx: &mut Effects,
    ) {
        let held = &calls[0];
        if held.in_flight && held.wait_ms > 0 {
            // The host cancels the call with the stream. The shim gives the
            // held slot back when it sees the call dropped, and, so that this
            // does not rest on the reset reaching it, also when a release
            // names the request (a waiter on a concurrency slot gets its
            // release below, with its lease).
            for &index in &held.policies {
                fx.count(index, PolicyStat::WaitCancelled);
            }
            if held.concurrency_policies(&worker.doc).is_empty() {
                let request = ReleaseRequest { lease: held.id.clone(), checks: held.checks.clone() };
                fx.defer(RELEASE_PATH, &request, Vec::new());
            }
        }
        // Each loop only when it has work: in wasm, going over an empty
        // list of releases costs about 100 operators, on every stream's end.
        if !self.in_flight.is_empty() {
            for (_, (request, policies)) in std::mem::take(&mut self.in_flight) {
                fx.defer(RELEASE_PATH, &request, policies);
            }
        }
        let releases = to_release(worker, calls, now, fx);
        if !releases.is_empty() {
            for (request, policies, _) in releases {
                fx.defer(RELEASE_PATH, &request, policies);
            }
        }
    }

    /// The answer to call `id`, if it is one of these releases (else
    /// `result` comes back).
    pub(super) fn answered(
        &mut self,
        worker: &Worker,
        id: CallId,
        result: CallResult,
        now: &Now,
        fx: &mut Effects,
    ) -> Option<CallResult> {
        let Some(at) = self.in_flight.iter().position(|(c, _)| *c == id) else { return Some(result) };
        let (_, (request, policies)) = self.in_flight.swap_remove(at);
        match result {
            CallResult::NotSent(reason) => {
                log::debug!("cannot release at the response's end ({reason}); the worker will");
                fx.defer(RELEASE_PATH, &request, policies);
            }
            CallResult::Answered { status, body } => {
                worker.release_answered(&policies, status.as_deref(), body.as_deref(), now.ms(), fx)
            }
        }
        None
    }
}

/// The releases still to send: one per call that holds (or may hold) a
/// lease, each taken once, each with whether the shim confirmed the lease
/// (else it is released by the check's id, in case the shim took it unseen).
fn to_release(
    worker: &Worker,
    calls: &mut [CheckCall; 2],
    now: &Now,
    fx: &mut Effects,
) -> Vec<(ReleaseRequest, Vec<usize>, bool)> {
    let mut out = Vec::new();
    // Most calls hold none: nothing to take (a call in flight is unconfirmed).
    for call in calls.iter_mut().filter(|c| c.lease.is_some() || c.unconfirmed) {
        let confirmed = call.lease.is_some();
        let Some(lease) = call.lease_to_release(&worker.doc) else { continue };
        worker.change_live(|live| live.end(&lease));
        let policies = call.concurrency_policies(&worker.doc);
        if confirmed {
            let held = now.ms().saturating_sub(call.admitted_ms);
            for &index in &policies {
                fx.add(index, PolicyStat::HeldMs, held);
                if worker.doc.policies.get(index).is_some_and(|p| overran_lease(p, held)) {
                    fx.count(index, PolicyStat::Overages);
                }
            }
        }
        out.push((ReleaseRequest { lease, checks: call.checks.clone() }, policies, confirmed));
    }
    out
}
