//! One request's flow, as a sans-IO state machine: events in, effects out.
//!
//! For each request: match the policies, refuse at once from the shedder,
//! the over-limit cache or an open breaker, spend a leased policy's token,
//! else ask the shim and admit or refuse the request. After an admission:
//! add the response headers, report upstream feedback, release the
//! request's leases, and correct the points it was charged once the
//! response tells its true cost.
//!
//! [`Flow`] does no I/O and reads no clock. Its methods sort into four
//! kinds, as in a sans-IO protocol machine:
//! - getters: [`Flow::phase`];
//! - `handle_*` for each event: the request's headers, the answer to one of
//!   its calls, the response's headers, body chunks and trailers, the
//!   stream's end; each returns the [`Effect`]s to perform, in order;
//! - `hold_*`: whether the host must hold the request or response now,
//!   asked once the event's effects are performed (a call the host could
//!   not send is handed back at once, and may decide the request);
//! - each event carries its time ([`Now`]); shared data, the response's
//!   headers and the bodies are read through [`Host`].
//!
//! **Two calls.** Enforced and shadow policies go to the shim in two calls,
//! sent together: each call is all-or-nothing, and a shadow policy's denial
//! must neither refuse the request nor keep the enforced policies from being
//! charged.
//!
//! **Egress waiting** (see `wait`): the enforced call may ask the shim to
//! hold the request (`wait_ms`), and its timeout grows by as much; a held
//! request that passes gets `server-timing: sluice;dur=N` on its response.
//! The shadow call never waits.
//!
//! **Parts.** [`Flow`] holds the worker and the request's `State`; each
//! part of the state is a machine of its own, in its own module:
//! - `admission`: match, refuse at once, spend leased tokens, send the checks;
//! - `answers`: the decision once the checks have answered;
//! - `release`: the leases released at the response's end (see there);
//! - `upstream`: the load and upstream feedback the response reports;
//! - `bodies`: the request's body read before the decision, the response's
//!   read for its tokens, and their settlement.

mod admission;
mod answers;
mod bodies;
mod release;
mod upstream;

use std::rc::Rc;

use sluice_policies::wire::{AdjustRequest, ADJUST_PATH};
use sluice_policies::Request;

use crate::check_call::CheckCall;
use crate::decision::{read_answer, NoAnswer};
use crate::effect::{CallId, CallResult, Effect, Effects};
use crate::host::Host;
use crate::local_reply::LocalReply;
use crate::now::Now;
use crate::stats::FilterStat;
use crate::verdict::{Verdict, VERDICT_HEADER};
use crate::wait::{server_timing, SERVER_TIMING};
use crate::worker::Worker;

use admission::Admission;
use bodies::Bodies;
use release::Release;
use upstream::Upstream;

/// The header that tells a client a shadow policy would have refused it.
pub const SHADOW_HEADER: &str = "x-sluice-shadow";

/// The enforced check's call id, and the shadow check's; others count from here.
pub use crate::decision::CHECK_ENCODING;

const ENFORCED: CallId = CallId(0);
const SHADOW: CallId = CallId(1);
const FIRST_OTHER: u32 = 2;

/// Where a request's flow stands.
///
/// `Matching [→ Reading] → Checking | Waiting → Admitted | Failed | Refused`,
/// then for a request let through `→ Streaming → Settling → Done`. A request that
/// needs nothing after its admission (no lease, no header to add) is `Done`
/// at once; a refused one stays `Refused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The request's headers have not been seen.
    Matching,
    /// Its body is being read (a policy that reads bodies may apply): the
    /// host holds its headers and buffers its body.
    Reading,
    /// Its checks are in flight; the host holds the request.
    Checking,
    /// Its enforced check asked the shim to hold it until its slot comes
    /// (egress waiting); the host holds the request.
    Waiting,
    /// Admitted: by the shim, from a lease, or with only shadow policies.
    Admitted,
    /// The shim gave no usable answer and `failure_mode` let it through.
    Failed,
    /// Answered locally: denied, shed, a missing key, or `failure_mode` deny.
    Refused,
    /// The upstream's response is passing through.
    Streaming,
    /// The response's end is held while its releases (or its token
    /// settlement) are in flight.
    Settling,
    /// Nothing more to do.
    Done,
}

