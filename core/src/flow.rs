//! One request's flow, as a sans-IO state machine: events in, effects out.
//!
//! For each request: match the policies, refuse at once from the shedder,
//! the over-limit cache or an open breaker, spend a leased policy's token,
//! else ask the shim and admit or refuse the request. After an admission:
//! add the response headers, report upstream feedback, release the
//! request's leases, and correct the points it was charged once the
//! response tells its true cost.
//!
//! [`Flow`] does no I/O. Its methods sort into four kinds, as in a sans-IO
//! protocol machine:
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
//! **Releases.** A lease is released when the response's last bytes reach
//! the flow, and they are held until the shim confirms the release: a
//! client that sends its next request the moment it sees the response end
//! finds its slot free. The last bytes are the chunk that ends the stream,
//! or, when the response has a `content-length`, the chunk that completes
//! it: an HTTP/1.1 client has the whole response then, before the stream's
//! end reaches the filter. A stream that ends any other way (reset, error,
//! timeout) queues its release for the worker, whose calls outlive the
//! stream. Each lease is released exactly once.

mod bodies;

use std::rc::Rc;

use sluice_policies::llm::Reservation;
use sluice_policies::load::{pool_occupancy, Signal};
use sluice_policies::units::Millis;
use sluice_policies::wire::{
    AdjustRequest, Check, CheckOutcome, CheckResponse, Encoding, FeedbackRequest, ReleaseRequest,
    RenewRequest, Views, WireLimit, ADJUST_PATH, CHECK_PATH, FEEDBACK_PATH, RELEASE_PATH,
};
use sluice_policies::{Applied, Evaluation, FailureMode, HeadersMode, Limit, Policy, Request};

use crate::cache::{Hit, OverLimitCache};
use crate::check_call::CheckCall;
use crate::decision::{read_answer, retry_after_secs};
use crate::effect::{CallId, CallResult, Effect, Effects, Outgoing};
use crate::feedback;
use crate::host::Host;
use crate::leased::{Pool, Token};
use crate::llm::Metered;
use crate::local_reply::LocalReply;
use crate::now::Now;
use crate::ratelimit_headers::{Fields, RateLimitHeaders};
use crate::shedding::REPORT_MS;
use crate::stats::{ClassStat, FilterStat, PolicyStat};
use crate::verdict::{Verdict, VERDICT_HEADER};
use crate::wait::{call_timeout_ms, overran_lease, request_wait_ms, server_timing, SERVER_TIMING};
use crate::worker::{update_pool, Worker};

/// The header that tells a client a shadow policy would have refused it.
pub const SHADOW_HEADER: &str = "x-sluice-shadow";

/// The enforced check's call id, and the shadow check's; others count from here.
/// The check and its answer go in the binary wire (docs/performance.md,
/// "Levers measured"); the other calls in JSON.
pub const CHECK_ENCODING: Encoding = Encoding::Binary;

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
    phase: Phase,
    /// The enforced call first, then the shadow call; either may be empty.
    calls: [CheckCall; 2],
    /// The host holds the request (it was told so): its admission resumes it.
    request_held: bool,
    /// The host holds the response: the last release's answer resumes it.
    response_held: bool,
    /// In the response's headers callback: a feedback report in flight holds them.
    in_response_headers: bool,
    /// Headers to add to the upstream's response of an admitted request.
    response_headers: Vec<(&'static str, String)>,
    /// Releases sent at the response's end, whose answers hold its last
    /// byte: (call, the release, the policies whose slots it frees).
    releasing: Vec<(CallId, ReleaseRequest, Vec<usize>)>,
    /// Upstream feedback sent from this stream, while the response's
    /// headers wait for the shim to record the pause.
    reporting: Option<(CallId, FeedbackRequest)>,
    /// For a response with a `content-length` whose end releases leases:
    /// the bytes still to come.
    body_left: Option<u64>,
    /// How long the shim held an admitted request, for `server-timing`.
    waited_ms: Option<u64>,
    /// `x-sluice-shadow` values of shadow policies that would have denied
    /// the request for a missing key (with `shadow_header` only).
    shadow_notes: Vec<String>,
    /// The request's priority class (0 without classes).
    class: usize,
    /// Leased policies (document indexes) whose token this request took;
    /// put back if the request is refused after all.
    /// (With the hot key's pool, for a policy leased per key.)
    spent: Vec<(usize, Option<String>, Token)>,
    /// With `headers: always`: the `RateLimit` view of each leased policy
    /// whose token this request took: (policy, remaining, ms to reset).
    leased_views: Vec<(usize, u64, u64)>,
    /// What each policy with an `llm` reserved (the document's index), from the request's body.
    reservations: Vec<(usize, Reservation)>,
    /// The response's metering, for an admitted request with an `llm` policy.
    metered: Option<Box<Metered>>,
    /// The token settlement sent at the response's end, whose answer holds
    /// its last byte.
    settling: Option<(CallId, AdjustRequest)>,
    next_call: u32,
}

