//! The HTTP context: for each request, match the policies, deny at once from
//! the over-limit cache or an open breaker, else ask the shim and resume the
//! request or answer it. After an admitted request: add the response headers,
//! release its leases, and correct the points it was charged once the
//! response tells its true cost.
//!
//! A lease is released when the response's last bytes reach the filter, and
//! they are held until the shim confirms the release: a client that sends
//! its next request the moment it sees the response end finds its slot free.
//! The last bytes are the chunk that ends the stream, or, when the response
//! has a `content-length`, the chunk that completes it: an HTTP/1.1 client
//! has the whole response then, before the stream's end reaches the filter.
//! A stream that ends any other way (reset, error, timeout) queues its release
//! for the root context, whose calls outlive the stream.
//!
//! Enforced and shadow policies go to the shim in two calls, sent together:
//! each call is all-or-nothing, and a shadow policy's denial must neither
//! refuse the request nor keep the enforced policies from being charged.
//!
//! Egress waiting (see `wait`): the enforced call may ask the shim to hold
//! the request (`wait_ms`), and its timeout grows by as much; a held request
//! that passes gets `server-timing: sluice;dur=N` on its response. The shadow
//! call never waits.

use std::rc::Rc;

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MapType};
use sluice_policies::load::{pool_occupancy, Signal};
use sluice_policies::wire::WireLimit;
use sluice_policies::wire::{
    AdjustRequest, Check, CheckOutcome, CheckResponse, FeedbackRequest, ReleaseRequest, RenewRequest,
    ADJUST_PATH, FEEDBACK_PATH, RELEASE_PATH,
};
use sluice_policies::{Evaluation, FailureMode, HeadersMode, Limit, Policy};

use crate::cache::OverLimitCache;
use crate::call::Call;
use crate::callout::{call_answer, post_bytes, post_check};
use crate::decision::{read_answer, retry_after_secs};
use crate::feedback;
use crate::host::{now_ms, update_pool, HostRequest, SharedData};
use crate::leased::Token;
use crate::ratelimit_headers::RateLimitHeaders;
use crate::reply::Reply;
use crate::shedding::REPORT_MS;
use crate::vm::Vm;
use crate::wait::{overran_lease, request_wait_ms, server_timing, SERVER_TIMING};

const SHADOW_HEADER: &str = "x-sluice-shadow";

pub struct Sluice {
    vm: Option<Rc<Vm>>,
    /// The enforced call first, then the shadow call; either may be empty.
    calls: [Call; 2],
    /// Headers to add to the upstream's response of an admitted request.
    response_headers: Vec<(&'static str, String)>,
    admitted: bool,
    /// Releases sent at the response's end, whose answers hold its last
    /// byte: (token, the release, the policies whose slots it frees).
    releasing: Vec<(u32, ReleaseRequest, Vec<usize>)>,
    /// Upstream feedback sent from this stream: its token and body, while
    /// the response's headers wait for the shim to record the pause.
    reporting: Option<(u32, FeedbackRequest)>,
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
    spent: Vec<(usize, Token)>,
}

impl Sluice {
    pub fn new(vm: Option<Rc<Vm>>) -> Sluice {
        Sluice {
            vm,
            calls: [Call::new(), Call::new()],
            response_headers: Vec::new(),
            admitted: false,
            releasing: Vec::new(),
            reporting: None,
            body_left: None,
            waited_ms: None,
            shadow_notes: Vec::new(),
            class: 0,
            spent: Vec::new(),
        }
    }

    /// The request's decision once every call it made has answered (or none
    /// was needed): `Continue`, or `Pause` after a local response. `now` is
    /// the callback's clock, read once.
    fn finish(&mut self, vm: &Vm, now: u64) -> Action {
        let shadow = self.calls[1].answer.take();
        let mut shadow_notes = std::mem::take(&mut self.shadow_notes);
        if let Some(note) = shadow.and_then(|answer| self.conclude_shadow(vm, answer, now)) {
            shadow_notes.push(note);
        }
        let enforced = self.calls[0].answer.take();
        let action = match enforced {
            None => Action::Continue,
            Some(Ok(resp)) if resp.allowed => {
                self.admit(vm, &resp, 0, now);
                if vm.doc.headers == HeadersMode::Always {
                    if let Some(h) = self.ratelimit_headers(vm, &resp) {
                        self.response_headers.push((RateLimitHeaders::POLICY, h.policy));
                        self.response_headers.push((RateLimitHeaders::RATELIMIT, h.ratelimit));
                    }
                }
                Action::Continue
            }
            Some(Ok(resp)) => self.deny(vm, &resp, &shadow_notes, now),
            Some(Err(reason)) => self.fail(vm, &reason, now),
        };
        if let Action::Continue = action {
            self.response_headers.extend(shadow_notes.into_iter().map(|note| (SHADOW_HEADER, note)));
        }
        self.admitted = matches!(action, Action::Continue);
        self.settle_tokens(vm, self.admitted);
        action
    }