pub struct Flow {
    worker: Rc<Worker>,
    state: State,
}

/// One request's state, by part; each handler borrows the worker beside it.
struct State {
    phase: Phase,
    /// The enforced call first, then the shadow call; either may be empty.
    calls: [CheckCall; 2],
    ids: CallIds,
    /// The host holds the request (it was told so): its admission resumes it.
    request_held: bool,
    /// The host holds the response: the last release's answer resumes it.
    response_held: bool,
    /// Headers to add to the upstream's response of an admitted request.
    response_headers: Vec<(&'static str, String)>,
    /// How long the shim held an admitted request, for `server-timing`.
    waited_ms: Option<u64>,
    admission: Admission,
    release: Release,
    upstream: Upstream,
    bodies: Bodies,
}

/// The ids of a stream's calls other than its checks.
struct CallIds(u32);

impl CallIds {
    fn next(&mut self) -> CallId {
        let id = CallId(self.0);
        self.0 = self.0.wrapping_add(1).max(FIRST_OTHER);
        id
    }
}

impl Flow {
    pub fn new(worker: Rc<Worker>) -> Flow {
        let state = State {
            phase: Phase::Matching,
            calls: [CheckCall::new(), CheckCall::new()],
            ids: CallIds(FIRST_OTHER),
            request_held: false,
            response_held: false,
            response_headers: Vec::new(),
            waited_ms: None,
            admission: Admission::default(),
            release: Release::default(),
            upstream: Upstream::default(),
            bodies: Bodies::default(),
        };
        Flow { worker, state }
    }

    pub fn phase(&self) -> Phase {
        self.state.phase
    }

    /// Whether the host must hold the request now; asked once the request
    /// headers' effects are performed. While the body is being read the
    /// headers are held too (the host must still hand over the body, as
    /// Envoy does with `allow_on_headers_stop_iteration`): only an admitted
    /// request goes upstream, headers and body together.
    pub fn hold_request(&mut self) -> bool {
        self.state.hold_request()
    }

    /// Whether the host must hold the request's body now (buffered, not
    /// sent on); asked once a body chunk's effects are performed.
    pub fn hold_request_body(&mut self) -> bool {
        self.state.phase == Phase::Reading || self.state.hold_request()
    }

    /// Whether the host must hold the response now; asked once a response
    /// event's effects are performed.
    pub fn hold_response(&mut self) -> bool {
        let s = &mut self.state;
        // A feedback report holds the body too: a body let go would take
        // the held headers with it, before the pause is recorded.
        let hold = s.release.holds() || s.bodies.holds() || s.upstream.holds();
        s.response_held |= hold;
        hold
    }

    /// The request's headers: match, decide locally or ask the shim; or,
    /// when a policy that reads bodies may apply, read the body first
    /// (`Reading`: the face hands it over with [`Flow::handle_request_body`]).
    pub fn handle_request_headers(&mut self, now: &Now, req: &impl Request, host: &dyn Host) -> Vec<Effect> {
        let worker = &*self.worker;
        if worker.doc.reads_body() && worker.doc.needs_body(req) {
            self.state.phase = Phase::Reading;
            return Vec::new();
        }
        self.state.decide(worker, now, req, host)
    }

    /// The request's body as the host has buffered it so far, `size`
    /// bytes in all, while the flow is `Reading`: once it is whole, the
    /// request is decided with it; past the document's bound, refused (413).
    /// A face calls it with `end_of_stream` at once for a request without a
    /// body, and on the request's trailers.
    pub fn handle_request_body(
        &mut self,
        now: &Now,
        req: &impl Request,
        size: usize,
        end_of_stream: bool,
        host: &dyn Host,
    ) -> Vec<Effect> {
        self.state.handle_request_body(&self.worker, now, req, size, end_of_stream, host)
    }

    /// What became of one of this stream's calls.
    pub fn handle_answer(
        &mut self,
        now: &Now,
        id: CallId,
        result: CallResult,
        host: &dyn Host,
    ) -> Vec<Effect> {
        self.state.handle_answer(&self.worker, now, id, result, host)
    }