impl Flow {
    pub fn new(worker: Rc<Worker>) -> Flow {
        Flow {
            worker,
            phase: Phase::Matching,
            calls: [CheckCall::new(), CheckCall::new()],
            request_held: false,
            response_held: false,
            in_response_headers: false,
            response_headers: Vec::new(),
            releasing: Vec::new(),
            reporting: None,
            body_left: None,
            waited_ms: None,
            shadow_notes: Vec::new(),
            class: 0,
            spent: Vec::new(),
            leased_views: Vec::new(),
            reservations: Vec::new(),
            metered: None,
            settling: None,
            next_call: FIRST_OTHER,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether the host must hold the request now; asked once the request
    /// headers' effects are performed. While the body is being read the
    /// headers are held too (the host must still hand over the body, as
    /// Envoy does with `allow_on_headers_stop_iteration`): only an admitted
    /// request goes upstream, headers and body together.
    pub fn hold_request(&mut self) -> bool {
        let hold = matches!(self.phase, Phase::Reading | Phase::Checking | Phase::Waiting | Phase::Refused);
        self.request_held |= matches!(self.phase, Phase::Checking | Phase::Waiting);
        hold
    }

    /// Whether the host must hold the request's body now (buffered, not
    /// sent on); asked once a body chunk's effects are performed.
    pub fn hold_request_body(&mut self) -> bool {
        self.phase == Phase::Reading || self.hold_request()
    }

    /// Whether the host must hold the response now; asked once a response
    /// event's effects are performed.
    pub fn hold_response(&mut self) -> bool {
        let hold = !self.releasing.is_empty()
            || self.settling.is_some()
            || (self.in_response_headers && self.reporting.is_some());
        self.response_held |= hold;
        hold
    }

    /// The request's headers: match, decide locally or ask the shim; or,
    /// when a policy that reads bodies may apply, read the body first
    /// (`Reading`: the face hands it over with [`Flow::handle_request_body`]).
    pub fn handle_request_headers(&mut self, now: &Now, req: &impl Request, host: &dyn Host) -> Vec<Effect> {
        if self.worker.doc.reads_body() && self.worker.doc.needs_body(req) {
            self.phase = Phase::Reading;
            return Vec::new();
        }
        self.decide(now, req, host)
    }

    /// The request is known (its headers, and its body if read): match,
    /// decide locally or ask the shim.
    fn decide(&mut self, now: &Now, req: &impl Request, host: &dyn Host) -> Vec<Effect> {
        let mut fx = self.worker.effects();
        let worker = self.worker.clone();
        let evaluation = match worker.doc.evaluate(req) {
            Ok(evaluation) => evaluation,
            Err(policy) => {
                self.refuse(LocalReply::missing_key(policy), Verdict::MissingKey, &mut fx);
                return fx.0;
            }
        };
        self.class = evaluation.class;
        if let Some(reply) = self.shed(&worker, &evaluation, &mut fx) {
            self.refuse(reply, Verdict::Shed, &mut fx);
            return fx.0;
        }
        for &index in &evaluation.shadow_missing_key {
            self.shadow_missing_key(&worker, index, &mut fx);
        }
        if let Some(denial) = self.spend_tokens(&worker, &evaluation, req, now, host, &mut fx) {
            self.deny_from_cache(&worker, denial, now, host, &mut fx);
            return fx.0;
        }
        let enforced = crate::plan::enforced(&evaluation).map(|a| a.policy);
        self.calls[0].wait_ms = request_wait_ms(enforced);
        if self.calls.iter().all(|c| c.checks.is_empty()) {
            let notes = std::mem::take(&mut self.shadow_notes);
            self.response_headers.extend(notes.into_iter().map(|note| (SHADOW_HEADER, note)));
            if let Some(h) = self.leased_headers(&worker, None) {
                self.response_headers.push((RateLimitHeaders::POLICY, h.policy));
                self.response_headers.push((RateLimitHeaders::RATELIMIT, h.ratelimit));
            }
            if evaluation.iter().next().is_some() {
                self.tell(Verdict::Allowed);
            }
            self.phase = if self.response_headers.is_empty() { Phase::Done } else { Phase::Admitted };
            self.settle_tokens(true, now, host, &mut fx);
            return fx.0;
        }
        let now = now.ms();
        if self.decide_locally(&worker, now, host, &mut fx) {
            return fx.0;
        }
        let timeout = worker.doc.shim.timeout_ms.get();
        // An admitted request's reset is read only for `headers: always`.
        let views = match worker.doc.headers {
            HeadersMode::Always => Views::All,
            HeadersMode::Off | HeadersMode::OnDeny => Views::NoResetWhenAdmitted,
        };
        for (id, call) in [ENFORCED, SHADOW].into_iter().zip(&mut self.calls) {
            if call.checks.is_empty() {
                continue;
            }
            call.sent_ms = now;
            // Named only when sent: most streams never need an id.
            call.id = worker.next_id();
            match CHECK_ENCODING.encode(&call.request(views)) {
                Ok(body) => {
                    call.in_flight = true;
                    call.unconfirmed = true;
                    let timeout_ms = call_timeout_ms(timeout, call.wait_ms);
                    let encoding = CHECK_ENCODING;
                    fx.push(Effect::Send(Outgoing { id, path: CHECK_PATH, encoding, body, timeout_ms }));
                }
                Err(err) => {
                    worker.call_ended(false, now, now, &mut fx);
                    call.answer = Some(Err(format!("cannot encode the check: {err}")));
                }
            }
        }
        if self.calls.iter().any(|c| c.in_flight) {
            self.phase = if self.calls[0].in_flight && self.calls[0].wait_ms > 0 {
                Phase::Waiting
            } else {
                Phase::Checking
            };
            return fx.0;
        }
        self.finish(now, host, &mut fx);
        fx.0
    }

    /// What became of one of this stream's calls.
    pub fn handle_answer(
        &mut self,
        now: &Now,
        id: CallId,
        result: CallResult,
        host: &dyn Host,
    ) -> Vec<Effect> {
        let mut fx = self.worker.effects();
        let worker = self.worker.clone();
        if let Some(at) = self.releasing.iter().position(|(c, ..)| *c == id) {
            let (_, request, policies) = self.releasing.swap_remove(at);
            match result {
                CallResult::NotSent(reason) => {
                    log::debug!("cannot release at the response's end ({reason}); the worker will");
                    fx.defer(RELEASE_PATH, &request, policies);
                }
                CallResult::Answered { status, body } => {
                    worker.release_answered(&policies, status.as_deref(), body.as_deref(), now.ms(), &mut fx)
                }
            }
            self.resume_response(&mut fx);
            return fx.0;
        }
        if self.settling.as_ref().is_some_and(|(c, _)| *c == id) {
            self.settled(result, &mut fx);
            return fx.0;
        }
        if self.reporting.as_ref().is_some_and(|(c, _)| *c == id) {
            let Some((_, feedback)) = self.reporting.take() else { return fx.0 };
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
            self.resume_response(&mut fx);
            return fx.0;
        }
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
                Err(reason)
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
        self.finish(now, host, &mut fx);
        if matches!(self.phase, Phase::Admitted | Phase::Failed | Phase::Done) && self.request_held {
            self.request_held = false;
            fx.push(Effect::ResumeRequest);
        }
        fx.0
    }

    /// The upstream's response headers.
    pub fn handle_response_headers(
        &mut self,
        now: &Now,
        end_of_stream: bool,
        host: &dyn Host,
    ) -> Vec<Effect> {
        let mut fx = self.worker.effects();
        self.in_response_headers = true;
        if !matches!(self.phase, Phase::Admitted | Phase::Failed) {
            return fx.0;
        }
        self.phase = Phase::Streaming;
        let worker = self.worker.clone();
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
            self.observe_load(&worker, host);
        }
        let adjustments: Vec<_> =
            self.calls.iter().filter(|c| c.admitted).flat_map(|c| c.adjustments(&worker.doc, host)).collect();
        if !adjustments.is_empty() {
            fx.defer(ADJUST_PATH, &AdjustRequest { adjustments, now_us: None }, Vec::new());
        }
        self.start_metering(host, &mut fx);
        self.upstream_feedback(&worker, now, host, &mut fx);
        if end_of_stream {
            self.settle_metering(true, &mut fx);
        }
        if end_of_stream {
            self.release_at_end(now, &mut fx);
            return fx.0;
        }
        if self.calls.iter().any(|c| c.lease.is_some()) {
            self.body_left = host
                .response_header("content-length")
                .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok());
        }
        fx.0
    }

