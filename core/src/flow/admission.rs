//! Admission, before any call: match the request, refuse it at once (a
//! missing key, load shedding, the over-limit cache, an open breaker),
//! spend leased tokens, and build and send the enforced and shadow checks.
//! What a request's tokens and checks become once it is decided is in
//! [`super::answers`].

use std::rc::Rc;

use sluice_policies::units::Millis;
use sluice_policies::wire::{Views, WireLimit, CHECK_PATH};
use sluice_policies::{Applied, Evaluation, HeadersMode, Request};

use super::{Phase, State, CHECK_ENCODING, ENFORCED, SHADOW, SHADOW_HEADER};
use crate::cache::{Hit, OverLimitCache};
use crate::check_call::CheckCall;
use crate::decision::{retry_after_secs, NoAnswer};
use crate::effect::{Effect, Effects, Outgoing};
use crate::host::Host;
use crate::leased::{Pool, Token};
use crate::local_reply::LocalReply;
use crate::now::Now;
use crate::ratelimit_headers::{Fields, RateLimitHeaders};
use crate::shedding::REPORT_MS;
use crate::stats::{ClassStat, PolicyStat};
use crate::verdict::Verdict;
use crate::wait::{call_timeout_ms, request_wait_ms};
use crate::worker::{update_pool, Worker};

/// What admission keeps of a request between its events.
#[derive(Default)]
pub(super) struct Admission {
    /// `x-sluice-shadow` values of shadow policies that would have denied
    /// the request for a missing key (with `shadow_header` only).
    pub(super) shadow_notes: Vec<String>,
    /// The request's priority class (0 without classes).
    pub(super) class: usize,
    /// Leased policies (document indexes) whose token this request took;
    /// put back if the request is refused after all.
    /// (With the hot key's pool, for a policy leased per key.)
    pub(super) spent: Vec<(usize, Option<String>, Token)>,
    /// With `headers: always`: the `RateLimit` view of each leased policy
    /// whose token this request took: (policy, remaining, ms to reset).
    pub(super) leased_views: Vec<(usize, u64, u64)>,
}