    /// The upstream's response headers.
    pub fn handle_response_headers(
        &mut self,
        now: &Now,
        end_of_stream: bool,
        host: &dyn Host,
    ) -> Vec<Effect> {
        self.state.handle_response_headers(&self.worker, now, end_of_stream, host)
    }

    /// A chunk of the response's body, `size` bytes.
    pub fn handle_response_body(
        &mut self,
        now: &Now,
        size: usize,
        end_of_stream: bool,
        host: &dyn Host,
    ) -> Vec<Effect> {
        let (worker, s) = (&*self.worker, &mut self.state);
        let mut fx = worker.effects();
        s.meter_body(worker, size, end_of_stream, host, &mut fx);
        if s.phase == Phase::Streaming && (s.release.completes(size) || end_of_stream) {
            s.release_at_end(worker, now, &mut fx);
        }
        fx.0
    }

    /// The response's trailers: its end.
    pub fn handle_response_trailers(&mut self, now: &Now) -> Vec<Effect> {
        let (worker, s) = (&*self.worker, &mut self.state);
        let mut fx = worker.effects();
        s.settle_metering(worker, true, &mut fx);
        if s.phase == Phase::Streaming {
            s.release_at_end(worker, now, &mut fx);
        }
        fx.0
    }

    /// A check that waited to share a callout was never sent: its stream
    /// ended first (see [`crate::sharing`]). The shim holds nothing under
    /// its id, so its end releases nothing for it.
    pub fn handle_withdrawn(&mut self, id: CallId) {
        let which = match id {
            ENFORCED => 0,
            SHADOW => 1,
            _ => return,
        };
        let call = &mut self.state.calls[which];
        call.in_flight = false;
        call.unconfirmed = false;
    }

    /// The stream ended (its log, then its teardown; either may come alone):
    /// whatever it still holds is left to the worker, exactly once, and
    /// the tokens of a request reset before its decision go back.
    pub fn handle_stream_end(&mut self, now: &Now, host: &dyn Host) -> Vec<Effect> {
        let (worker, s) = (&*self.worker, &mut self.state);
        let mut fx = worker.effects();
        s.release.at_stream_end(worker, &mut s.calls, now, &mut fx);
        s.upstream.at_stream_end(&mut fx);
        // Ended before its response did: what it used is not known.
        s.settle_metering(worker, false, &mut fx);
        // Reset before its decision: the tokens go back.
        s.settle_tokens(worker, false, now, host, &mut fx);
        s.phase = match s.phase {
            Phase::Refused => Phase::Refused,
            _ => Phase::Done,
        };
        fx.0
    }
}

impl State {
    fn hold_request(&mut self) -> bool {
        let hold = matches!(self.phase, Phase::Reading | Phase::Checking | Phase::Waiting | Phase::Refused);
        self.request_held |= matches!(self.phase, Phase::Checking | Phase::Waiting);
        hold
    }

    fn handle_answer(
        &mut self,
        worker: &Worker,
        now: &Now,
        id: CallId,
        result: CallResult,
        host: &dyn Host,
    ) -> Vec<Effect> {
        let mut fx = worker.effects();
        let Some(result) = self.release.answered(worker, id, result, now, &mut fx) else {
            self.resume_response(&mut fx);
            return fx.0;
        };
        if self.bodies.settles(id) {
            self.settled(result, &mut fx);
            return fx.0;
        }
        let Some(result) = self.upstream.answered(id, result, &mut fx) else {
            self.resume_response(&mut fx);
            return fx.0;
        };
        let which = match id {
            ENFORCED => 0,
            SHADOW => 1,
            _ => return fx.0,
        };
        let call = &mut self.calls[which];
        if !call.in_flight {
            return fx.0;
        }
        call.in_flight = false;
        let now = now.ms();
        let answer = match result {
            CallResult::NotSent(reason) => {
                call.unconfirmed = false;
                Err(NoAnswer::NotSent(reason))
            }
            CallResult::Answered { status, body } => {
                fx.filter(FilterStat::ShimLatencyMs, now.saturating_sub(call.sent_ms) as i64);
                let answer = read_answer(CHECK_ENCODING, status.as_deref(), body.as_deref(), &call.checks);
                // Only a readable answer says whether the shim took a lease.
                call.unconfirmed = answer.is_err();
                answer
            }
        };
        worker.call_ended(answer.is_ok(), call.sent_ms, now, &mut fx);
        call.answer = Some(answer);
        if self.calls.iter().any(|c| c.in_flight) {
            return fx.0;
        }
        self.finish(worker, now, host, &mut fx);
        if matches!(self.phase, Phase::Admitted | Phase::Failed | Phase::Done) && self.request_held {
            self.request_held = false;
            fx.push(Effect::ResumeRequest);
        }
        fx.0
    }