    /// A chunk of the response's body, `size` bytes.
    pub fn handle_response_body(
        &mut self,
        now: &Now,
        size: usize,
        end_of_stream: bool,
        host: &dyn Host,
    ) -> Vec<Effect> {
        let mut fx = self.worker.effects();
        self.in_response_headers = false;
        self.meter_body(size, end_of_stream, host, &mut fx);
        if self.phase != Phase::Streaming {
            return fx.0;
        }
        let completes = match &mut self.body_left {
            Some(left) if *left <= size as u64 => true,
            Some(left) => {
                *left -= size as u64;
                false
            }
            None => false,
        };
        if end_of_stream || completes {
            self.release_at_end(now, &mut fx);
        }
        fx.0
    }

    /// The response's trailers: its end.
    pub fn handle_response_trailers(&mut self, now: &Now) -> Vec<Effect> {
        let mut fx = self.worker.effects();
        self.in_response_headers = false;
        self.settle_metering(true, &mut fx);
        if self.phase == Phase::Streaming {
            self.release_at_end(now, &mut fx);
        }
        fx.0
    }

    /// The stream ended (its log, then its teardown; either may come alone):
    /// whatever it still holds is queued for the worker, exactly once, and
    /// the tokens of a request reset before its decision go back.
    pub fn handle_stream_end(&mut self, now: &Now, host: &dyn Host) -> Vec<Effect> {
        let mut fx = self.worker.effects();
        self.release_leases(now, &mut fx);
        // Ended before its response did: what it used is not known.
        self.settle_metering(false, &mut fx);
        // Reset before its decision: the tokens go back.
        self.settle_tokens(false, now, host, &mut fx);
        self.phase = match self.phase {
            Phase::Refused => Phase::Refused,
            _ => Phase::Done,
        };
        fx.0
    }