    /// Leased mode: takes a token from each leased policy's pool. A policy
    /// whose pool has none is checked by the shim exactly, as without a lease.
    fn spend_tokens(&mut self, vm: &Vm, evaluation: &Evaluation, req: &HostRequest) {
        // The clock only for a leased policy: most requests have none.
        let mut now = None;
        for a in evaluation.iter() {
            if a.policy.leased.is_none() || a.policy.shadow {
                self.calls[usize::from(a.policy.shadow)].push(a.index, a.check(req));
                continue;
            }
            let now = *now.get_or_insert_with(now_ms);
            let spent = vm.pool_key(a.index).and_then(|key| update_pool(key, |pool| pool.spend(now)));
            match spent {
                Some(Some(token)) => self.spent.push((a.index, token)),
                _ => {
                    vm.stats.count(a.index, |s| s.lease_empty);
                    self.calls[0].push(a.index, a.check(req));
                }
            }
        }
    }

    /// The request's decision is made: its spent tokens count as admitted
    /// requests, or go back to their pools if it was refused.
    fn settle_tokens(&mut self, vm: &Vm, admitted: bool) {
        if self.spent.is_empty() {
            return;
        }
        let now = now_ms();
        for (index, token) in std::mem::take(&mut self.spent) {
            if admitted {
                vm.stats.count(index, |s| s.allowed);
                vm.stats.count(index, |s| s.leased);
                continue;
            }
            if let Some(key) = vm.pool_key(index) {
                update_pool(key, |pool| pool.unspend(token, now));
            }
        }
    }

    /// Counts the shadow call's answer; the `x-sluice-shadow` value if it would have denied.
    fn conclude_shadow(
        &mut self,
        vm: &Vm,
        answer: Result<CheckResponse, String>,
        now: u64,
    ) -> Option<String> {
        let call = &self.calls[1];
        match answer {
            Ok(resp) if resp.allowed => {
                self.admit(vm, &resp, 1, now);
                None
            }
            Ok(resp) => {
                let i = resp.denied_check()?;
                let index = *call.policies.get(i)?;
                vm.stats.count(index, |s| s.shadow_denied);
                let name = call.checks.get(i).map(|c| c.policy.as_str()).unwrap_or_default();
                log::debug!("shadow policy {name} would deny");
                vm.doc.shadow_header.then(|| shadow_note(name))
            }
            Err(reason) => {
                for &index in &call.policies {
                    vm.stats.count(index, |s| s.failure_allowed);
                }
                vm.log_failure(now, &format!("{reason}; shadow policies let the request through"));
                None
            }
        }
    }

    /// Load shedding: the first enforced policy that sheds this request's
    /// class, by its fraction now, refuses it (503, `temporary-reduced-capacity`)
    /// with no shim call.
    fn shed(&self, vm: &Vm, evaluation: &Evaluation) -> Option<Action> {
        let shedding = vm.shedding.borrow();
        if !shedding.any() {
            return None;
        }
        let shed = evaluation
            .iter()
            .filter(|a| !a.policy.shadow && a.policy.shed.is_some())
            .find(|a| shedding.sheds(a.index, self.class, vm.draw()))?;
        vm.stats.count(shed.index, |s| s.shed);
        vm.stats.count_class(self.class, |c| c.shed);
        let retry_after = REPORT_MS.div_ceil(1000);
        Some(respond(Reply::reduced_capacity(shed.policy, vm.doc.classes.name(self.class), retry_after)))
    }