    fn handle_response_headers(
        &mut self,
        worker: &Worker,
        now: &Now,
        end_of_stream: bool,
        host: &dyn Host,
    ) -> Vec<Effect> {
        let mut fx = worker.effects();
        if !matches!(self.phase, Phase::Admitted | Phase::Failed) {
            return fx.0;
        }
        self.phase = Phase::Streaming;
        for (name, value) in &self.response_headers {
            fx.push(Effect::AddResponseHeader { name, value: value.clone() });
        }
        if let Some(waited) = self.waited_ms {
            let theirs = host.response_header(SERVER_TIMING);
            let theirs = theirs.as_deref().map(String::from_utf8_lossy);
            let value = server_timing(theirs.as_deref(), waited);
            fx.push(Effect::SetResponseHeader { name: SERVER_TIMING, value });
        }
        if self.calls[0].admitted {
            Upstream::observe_load(worker, &self.calls[0], host);
        }
        let adjustments: Vec<_> =
            self.calls.iter().filter(|c| c.admitted).flat_map(|c| c.adjustments(&worker.doc, host)).collect();
        if !adjustments.is_empty() {
            fx.defer(ADJUST_PATH, &AdjustRequest { adjustments, now_us: None }, Vec::new());
        }
        self.start_metering(worker, host, &mut fx);
        self.upstream.report(worker, &self.calls[0], &mut self.ids, now, host, &mut fx);
        if end_of_stream {
            self.settle_metering(worker, true, &mut fx);
            self.release_at_end(worker, now, &mut fx);
            return fx.0;
        }
        self.release.expect_body(&self.calls, host);
        fx.0
    }

    /// The response's last byte has reached the flow: its leases are
    /// released from the stream, its end held until they are (and its
    /// token settlement) answered.
    fn release_at_end(&mut self, worker: &Worker, now: &Now, fx: &mut Effects) {
        self.release.at_end(worker, &mut self.calls, &mut self.ids, now, fx);
        let held = self.release.holds() || self.bodies.holds();
        self.phase = if held { Phase::Settling } else { Phase::Done };
    }

    /// Lets the response go on once no release, feedback or settlement holds it.
    fn resume_response(&mut self, fx: &mut Effects) {
        if self.release.holds() || self.upstream.holds() || self.bodies.holds() {
            return;
        }
        if self.phase == Phase::Settling {
            self.phase = Phase::Done;
        }
        if self.response_held {
            self.response_held = false;
            fx.push(Effect::ResumeResponse);
        }
    }

    fn refuse(&mut self, worker: &Worker, reply: LocalReply, verdict: Verdict, fx: &mut Effects) {
        let reply = self.with_verdict(worker, reply, verdict);
        self.refuse_with(Rc::new(reply), fx);
    }

    /// Refuses the request with `reply`, complete.
    fn refuse_with(&mut self, reply: Rc<LocalReply>, fx: &mut Effects) {
        self.phase = Phase::Refused;
        fx.push(Effect::Reply(reply));
    }

    /// `reply` with `x-sluice-verdict`, if the document asks for it.
    fn with_verdict(&self, worker: &Worker, mut reply: LocalReply, verdict: Verdict) -> LocalReply {
        if worker.doc.verdict_header {
            reply.headers.push((VERDICT_HEADER.into(), verdict.as_str().into()));
        }
        reply
    }

    /// Adds `x-sluice-verdict` to the response of a request let through,
    /// if the document asks for it.
    fn tell(&mut self, worker: &Worker, verdict: Verdict) {
        if worker.doc.verdict_header {
            self.response_headers.push((VERDICT_HEADER, verdict.as_str().into()));
        }
    }
}