    fn refuse(&mut self, reply: LocalReply, verdict: Verdict, fx: &mut Effects) {
        let reply = self.with_verdict(reply, verdict);
        self.refuse_with(Rc::new(reply), fx);
    }

    /// Refuses the request with `reply`, complete.
    fn refuse_with(&mut self, reply: Rc<LocalReply>, fx: &mut Effects) {
        self.phase = Phase::Refused;
        fx.push(Effect::Reply(reply));
    }

    /// `reply` with `x-sluice-verdict`, if the document asks for it.
    fn with_verdict(&self, mut reply: LocalReply, verdict: Verdict) -> LocalReply {
        if self.worker.doc.verdict_header {
            reply.headers.push((VERDICT_HEADER.into(), verdict.as_str().into()));
        }
        reply
    }

    /// Adds `x-sluice-verdict` to the response of a request let through,
    /// if the document asks for it.
    fn tell(&mut self, verdict: Verdict) {
        if self.worker.doc.verdict_header {
            self.response_headers.push((VERDICT_HEADER, verdict.as_str().into()));
        }
    }

    /// The request's decision once every call it made has answered (or none
    /// was needed). `now` is the callback's clock.
    fn finish(&mut self, now: u64, host: &dyn Host, fx: &mut Effects) {
        let worker = self.worker.clone();
        let shadow = self.calls[1].answer.take();
        let mut shadow_notes = std::mem::take(&mut self.shadow_notes);
        if let Some(note) = shadow.and_then(|answer| self.conclude_shadow(&worker, answer, now, fx)) {
            shadow_notes.push(note);
        }
        let enforced = self.calls[0].answer.take();
        match enforced {
            None => {
                if let Some(h) = self.leased_headers(&worker, None) {
                    self.response_headers.push((RateLimitHeaders::POLICY, h.policy));
                    self.response_headers.push((RateLimitHeaders::RATELIMIT, h.ratelimit));
                }
                self.phase = Phase::Admitted;
            }
            Some(Ok(resp)) if resp.allowed => {
                self.admit(&worker, &resp, 0, now, fx);
                if worker.doc.headers == HeadersMode::Always {
                    let shim = self.ratelimit_headers(&worker, &resp);
                    if let Some(h) = self.leased_headers(&worker, shim) {
                        self.response_headers.push((RateLimitHeaders::POLICY, h.policy));
                        self.response_headers.push((RateLimitHeaders::RATELIMIT, h.ratelimit));
                    }
                }
                self.phase = Phase::Admitted;
            }
            Some(Ok(resp)) => self.deny(&worker, &resp, &shadow_notes, now, host, fx),
            Some(Err(reason)) => self.fail(&worker, &reason, now, fx),
        }
        let through = matches!(self.phase, Phase::Admitted | Phase::Failed);
        if through {
            self.response_headers.extend(shadow_notes.into_iter().map(|note| (SHADOW_HEADER, note)));
            self.tell(if self.phase == Phase::Failed { Verdict::FailureAllowed } else { Verdict::Allowed });
        }
        self.settle_tokens(through, &Now::at(now), host, fx);
    }