    /// The utilization the upstream's response reports, for each admitted
    /// policy that sheds by a response header.
    fn observe_load(&self, vm: &Vm) {
        let mut shedding = vm.shedding.borrow_mut();
        for &index in &self.calls[0].policies {
            let Some(shed) = vm.doc.policies.get(index).and_then(|p| p.shed.as_ref()) else { continue };
            let header = |name: &str| {
                hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name).ok().flatten()
            };
            if let Some(utilization) = shed.signal.read(header) {
                shedding.observe(index, utilization);
            }
        }
    }

    /// Counts an admission by call `which` and keeps its lease, and how long
    /// the shim held it (the wait stats exist for policies with `wait` only).
    fn admit(&mut self, vm: &Vm, resp: &CheckResponse, which: usize, now: u64) {
        if which == 0 {
            vm.stats.count_class(self.class, |c| c.allowed);
        }
        let call = &mut self.calls[which];
        call.admitted = true;
        call.admitted_ms = now;
        // Held: the shim says so with a non-zero `waited_ms`.
        let held = resp.waited_ms.unwrap_or(0);
        if which == 0 {
            self.waited_ms = (held > 0).then_some(held);
        }
        for (i, &index) in call.policies.iter().enumerate() {
            vm.stats.count(index, |s| s.allowed);
            vm.stats.count(index, |s| if held > 0 { s.waited } else { s.immediate });
            vm.stats.record(index, |s| s.wait_ms, held);
            if held > 0 && resp.checks.get(i).is_some_and(|c| c.paused_ms.is_some()) {
                vm.stats.count(index, |s| s.paused_waited);
            }
            let reclaimed: u64 = resp.checks.get(i).map_or(0, |c| c.limits.iter().map(|l| l.reclaimed).sum());
            if reclaimed > 0 {
                vm.stats.add(index, |s| s.reclaimed, reclaimed);
            }
        }
        if which == 0 {
            observe_pools(vm, &call.policies, &call.checks, resp);
        }
        call.lease = resp.lease.clone();
        if let Some(lease) = &call.lease {
            let request = RenewRequest { lease: lease.clone(), checks: call.checks.clone() };
            vm.live.borrow_mut().hold(request, call.admitted_ms);
        }
        // Only a points limit corrected after the response needs the outcomes.
        if call.corrects_costs(&vm.doc) {
            call.charged = resp.checks.clone();
        }
    }