impl State {
    /// The request is known (its headers, and its body if read): match,
    /// decide locally or ask the shim.
    pub(super) fn decide(
        &mut self,
        worker: &Worker,
        now: &Now,
        req: &impl Request,
        host: &dyn Host,
    ) -> Vec<Effect> {
        let mut fx = worker.effects();
        let evaluation = match worker.doc.evaluate(req) {
            Ok(evaluation) => evaluation,
            Err(policy) => {
                self.refuse(worker, LocalReply::missing_key(policy), Verdict::MissingKey, &mut fx);
                return fx.0;
            }
        };
        self.admission.class = evaluation.class;
        if let Some(reply) = self.shed(worker, &evaluation, &mut fx) {
            self.refuse(worker, reply, Verdict::Shed, &mut fx);
            return fx.0;
        }
        for &index in &evaluation.shadow_missing_key {
            self.shadow_missing_key(worker, index, &mut fx);
        }
        if let Some(denial) = self.spend_tokens(worker, &evaluation, req, now, host, &mut fx) {
            self.deny_from_cache(worker, denial, now, host, &mut fx);
            return fx.0;
        }
        let enforced = crate::plan::enforced(&evaluation).map(|a| a.policy);
        self.calls[0].wait_ms = request_wait_ms(enforced);
        if self.calls.iter().all(|c| c.checks.is_empty()) {
            let notes = std::mem::take(&mut self.admission.shadow_notes);
            self.response_headers.extend(notes.into_iter().map(|note| (SHADOW_HEADER, note)));
            if let Some(h) = self.leased_headers(worker, None) {
                self.response_headers.push((RateLimitHeaders::POLICY, h.policy));
                self.response_headers.push((RateLimitHeaders::RATELIMIT, h.ratelimit));
            }
            if evaluation.iter().next().is_some() {
                self.tell(worker, Verdict::Allowed);
            }
            self.phase = if self.response_headers.is_empty() { Phase::Done } else { Phase::Admitted };
            self.settle_tokens(worker, true, now, host, &mut fx);
            return fx.0;
        }
        let now = now.ms();
        if self.decide_locally(worker, now, host, &mut fx) {
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
                    let shared = call.wait_ms == 0;
                    fx.push(Effect::Send(Outgoing {
                        id,
                        path: CHECK_PATH,
                        encoding,
                        body,
                        timeout_ms,
                        shared,
                    }));
                }
                Err(err) => {
                    worker.call_ended(false, now, now, &mut fx);
                    call.answer = Some(Err(NoAnswer::Encode(err)));
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
        self.finish(worker, now, host, &mut fx);
        fx.0
    }

    /// The local decision before any call (the over-limit cache was read
    /// as the checks were built): the breaker. True when it decided.
    pub(super) fn decide_locally(
        &mut self,
        worker: &Worker,
        now: u64,
        host: &dyn Host,
        fx: &mut Effects,
    ) -> bool {
        if worker.call_allowed(now, fx) {
            return false;
        }
        for call in &mut self.calls {
            if !call.checks.is_empty() {
                call.answer = Some(Err(NoAnswer::BreakerOpen));
            }
        }
        self.finish(worker, now, host, fx);
        true
    }

    /// Builds the checks of the policies that apply, after two local
    /// steps. Leased mode: takes a token from each leased policy's pool; a
    /// policy whose pool has none is checked by the shim exactly, as
    /// without a lease. The over-limit cache: an enforced check it holds a
    /// live denial for ends the request's checks there, before the check is
    /// built: the policy, that denial and its limit as the check would send
    /// it, returned.
    pub(super) fn spend_tokens(
        &mut self,
        worker: &Worker,
        evaluation: &Evaluation,
        req: &impl Request,
        now: &Now,
        host: &dyn Host,
        fx: &mut Effects,
    ) -> Option<(usize, Hit, Option<WireLimit>)> {
        // Nothing applies: not even the clock is read.
        evaluation.iter().next()?;
        let cache = OverLimitCache::new(host, worker.doc.over_limit_cache_slots.get())
            .with_mirror(&worker.over_limit);
        let now = now.ms();
        let enforce = |calls: &mut CheckCall, a: &Applied<'_>| {
            let reserved = a.reserved(req);
            let Some((hit, limit)) = cache.lookup_applied(a, req, reserved, now) else {
                calls.push(a.index, a.check_reserving(req, reserved));
                return None;
            };
            log::debug!("policy {} denies key {} from the over-limit cache", a.policy.name, a.key);
            Some((a.index, hit, limit))
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
                    self.admission.spent.push((a.index, hot, token));
                    if worker.doc.headers == HeadersMode::Always {
                        self.admission.leased_views.push((a.index, remaining, reset_ms));
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
    pub(super) fn deny_from_cache(
        &mut self,
        worker: &Worker,
        (index, hit, limit): (usize, Hit, Option<WireLimit>),
        now: &Now,
        host: &dyn Host,
        fx: &mut Effects,
    ) {
        let Some(policy) = worker.doc.policies.get(index) else { return };
        fx.count(index, PolicyStat::CacheDenied);
        worker.cache_denied(index);
        self.settle_tokens(worker, false, now, host, fx);
        let secs = retry_after_secs(Some(Millis(hit.wait_ms)));
        // All the reply shows of the hit: the limit and its fields (the
        // wait in whole seconds is RateLimit's t and Retry-After alike).
        let fields = limit.map(|l| Fields::refused(&l, Millis(hit.wait_ms)));
        let shown = (hit.limit, secs, fields.map_or(0, |f| f.remaining));
        if self.admission.shadow_notes.is_empty() {
            if let Some(reply) = worker.cached_denial(index, shown) {
                return self.refuse_with(reply, fx);
            }
        }
        let headers = match (worker.doc.headers, limit.zip(fields)) {
            (HeadersMode::Off, _) | (_, None) => None,
            (_, Some((limit, fields))) => Some(RateLimitHeaders::of(policy.name.as_str(), &limit, fields)),
        };
        let mut reply = LocalReply::denial(policy, secs, headers);
        let notes = std::mem::take(&mut self.admission.shadow_notes);
        let kept = notes.is_empty();
        reply.headers.extend(notes.into_iter().map(|note| (SHADOW_HEADER.into(), note.into())));
        let reply = Rc::new(self.with_verdict(worker, reply, Verdict::CacheDenied));
        if kept {
            worker.keep_denial(index, shown, &reply);
        }
        self.refuse_with(reply, fx);
    }

    /// The request's decision is made: its spent tokens count as admitted
    /// requests, or go back to their pools if it was refused.
    pub(super) fn settle_tokens(
        &mut self,
        worker: &Worker,
        admitted: bool,
        now: &Now,
        host: &dyn Host,
        fx: &mut Effects,
    ) {
        if self.admission.spent.is_empty() {
            return;
        }
        let now = now.ms();
        for (index, hot, token) in std::mem::take(&mut self.admission.spent) {
            if admitted {
                fx.count(index, PolicyStat::Allowed);
                fx.count(index, PolicyStat::Leased);
                continue;
            }
            if let Some(key) = hot.as_deref().or(worker.pool_key(index)) {
                update_pool(host, key, |pool| pool.unspend(token, now));
            }
        }
    }

    /// Load shedding: the first enforced policy that sheds this request's
    /// class, by its fraction now, refuses it (503, `temporary-reduced-capacity`)
    /// with no shim call.
    pub(super) fn shed(
        &self,
        worker: &Worker,
        evaluation: &Evaluation,
        fx: &mut Effects,
    ) -> Option<LocalReply> {
        let shedding = worker.shedding();
        if !shedding.any() {
            return None;
        }
        let shed = crate::plan::enforced(evaluation)
            .filter(|a| a.policy.shed.is_some())
            .find(|a| shedding.sheds(a.index, self.admission.class, worker.draw()))?;
        fx.count(shed.index, PolicyStat::Shed);
        fx.count_class(self.admission.class, ClassStat::Shed);
        let retry_after = REPORT_MS.div_ceil(1000);
        Some(LocalReply::reduced_capacity(
            shed.policy,
            worker.doc.classes.name(self.admission.class),
            retry_after,
        ))
    }

    /// A shadow policy that would have refused the request for its missing
    /// key: counted as a shadow denial, never a refusal.
    pub(super) fn shadow_missing_key(&mut self, worker: &Worker, index: usize, fx: &mut Effects) {
        let Some(policy) = worker.doc.policies.get(index) else { return };
        fx.count(index, PolicyStat::ShadowDenied);
        log::debug!("shadow policy {} would deny: missing key", policy.name);
        if worker.doc.shadow_header {
            self.admission.shadow_notes.push(shadow_note(policy.name.as_str()));
        }
    }
}

/// The `x-sluice-shadow` value for a shadow policy that would have denied.
pub(super) fn shadow_note(policy: &str) -> String {
    format!("would-deny; policy=\"{policy}\"")
}