    /// Builds the checks of the policies that apply, after two local
    /// steps. Leased mode: takes a token from each leased policy's pool; a
    /// policy whose pool has none is checked by the shim exactly, as
    /// without a lease. The over-limit cache: an enforced check it holds a
    /// live denial for ends the request's checks there, before the check is
    /// built: the policy, that denial and its limit as the check would send
    /// it, returned.
    fn spend_tokens(
        &mut self,
        worker: &Worker,
        evaluation: &Evaluation,
        req: &impl Request,
        now: &Now,
        host: &dyn Host,
        fx: &mut Effects,
    ) -> Option<(usize, Hit, Option<WireLimit>)> {
        if evaluation.iter().next().is_none() {
            return None; // nothing applies: not even the clock is read
        }
        let cache = OverLimitCache::new(host, worker.doc.over_limit_cache_slots.get())
            .with_mirror(&worker.over_limit);
        let now = now.ms();
        let enforce = |calls: &mut CheckCall, a: &Applied<'_>| {
            let reserved = a.reserved(req);
            let Some(hit) = cache.lookup_applied(a, req, reserved, now) else {
                calls.push(a.index, a.check_reserving(req, reserved));
                return None;
            };
            log::debug!("policy {} denies key {} from the over-limit cache", a.policy.name, a.key);
            Some((a.index, hit, a.wire_limits(req, reserved).nth(hit.limit)))
        };
        for a in crate::plan::shadow(evaluation) {
            self.calls[1].push(a.index, a.check(req));
        }
        for a in crate::plan::enforced(evaluation) {
            if a.policy.leased.is_none() {
                match enforce(&mut self.calls[0], a) {
                    Some(hit) => return Some(hit),
                    None => continue,
                }
            }
            let spend = |pool: &mut Pool| pool.spend(now).map(|token| (token, pool.view(now)));
            let per_key = worker.leased_per_key(a.index);
            let hot = if per_key { worker.hot_pool(a.index, &a.key, now) } else { None };
            if per_key && hot.is_none() {
                // Not a hot key: the long tail is checked exactly.
                match enforce(&mut self.calls[0], a) {
                    Some(hit) => return Some(hit),
                    None => continue,
                }
            }
            let spent =
                hot.as_deref().or(worker.pool_key(a.index)).and_then(|key| update_pool(host, key, spend));
            match spent {
                Some(Some((token, (remaining, reset_ms)))) => {
                    self.spent.push((a.index, hot, token));
                    if worker.doc.headers == HeadersMode::Always {
                        self.leased_views.push((a.index, remaining, reset_ms));
                    }
                }
                _ => {
                    fx.count(a.index, PolicyStat::LeaseEmpty);
                    if let Some(hit) = enforce(&mut self.calls[0], a) {
                        return Some(hit);
                    }
                }
            }
        }
        None
    }

    /// Policy `index` denies the request from the over-limit cache (`hit`):
    /// its denial, with no call; the tokens the request took go back. The
    /// denial is the worker's last one for the policy while its limit and
    /// its fields (all it shows of the hit) are the same.
    fn deny_from_cache(
        &mut self,
        worker: &Worker,
        (index, hit, limit): (usize, Hit, Option<WireLimit>),
        now: &Now,
        host: &dyn Host,
        fx: &mut Effects,
    ) {
        let Some(policy) = worker.doc.policies.get(index) else { return };
        fx.count(index, PolicyStat::CacheDenied);
        self.settle_tokens(false, now, host, fx);
        let secs = retry_after_secs(Some(Millis(hit.wait_ms)));
        // All the reply shows of the hit: the limit and its fields (the
        // wait in whole seconds is RateLimit's t and Retry-After alike).
        let fields = limit.map(|l| Fields::refused(&l, Millis(hit.wait_ms)));
        let shown = (hit.limit, secs, fields.map_or(0, |f| f.remaining));
        if self.shadow_notes.is_empty() {
            if let Some(reply) = worker.cached_denial(index, shown) {
                return self.refuse_with(reply, fx);
            }
        }
        let headers = match (worker.doc.headers, limit.zip(fields)) {
            (HeadersMode::Off, _) | (_, None) => None,
            (_, Some((limit, fields))) => Some(RateLimitHeaders::of(policy.name.as_str(), &limit, fields)),
        };
        let mut reply = LocalReply::denial(policy, secs, headers);
        let notes = std::mem::take(&mut self.shadow_notes);
        let kept = notes.is_empty();
        reply.headers.extend(notes.into_iter().map(|note| (SHADOW_HEADER.into(), note.into())));
        let reply = Rc::new(self.with_verdict(reply, Verdict::CacheDenied));
        if kept {
            worker.keep_denial(index, shown, &reply);
        }
        self.refuse_with(reply, fx);
    }

    /// The request's decision is made: its spent tokens count as admitted
    /// requests, or go back to their pools if it was refused.
    fn settle_tokens(&mut self, admitted: bool, now: &Now, host: &dyn Host, fx: &mut Effects) {
        if self.spent.is_empty() {
            return;
        }
        let now = now.ms();
        for (index, hot, token) in std::mem::take(&mut self.spent) {
            if admitted {
                fx.count(index, PolicyStat::Allowed);
                fx.count(index, PolicyStat::Leased);
                continue;
            }
            if let Some(key) = hot.as_deref().or(self.worker.pool_key(index)) {
                update_pool(host, key, |pool| pool.unspend(token, now));
            }
        }
    }

    /// Counts the shadow call's answer; the `x-sluice-shadow` value if it would have denied.
    fn conclude_shadow(
        &mut self,
        worker: &Worker,
        answer: Result<CheckResponse, String>,
        now: u64,
        fx: &mut Effects,
    ) -> Option<String> {
        match answer {
            Ok(resp) if resp.allowed => {
                self.admit(worker, &resp, 1, now, fx);
                None
            }
            Ok(resp) => {
                let call = &self.calls[1];
                let i = resp.denied_check()?;
                let index = *call.policies.get(i)?;
                fx.count(index, PolicyStat::ShadowDenied);
                let name = call.checks.get(i).map(|c| c.policy.as_str()).unwrap_or_default();
                log::debug!("shadow policy {name} would deny");
                worker.doc.shadow_header.then(|| shadow_note(name))
            }
            Err(reason) => {
                for &index in &self.calls[1].policies {
                    failure_passed(worker, index, fx);
                }
                worker.log_failure(now, &format!("{reason}; shadow policies let the request through"));
                None
            }
        }
    }

    /// Load shedding: the first enforced policy that sheds this request's
    /// class, by its fraction now, refuses it (503, `temporary-reduced-capacity`)
    /// with no shim call.
    fn shed(&self, worker: &Worker, evaluation: &Evaluation, fx: &mut Effects) -> Option<LocalReply> {
        let shedding = worker.shedding.borrow();
        if !shedding.any() {
            return None;
        }
        let shed = crate::plan::enforced(evaluation)
            .filter(|a| a.policy.shed.is_some())
            .find(|a| shedding.sheds(a.index, self.class, worker.draw()))?;
        fx.count(shed.index, PolicyStat::Shed);
        fx.count_class(self.class, ClassStat::Shed);
        let retry_after = REPORT_MS.div_ceil(1000);
        Some(LocalReply::reduced_capacity(shed.policy, worker.doc.classes.name(self.class), retry_after))
    }

    /// The utilization the upstream's response reports, for each admitted
    /// policy that sheds by a response header.
    fn observe_load(&self, worker: &Worker, host: &dyn Host) {
        let mut shedding = worker.shedding.borrow_mut();
        for &index in &self.calls[0].policies {
            let Some(shed) = worker.doc.policies.get(index).and_then(|p| p.shed.as_ref()) else { continue };
            if let Some(utilization) = shed.signal.read(|name: &str| host.response_header(name)) {
                shedding.observe(index, utilization);
            }
        }
    }

    /// Counts an admission by call `which` and keeps its lease, and how long
    /// the shim held it (the wait stats exist for policies with `wait` only).
    fn admit(&mut self, worker: &Worker, resp: &CheckResponse, which: usize, now: u64, fx: &mut Effects) {
        if which == 0 {
            fx.count_class(self.class, ClassStat::Allowed);
        }
        let call = &mut self.calls[which];
        call.admitted = true;
        call.admitted_ms = now;
        // Held: the shim says so with a non-zero `waited_ms`.
        let held = resp.waited_ms.map_or(0, Millis::get);
        if which == 0 {
            self.waited_ms = (held > 0).then_some(held);
        }
        for (i, &index) in call.policies.iter().enumerate() {
            fx.count(index, PolicyStat::Allowed);
            fx.count(index, if held > 0 { PolicyStat::Waited } else { PolicyStat::Immediate });
            fx.add(index, PolicyStat::WaitMs, held);
            if held > 0 && resp.checks.get(i).is_some_and(|c| c.paused_ms.is_some()) {
                fx.count(index, PolicyStat::PausedWaited);
            }
            let reclaimed: u64 = resp.checks.get(i).map_or(0, |c| c.limits.iter().map(|l| l.reclaimed).sum());
            if reclaimed > 0 {
                fx.add(index, PolicyStat::Reclaimed, reclaimed);
            }
        }
        if which == 0 {
            observe_pools(worker, &call.policies, &call.checks, resp);
        }
        call.lease = resp.lease.clone();
        if let Some(lease) = &call.lease {
            let request = RenewRequest { lease: lease.clone(), checks: call.checks.clone() };
            worker.live.borrow_mut().hold(request, call.admitted_ms);
        }
        // Only a points limit corrected after the response needs the outcomes.
        if call.corrects_costs(&worker.doc) {
            call.charged = resp.checks.clone();
        }
    }

    /// The partner's answer to an admitted request: pauses for the policies
    /// that read upstream feedback, counted and sent to the shim from this
    /// stream. The response's headers wait until the shim has recorded the
    /// pause, so every call checked after the client sees the partner's
    /// "slow down" is paused, on every gateway. A pause that cannot be sent
    /// from here goes through the worker.
    fn upstream_feedback(&mut self, worker: &Worker, now: &Now, host: &dyn Host, fx: &mut Effects) {
        let call = &self.calls[0];
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
                let id = self.call_id();
                let timeout_ms = worker.doc.shim.timeout_ms.get().into();
                fx.push(Effect::Send(Outgoing {
                    id,
                    path: FEEDBACK_PATH,
                    encoding: Encoding::Json,
                    body,
                    timeout_ms,
                }));
                self.reporting = Some((id, request));
            }
            Err(err) => log::warn!("cannot encode {FEEDBACK_PATH}: {err}"),
        }
    }

    fn call_id(&mut self) -> CallId {
        let id = CallId(self.next_call);
        self.next_call = self.next_call.wrapping_add(1).max(FIRST_OTHER);
        id
    }

    /// The shim denied: count it, remember it in the over-limit cache, answer.
    fn deny(
        &mut self,
        worker: &Worker,
        resp: &CheckResponse,
        shadow_notes: &[String],
        now: u64,
        host: &dyn Host,
        fx: &mut Effects,
    ) {
        let call = &self.calls[0];
        let i = resp.denied_check().unwrap_or(0);
        let (Some(&index), Some(check), Some(outcome)) =
            (call.policies.get(i), call.checks.get(i), resp.checks.get(i))
        else {
            return self.fail(worker, "shim denied without saying which check", now, fx);
        };
        let Some(policy) = worker.doc.policies.get(index) else {
            self.phase = Phase::Admitted;
            return;
        };
        fx.count(index, PolicyStat::Denied);
        fx.count_class(self.class, ClassStat::Denied);
        if outcome.paused_ms.is_some() {
            fx.count(index, PolicyStat::PausedDenied);
        }
        if call.wait_ms > 0 {
            // The shim refuses a waiting request only when its slot lies
            // further away than the wait.
            fx.count(index, PolicyStat::WaitTimeout);
        }
        log::debug!("policy {} denies key {}", policy.name, check.key);
        OverLimitCache::new(host, worker.doc.over_limit_cache_slots.get())
            .with_mirror(&worker.over_limit)
            .record(policy, check, outcome, call.sent_ms);
        let headers = match worker.doc.headers {
            HeadersMode::Off => None,
            _ => self.ratelimit_headers(worker, resp).map(|(h, _)| h),
        };
        let retry_after = retry_after_secs(resp.retry_after_ms);
        let mut reply = if held_out_by_reserve(policy, outcome) {
            LocalReply::reduced_capacity(policy, worker.doc.classes.name(self.class), retry_after)
        } else {
            LocalReply::denial(policy, retry_after, headers)
        };
        reply.headers.extend(shadow_notes.iter().map(|note| (SHADOW_HEADER.into(), note.clone().into())));
        let verdict = if held_out_by_reserve(policy, outcome) { Verdict::Shed } else { Verdict::Denied };
        self.refuse(reply, verdict, fx);
    }

    /// The shim gave no usable answer: `failure_mode` decides. Deny wins if
    /// any enforced policy that applies says deny; its status is the first such one's.
    fn fail(&mut self, worker: &Worker, reason: &str, now: u64, fx: &mut Effects) {
        let call = &self.calls[0];
        let deny_status = call.policies.iter().find_map(|&index| {
            let policy = worker.doc.policies.get(index)?;
            match worker.doc.failure_of(policy) {
                (FailureMode::Deny, status) => Some((policy.name.as_str(), status.get())),
                (FailureMode::Allow, _) => None,
            }
        });
        for &index in &call.policies {
            if deny_status.is_some() {
                fx.count(index, PolicyStat::FailureDenied);
            } else {
                failure_passed(worker, index, fx);
            }
        }
        match deny_status {
            Some((name, status)) => {
                worker.log_failure(
                    now,
                    &format!("{reason}; failure_mode deny (policy {name}) answers {status}"),
                );
                self.refuse(LocalReply::unavailable(status), Verdict::FailureDenied, fx);
            }
            None => {
                worker.log_failure(now, &format!("{reason}; failure_mode allow lets the request through"));
                self.phase = Phase::Failed;
            }
        }
    }

    /// The most restrictive of the enforced call's limits.
    /// The `RateLimit` headers of a request that took leased tokens: the
    /// leased policy with the fewest remaining, unless the shim's answer
    /// (`shim`, the most restrictive of the checked limits) has fewer.
    fn leased_headers(
        &self,
        worker: &Worker,
        shim: Option<(RateLimitHeaders, u64)>,
    ) -> Option<RateLimitHeaders> {
        let leased = self.leased_views.iter().min_by_key(|(_, remaining, _)| *remaining).and_then(
            |&(index, remaining, reset_ms)| {
                let policy = worker.doc.policies.get(index)?;
                let limit = policy.limits.first()?;
                let fields = Fields { remaining, wait_ms: reset_ms };
                let headers =
                    RateLimitHeaders::of(policy.name.as_str(), &WireLimit::with_cost(limit, 1), fields);
                Some((headers, remaining))
            },
        );
        match (shim, leased) {
            (Some(s), Some(l)) => Some(if l.1 < s.1 { l.0 } else { s.0 }),
            (s, l) => s.or(l).map(|(h, _)| h),
        }
    }

    fn ratelimit_headers(&self, worker: &Worker, resp: &CheckResponse) -> Option<(RateLimitHeaders, u64)> {
        let call = &self.calls[0];
        // Each limit as sent (a `points` limit with the request's cost).
        let limits = call.policies.iter().zip(&call.checks).zip(&resp.checks).filter_map(
            |((&index, check), outcome)| {
                let policy = worker.doc.policies.get(index)?;
                Some(check.limits.iter().zip(&outcome.limits).map(move |(l, o)| (policy.name.as_str(), l, o)))
            },
        );
        let remaining = call
            .policies
            .iter()
            .zip(&resp.checks)
            .flat_map(|(_, outcome)| outcome.limits.iter().map(|o| o.remaining))
            .min()?;
        RateLimitHeaders::most_restrictive(limits.flatten()).map(|h| (h, remaining))
    }

    /// The releases still to send: one per call that holds (or may hold) a
    /// lease, each taken once, each with whether the shim confirmed the
    /// lease (else it is released by the check's id, in case the shim took
    /// it unseen).
    fn leases_to_release(&mut self, now: &Now, fx: &mut Effects) -> Vec<(ReleaseRequest, Vec<usize>, bool)> {
        let worker = self.worker.clone();
        let mut out = Vec::new();
        for call in &mut self.calls {
            let confirmed = call.lease.is_some();
            let Some(lease) = call.lease_to_release(&worker.doc) else { continue };
            worker.live.borrow_mut().end(&lease);
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

    /// The response's last byte has reached the flow: release the leases
    /// now, from this stream, and hold that byte until the shim has
    /// answered, so the slot is free before the client sees the end. A
    /// release that cannot be sent goes to the worker instead.
    fn release_at_end(&mut self, now: &Now, fx: &mut Effects) {
        let worker = self.worker.clone();
        for (request, policies, confirmed) in self.leases_to_release(now, fx) {
            if !confirmed {
                // Most likely the shim failed and took nothing: not worth
                // holding the response's end for; the worker releases it.
                fx.defer(RELEASE_PATH, &request, policies);
                continue;
            }
            match serde_json::to_vec(&request) {
                Ok(body) => {
                    let id = self.call_id();
                    let timeout_ms = worker.doc.shim.timeout_ms.get().into();
                    fx.push(Effect::Send(Outgoing {
                        id,
                        path: RELEASE_PATH,
                        encoding: Encoding::Json,
                        body,
                        timeout_ms,
                    }));
                    self.releasing.push((id, request, policies));
                }
                Err(err) => log::warn!("cannot encode {RELEASE_PATH}: {err}"),
            }
        }
        let held = !self.releasing.is_empty() || self.settling.is_some();
        self.phase = if held { Phase::Settling } else { Phase::Done };
    }

    /// Exactly once per admitted request that holds leases, when the stream
    /// ends without a released response end: queued for the worker, whose
    /// calls outlive the stream. A release still in flight here is
    /// cancelled with the stream, so it is sent again (a second release of
    /// one lease ends nothing).
    fn release_leases(&mut self, now: &Now, fx: &mut Effects) {
        let worker = self.worker.clone();
        let held = &self.calls[0];
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
        for (_, request, policies) in std::mem::take(&mut self.releasing) {
            fx.defer(RELEASE_PATH, &request, policies);
        }
        if let Some((_, feedback)) = self.reporting.take() {
            // Cancelled with the stream: recording a pause twice extends nothing.
            fx.defer(FEEDBACK_PATH, &feedback, Vec::new());
        }
        for (request, policies, _) in self.leases_to_release(now, fx) {
            fx.defer(RELEASE_PATH, &request, policies);
        }
    }

    /// Lets the response go on once no release or feedback holds it.
    fn resume_response(&mut self, fx: &mut Effects) {
        if self.releasing.is_empty() && self.reporting.is_none() && self.settling.is_none() {
            if self.phase == Phase::Settling {
                self.phase = Phase::Done;
            }
            if self.response_held {
                self.response_held = false;
                fx.push(Effect::ResumeResponse);
            }
        }
    }

    /// A shadow policy that would have refused the request for its missing
    /// key: counted as a shadow denial, never a refusal.
    fn shadow_missing_key(&mut self, worker: &Worker, index: usize, fx: &mut Effects) {
        let Some(policy) = worker.doc.policies.get(index) else { return };
        fx.count(index, PolicyStat::ShadowDenied);
        log::debug!("shadow policy {} would deny: missing key", policy.name);
        if worker.doc.shadow_header {
            self.shadow_notes.push(shadow_note(policy.name.as_str()));
        }
    }

    /// The local decision before any call (the over-limit cache was read
    /// as the checks were built): the breaker. True when it decided.
    fn decide_locally(&mut self, worker: &Worker, now: u64, host: &dyn Host, fx: &mut Effects) -> bool {
        if worker.call_allowed(now, fx) {
            return false;
        }
        for call in &mut self.calls {
            if !call.checks.is_empty() {
                call.answer = Some(Err("the shim breaker is open".into()));
            }
        }
        self.finish(now, host, fx);
        true
    }
}

/// A shim failure let a request policy `index` applied to through: the
/// `failure_allowed` stat, and the worker's next report to the shim, which
/// never saw the request.
fn failure_passed(worker: &Worker, index: usize, fx: &mut Effects) {
    fx.count(index, PolicyStat::FailureAllowed);
    worker.failure_passed(index);
}

/// The `x-sluice-shadow` value for a shadow policy that would have denied.
fn shadow_note(policy: &str) -> String {
    format!("would-deny; policy=\"{policy}\"")
}

/// Whether a concurrency pool refused the request because its reserve holds
/// the request's class out: the service is short of capacity (503), not the
/// client over a quota.
fn held_out_by_reserve(policy: &Policy, outcome: &CheckOutcome) -> bool {
    policy.limits.iter().zip(&outcome.limits).any(|(limit, o)| !o.allowed && limit.reserve().is_some())
}

/// The occupancy of the pool of each admitted policy that sheds by it.
fn observe_pools(worker: &Worker, policies: &[usize], checks: &[Check], resp: &CheckResponse) {
    let mut shedding = worker.shedding.borrow_mut();
    for (i, &index) in policies.iter().enumerate() {
        let Some(policy) = worker.doc.policies.get(index) else { continue };
        if policy.shed.as_ref().is_none_or(|s| s.signal != Signal::Pool) {
            continue;
        }
        let (Some(check), Some(outcome)) = (checks.get(i), resp.checks.get(i)) else { continue };
        let pools = policy.limits.iter().zip(&check.limits).zip(&outcome.limits);
        for ((limit, wire), o) in pools {
            if let (Limit::Concurrency { limit: full, .. }, WireLimit::Concurrency { limit: pool, .. }) =
                (limit, wire)
            {
                // Held after this admission: the pool it saw less what remains.
                let held = u64::from(*pool).saturating_sub(o.remaining);
                shedding
                    .observe(index, pool_occupancy(full.get(), u64::from(full.get()).saturating_sub(held)));
            }
        }
    }
}