    /// The partner's answer to an admitted request: pauses for the policies
    /// that read upstream feedback, counted and sent to the shim from this
    /// stream. The response's headers wait until the shim has recorded the
    /// pause (true: hold them), so every call checked after the client sees
    /// the partner's "slow down" is paused, on every gateway. A pause that
    /// cannot be sent from here goes through the root context.
    fn upstream_feedback(&mut self, vm: &Vm) -> bool {
        let call = &self.calls[0];
        let reads = |&i: &usize| vm.doc.policies.get(i).is_some_and(|p| p.upstream.is_some());
        if !call.admitted || !call.policies.iter().any(reads) {
            return false;
        }
        let Some(status) = hostcalls::get_map_value(MapType::HttpResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|s| s.trim().parse::<u16>().ok())
        else {
            return false;
        };
        let header =
            |name: &str| hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name).ok().flatten();
        let got = feedback::read(&vm.doc, &call.policies, &call.checks, status, header, now_ms());
        if got.pauses.is_empty() {
            return false;
        }
        for &index in &got.throttled {
            vm.stats.count(index, |s| s.upstream_throttled);
        }
        for &index in &got.clamped {
            vm.stats.count(index, |s| s.upstream_clamped);
        }
        let request = FeedbackRequest { pauses: got.pauses, now_us: None };
        let timeout = Duration::from_millis(vm.doc.shim.timeout_ms.get().into());
        let sent = serde_json::to_vec(&request)
            .map_err(|e| e.to_string())
            .and_then(|body| post_bytes(&vm.doc, FEEDBACK_PATH, &body, timeout));
        match sent {
            Ok(token) => {
                self.reporting = Some((token, request));
                true
            }
            Err(reason) => {
                log::debug!("cannot send upstream feedback from the stream ({reason}); the root will");
                vm.send_later(FEEDBACK_PATH, &request, Vec::new());
                false
            }
        }
    }

    /// The shim denied: count it, remember it in the over-limit cache, answer.
    fn deny(&mut self, vm: &Vm, resp: &CheckResponse, shadow_notes: &[String], now: u64) -> Action {
        let call = &self.calls[0];
        let i = resp.denied_check().unwrap_or(0);
        let (Some(&index), Some(check), Some(outcome)) =
            (call.policies.get(i), call.checks.get(i), resp.checks.get(i))
        else {
            return self.fail(vm, "shim denied without saying which check", now);
        };
        let Some(policy) = vm.doc.policies.get(index) else { return Action::Continue };
        vm.stats.count(index, |s| s.denied);
        vm.stats.count_class(self.class, |c| c.denied);
        if outcome.paused_ms.is_some() {
            vm.stats.count(index, |s| s.paused_denied);
        }
        if call.wait_ms > 0 {
            // The shim refuses a waiting request only when its slot lies
            // further away than the wait.
            vm.stats.count(index, |s| s.wait_timeout);
        }
        log::debug!("policy {} denies key {}", policy.name, check.key);
        OverLimitCache::new(SharedData, vm.doc.over_limit_cache_slots.get()).record(
            policy,
            check,
            outcome,
            call.sent_ms,
        );
        let headers = match vm.doc.headers {
            HeadersMode::Off => None,
            _ => self.ratelimit_headers(vm, resp),
        };
        let retry_after = retry_after_secs(resp.retry_after_ms);
        let mut reply = if held_out_by_reserve(policy, outcome) {
            Reply::reduced_capacity(policy, vm.doc.classes.name(self.class), retry_after)
        } else {
            Reply::denial(policy, retry_after, headers)
        };
        reply.headers.extend(shadow_notes.iter().map(|note| (SHADOW_HEADER.into(), note.clone())));
        respond(reply)
    }

    /// The shim gave no usable answer: `failure_mode` decides. Deny wins if
    /// any enforced policy that applies says deny; its status is the first such one's.
    fn fail(&self, vm: &Vm, reason: &str, now: u64) -> Action {
        let call = &self.calls[0];
        let deny_status = call.policies.iter().find_map(|&index| {
            let policy = vm.doc.policies.get(index)?;
            match vm.doc.failure_of(policy) {
                (FailureMode::Deny, status) => Some((policy.name.as_str(), status.get())),
                (FailureMode::Allow, _) => None,
            }
        });
        let denied = deny_status.is_some();
        for &index in &call.policies {
            vm.stats.count(index, |s| if denied { s.failure_denied } else { s.failure_allowed });
        }
        match deny_status {
            Some((name, status)) => {
                vm.log_failure(now, &format!("{reason}; failure_mode deny (policy {name}) answers {status}"));
                respond(Reply::unavailable(status))
            }
            None => {
                vm.log_failure(now, &format!("{reason}; failure_mode allow lets the request through"));
                Action::Continue
            }
        }
    }

    /// The most restrictive of the enforced call's limits.
    fn ratelimit_headers(&self, vm: &Vm, resp: &CheckResponse) -> Option<RateLimitHeaders> {
        let call = &self.calls[0];
        let limits = call.policies.iter().zip(&resp.checks).filter_map(|(&index, outcome)| {
            let policy = vm.doc.policies.get(index)?;
            Some(policy.limits.iter().zip(&outcome.limits).map(move |(l, o)| (policy.name.as_str(), l, o)))
        });
        RateLimitHeaders::most_restrictive(limits.flatten())
    }

    /// The releases still to send: one per call that holds (or may hold) a
    /// lease, each taken once.
    /// Each with whether the shim confirmed the lease (else it is released
    /// by the check's id, in case the shim took it unseen).
    fn leases_to_release(&mut self, vm: &Vm) -> Vec<(ReleaseRequest, Vec<usize>, bool)> {
        let mut out = Vec::new();
        // Read only for a lease: every stream ends here, twice (on_log, on_done).
        let mut now = None;
        for call in &mut self.calls {
            let confirmed = call.lease.is_some();
            let Some(lease) = call.lease_to_release(&vm.doc) else { continue };
            vm.live.borrow_mut().end(&lease);
            let policies = call.concurrency_policies(&vm.doc);
            if confirmed {
                let held = now.get_or_insert_with(now_ms).saturating_sub(call.admitted_ms);
                for &index in &policies {
                    vm.stats.record(index, |s| s.held_ms, held);
                    if vm.doc.policies.get(index).is_some_and(|p| overran_lease(p, held)) {
                        vm.stats.count(index, |s| s.overages);
                    }
                }
            }
            out.push((ReleaseRequest { lease, checks: call.checks.clone() }, policies, confirmed));
        }
        out
    }

    /// The response's last byte has reached the filter: release the leases
    /// now, from this stream, and hold that byte (`Pause`) until the shim
    /// has answered, so the slot is free before the client sees the end. A
    /// release that cannot be sent goes to the root context instead.
    fn release_at_end(&mut self) -> Action {
        let Some(vm) = self.vm.clone() else { return Action::Continue };
        for (request, policies, confirmed) in self.leases_to_release(&vm) {
            if !confirmed {
                // Most likely the shim failed and took nothing: not worth
                // holding the response's end for; the root releases it.
                vm.send_later(RELEASE_PATH, &request, policies);
                continue;
            }
            let sent = serde_json::to_vec(&request).map_err(|e| e.to_string()).and_then(|body| {
                let timeout = Duration::from_millis(vm.doc.shim.timeout_ms.get().into());
                post_bytes(&vm.doc, RELEASE_PATH, &body, timeout)
            });
            match sent {
                Ok(token) => self.releasing.push((token, request, policies)),
                Err(reason) => {
                    log::debug!("cannot release at the response's end ({reason}); the root will");
                    vm.send_later(RELEASE_PATH, &request, policies);
                }
            }
        }
        if self.releasing.is_empty() {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    /// Exactly once per admitted request that holds leases, when the stream
    /// ends without a released response end: queued for the root context,
    /// whose calls outlive the stream. A release still in flight here is
    /// cancelled with the stream, so it is sent again (a second release of
    /// one lease ends nothing).
    fn release_leases(&mut self) {
        let Some(vm) = self.vm.clone() else { return };
        let held = &self.calls[0];
        if held.token.is_some() && held.wait_ms > 0 {
            // Envoy cancels the call with the stream. The shim gives the held
            // slot back when it sees the call dropped, and, so that this does
            // not rest on the reset reaching it, also when a release names
            // the request (a waiter on a concurrency slot gets its release
            // below, with its lease).
            for &index in &held.policies {
                vm.stats.count(index, |s| s.wait_cancelled);
            }
            if held.concurrency_policies(&vm.doc).is_empty() {
                let request = ReleaseRequest { lease: held.id.clone(), checks: held.checks.clone() };
                vm.send_later(RELEASE_PATH, &request, Vec::new());
            }
        }
        for (_, request, policies) in std::mem::take(&mut self.releasing) {
            vm.send_later(RELEASE_PATH, &request, policies);
        }
        if let Some((_, feedback)) = self.reporting.take() {
            // Cancelled with the stream: recording a pause twice extends nothing.
            vm.send_later(FEEDBACK_PATH, &feedback, Vec::new());
        }
        for (request, policies, _) in self.leases_to_release(&vm) {
            vm.send_later(RELEASE_PATH, &request, policies);
        }
    }

    /// A release sent at the response's end answered: count it, and let
    /// the response finish once every such release has.
    fn released(&mut self, vm: &Vm, at: usize, num_headers: usize, body_size: usize) {
        let (_, _, policies) = self.releasing.swap_remove(at);
        let (status, body) = call_answer(num_headers, body_size);
        vm.release_answered(&policies, status.as_deref(), body.as_deref(), now_ms());
        self.resume_response();
    }

    /// Lets the response go on once no release or feedback holds it.
    fn resume_response(&self) {
        if self.releasing.is_empty() && self.reporting.is_none() {
            if let Err(status) = hostcalls::resume_http_response() {
                log::warn!("cannot resume the response: {status:?}");
            }
        }
    }

    /// A shadow policy that would have refused the request for its missing
    /// key: counted as a shadow denial, never a refusal.
    fn shadow_missing_key(&mut self, vm: &Vm, index: usize) {
        let Some(policy) = vm.doc.policies.get(index) else { return };
        vm.stats.count(index, |s| s.shadow_denied);
        log::debug!("shadow policy {} would deny: missing key", policy.name);
        if vm.doc.shadow_header {
            self.shadow_notes.push(shadow_note(policy.name.as_str()));
        }
    }

    /// Local decisions before any call: the over-limit cache, then the breaker.
    fn decide_locally(&mut self, vm: &Vm, now: u64) -> Option<Action> {
        let cache = OverLimitCache::new(SharedData, vm.doc.over_limit_cache_slots.get());
        let call = &self.calls[0];
        for (&index, check) in call.policies.iter().zip(&call.checks) {
            let Some(policy) = vm.doc.policies.get(index) else { continue };
            let Some(hit) = cache.lookup(policy, check, now) else { continue };
            vm.stats.count(index, |s| s.cache_denied);
            log::debug!("policy {} denies key {} from the over-limit cache", policy.name, check.key);
            let headers = match (vm.doc.headers, policy.limits.get(hit.limit)) {
                (HeadersMode::Off, _) | (_, None) => None,
                (_, Some(limit)) => Some(RateLimitHeaders::of(policy.name.as_str(), limit, 0, hit.wait_ms)),
            };
            let mut reply = Reply::denial(policy, retry_after_secs(Some(hit.wait_ms)), headers);
            let notes = std::mem::take(&mut self.shadow_notes);
            reply.headers.extend(notes.into_iter().map(|note| (SHADOW_HEADER.into(), note)));
            self.settle_tokens(vm, false);
            return Some(respond(reply));
        }
        let (allowed, change) = vm.breaker.borrow_mut().call_allowed(now);
        vm.breaker_changed(change);
        if allowed {
            return None;
        }
        for call in &mut self.calls {
            if !call.checks.is_empty() {
                call.answer = Some(Err("the shim breaker is open".into()));
            }
        }
        Some(self.finish(vm, now))
    }
}

impl Context for Sluice {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _trailers: usize) {
        let Some(vm) = self.vm.clone() else { return };
        if let Some(at) = self.releasing.iter().position(|(t, ..)| *t == token) {
            return self.released(&vm, at, num_headers, body_size);
        }
        if self.reporting.as_ref().is_some_and(|(t, _)| *t == token) {
            self.reporting = None;
            let (status, _) = call_answer(num_headers, 0);
            if status.as_deref() != Some(b"200") {
                log::debug!("the shim did not record upstream feedback: {status:?}");
            }
            return self.resume_response();
        }
        let Some(call) = self.calls.iter_mut().find(|c| c.token == Some(token)) else { return };
        call.token = None;
        let now = now_ms();
        vm.stats.latency(now.saturating_sub(call.sent_ms));
        let (status, body) = call_answer(num_headers, body_size);
        let answer = read_answer(status.as_deref(), body.as_deref(), &call.checks);
        // Only a readable answer says whether the shim took a lease.
        call.unconfirmed = answer.is_err();
        let change = match answer {
            Ok(_) => vm.breaker.borrow_mut().success(),
            Err(_) => vm.breaker.borrow_mut().failure(now),
        };
        vm.breaker_changed(change);
        call.answer = Some(answer);
        if self.calls.iter().any(|c| c.token.is_some()) {
            return;
        }
        if let Action::Continue = self.finish(&vm, now) {
            if let Err(status) = hostcalls::resume_http_request() {
                log::warn!("cannot resume the request: {status:?}");
            }
        }
    }

    fn on_done(&mut self) -> bool {
        self.release_leases();
        if let Some(vm) = self.vm.clone() {
            // Reset before its decision: the tokens go back.
            self.settle_tokens(&vm, false);
        }
        true
    }
}

impl HttpContext for Sluice {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(vm) = self.vm.clone() else { return Action::Continue };
        let req = HostRequest::read();
        let evaluation = match vm.doc.evaluate(&req) {
            Ok(evaluation) => evaluation,
            Err(policy) => return respond(Reply::missing_key(policy)),
        };
        self.class = evaluation.class;
        if let Some(action) = self.shed(&vm, &evaluation) {
            return action;
        }
        for &index in &evaluation.shadow_missing_key {
            self.shadow_missing_key(&vm, index);
        }
        self.spend_tokens(&vm, &evaluation, &req);
        let enforced = evaluation.iter().filter(|a| !a.policy.shadow).map(|a| a.policy);
        self.calls[0].wait_ms = request_wait_ms(enforced);
        if self.calls.iter().all(|c| c.checks.is_empty()) {
            let notes = std::mem::take(&mut self.shadow_notes);
            self.response_headers.extend(notes.into_iter().map(|note| (SHADOW_HEADER, note)));
            self.admitted = !self.response_headers.is_empty();
            self.settle_tokens(&vm, true);
            return Action::Continue;
        }
        let now = now_ms();
        if let Some(action) = self.decide_locally(&vm, now) {
            return action;
        }
        for call in &mut self.calls {
            if call.checks.is_empty() {
                continue;
            }
            call.sent_ms = now;
            // Named only when sent: most streams never need an id.
            call.id = vm.next_id();
            match post_check(&vm.doc, &call.request()) {
                Ok(token) => {
                    call.token = Some(token);
                    call.unconfirmed = true;
                }
                Err(reason) => {
                    let change = vm.breaker.borrow_mut().failure(now);
                    vm.breaker_changed(change);
                    call.answer = Some(Err(reason));
                }
            }
        }
        if self.calls.iter().any(|c| c.token.is_some()) {
            return Action::Pause;
        }
        self.finish(&vm, now)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(vm) = self.vm.clone() else { return Action::Continue };
        if !self.admitted {
            return Action::Continue;
        }
        for (name, value) in &self.response_headers {
            if let Err(status) = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value) {
                log::debug!("cannot add {name}: {status:?}");
            }
        }
        if let Some(waited) = self.waited_ms {
            let theirs = hostcalls::get_map_value(MapType::HttpResponseHeaders, SERVER_TIMING).ok().flatten();
            let value = server_timing(theirs.as_deref(), waited);
            if let Err(status) =
                hostcalls::set_map_value(MapType::HttpResponseHeaders, SERVER_TIMING, Some(&value))
            {
                log::debug!("cannot set {SERVER_TIMING}: {status:?}");
            }
        }
        if self.calls[0].admitted {
            self.observe_load(&vm);
        }
        let adjustments: Vec<_> =
            self.calls.iter().filter(|c| c.admitted).flat_map(|c| c.adjustments(&vm.doc)).collect();
        if !adjustments.is_empty() {
            vm.send_later(ADJUST_PATH, &AdjustRequest { adjustments, now_us: None }, Vec::new());
        }
        let reporting = self.upstream_feedback(&vm);
        if end_of_stream {
            // Holds the response while the releases, or the feedback, are in flight.
            let releasing = self.release_at_end();
            return if reporting { Action::Pause } else { releasing };
        }
        if self.calls.iter().any(|c| c.lease.is_some()) {
            self.body_left = hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, "content-length")
                .ok()
                .flatten()
                .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok());
        }
        if reporting {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.admitted {
            return Action::Continue;
        }
        if !self.releasing.is_empty() {
            // Still holding the last bytes (and any that follow) for a release.
            return Action::Pause;
        }
        let completes = match &mut self.body_left {
            Some(left) if *left <= body_size as u64 => true,
            Some(left) => {
                *left -= body_size as u64;
                false
            }
            None => false,
        };
        if end_of_stream || completes {
            return self.release_at_end();
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        if !self.admitted {
            return Action::Continue;
        }
        if !self.releasing.is_empty() {
            return Action::Pause;
        }
        self.release_at_end()
    }

    fn on_log(&mut self) {
        self.release_leases();
    }
}

/// The `x-sluice-shadow` value for a shadow policy that would have denied.
fn shadow_note(policy: &str) -> String {
    format!("would-deny; policy=\"{policy}\"")
}

/// Sends a local response; the request stays paused.
fn respond(reply: Reply) -> Action {
    let headers: Vec<(&str, &str)> = reply.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    if let Err(status) = hostcalls::send_http_response(u32::from(reply.status), headers, Some(&reply.body)) {
        log::warn!("cannot send the local response: {status:?}");
    }
    Action::Pause
}

/// Whether a concurrency pool refused the request because its reserve holds
/// the request's class out: the service is short of capacity (503), not the
/// client over a quota.
fn held_out_by_reserve(policy: &Policy, outcome: &CheckOutcome) -> bool {
    policy
        .limits
        .iter()
        .zip(&outcome.limits)
        .any(|(limit, o)| !o.allowed && matches!(limit, Limit::Concurrency { reserve: Some(_), .. }))
}

/// The occupancy of the pool of each admitted policy that sheds by it.
fn observe_pools(vm: &Vm, policies: &[usize], checks: &[Check], resp: &CheckResponse) {
    let mut shedding = vm.shedding.borrow_mut();
    for (i, &index) in policies.iter().enumerate() {
        let Some(policy) = vm.doc.policies.get(index) else { continue };
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
