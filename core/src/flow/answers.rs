//! The request's decision once its checks have answered (or none was
//! needed): admitted, denied, or left to `failure_mode`; the counts, the
//! over-limit cache, the `RateLimit` and shadow headers of each outcome.

use std::fmt::Display;

use sluice_policies::load::{pool_occupancy, Signal};
use sluice_policies::units::Millis;
use sluice_policies::wire::{Check, CheckOutcome, CheckResponse, RenewRequest, WireLimit};
use sluice_policies::{FailureMode, HeadersMode, Limit, Policy};

use super::admission::shadow_note;
use super::{Phase, State, SHADOW_HEADER};
use crate::cache::OverLimitCache;
use crate::decision::{retry_after_secs, NoAnswer};
use crate::effect::Effects;
use crate::host::Host;
use crate::local_reply::LocalReply;
use crate::now::Now;
use crate::ratelimit_headers::{Fields, RateLimitHeaders};
use crate::stats::{ClassStat, PolicyStat};
use crate::verdict::Verdict;
use crate::worker::Worker;

impl State {
    /// The request's decision once every call it made has answered (or none
    /// was needed). `now` is the callback's clock.
    pub(super) fn finish(&mut self, worker: &Worker, now: u64, host: &dyn Host, fx: &mut Effects) {
        let shadow = self.calls[1].answer.take();
        let mut shadow_notes = std::mem::take(&mut self.admission.shadow_notes);
        if let Some(note) = shadow.and_then(|answer| self.conclude_shadow(worker, answer, now, fx)) {
            shadow_notes.push(note);
        }
        let enforced = self.calls[0].answer.take();
        match enforced {
            None => {
                if let Some(h) = self.leased_headers(worker, None) {
                    self.response_headers.push((RateLimitHeaders::POLICY, h.policy));
                    self.response_headers.push((RateLimitHeaders::RATELIMIT, h.ratelimit));
                }
                self.phase = Phase::Admitted;
            }
            Some(Ok(resp)) if resp.allowed => {
                self.admit(worker, &resp, 0, now, fx);
                if worker.doc.headers == HeadersMode::Always {
                    let shim = self.ratelimit_headers(worker, &resp);
                    if let Some(h) = self.leased_headers(worker, shim) {
                        self.response_headers.push((RateLimitHeaders::POLICY, h.policy));
                        self.response_headers.push((RateLimitHeaders::RATELIMIT, h.ratelimit));
                    }
                }
                self.phase = Phase::Admitted;
            }
            Some(Ok(resp)) => self.deny(worker, &resp, &shadow_notes, now, host, fx),
            Some(Err(reason)) => self.fail(worker, &reason, now, fx),
        }
        let through = matches!(self.phase, Phase::Admitted | Phase::Failed);
        if through {
            self.response_headers.extend(shadow_notes.into_iter().map(|note| (SHADOW_HEADER, note)));
            self.tell(
                worker,
                if self.phase == Phase::Failed { Verdict::FailureAllowed } else { Verdict::Allowed },
            );
        }
        self.settle_tokens(worker, through, &Now::at(now), host, fx);
    }

    /// Counts an admission by call `which` and keeps its lease, and how long
    /// the shim held it (the wait stats exist for policies with `wait` only).
    pub(super) fn admit(
        &mut self,
        worker: &Worker,
        resp: &CheckResponse,
        which: usize,
        now: u64,
        fx: &mut Effects,
    ) {
        if which == 0 {
            fx.count_class(self.admission.class, ClassStat::Allowed);
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
            worker.change_live(|live| live.hold(request, call.admitted_ms));
        }
        // Only a points limit corrected after the response needs the outcomes.
        if call.corrects_costs(&worker.doc) {
            call.charged = resp.checks.clone();
        }
    }

    /// Counts the shadow call's answer; the `x-sluice-shadow` value if it would have denied.
    pub(super) fn conclude_shadow(
        &mut self,
        worker: &Worker,
        answer: Result<CheckResponse, NoAnswer>,
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

    /// The shim denied: count it, remember it in the over-limit cache, answer.
    pub(super) fn deny(
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
            return self.fail(worker, &"shim denied without saying which check", now, fx);
        };
        let Some(policy) = worker.doc.policies.get(index) else {
            self.phase = Phase::Admitted;
            return;
        };
        fx.count(index, PolicyStat::Denied);
        fx.count_class(self.admission.class, ClassStat::Denied);
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
            LocalReply::reduced_capacity(policy, worker.doc.classes.name(self.admission.class), retry_after)
        } else {
            LocalReply::denial(policy, retry_after, headers)
        };
        reply.headers.extend(shadow_notes.iter().map(|note| (SHADOW_HEADER.into(), note.clone().into())));
        let verdict = if held_out_by_reserve(policy, outcome) { Verdict::Shed } else { Verdict::Denied };
        self.refuse(worker, reply, verdict, fx);
    }

    /// The shim gave no usable answer: `failure_mode` decides. Deny wins if
    /// any enforced policy that applies says deny; its status is the first such one's.
    pub(super) fn fail(&mut self, worker: &Worker, reason: &dyn Display, now: u64, fx: &mut Effects) {
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
                self.refuse(worker, LocalReply::unavailable(status), Verdict::FailureDenied, fx);
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
    pub(super) fn leased_headers(
        &self,
        worker: &Worker,
        shim: Option<(RateLimitHeaders, u64)>,
    ) -> Option<RateLimitHeaders> {
        let leased = self.admission.leased_views.iter().min_by_key(|(_, remaining, _)| *remaining).and_then(
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

    pub(super) fn ratelimit_headers(
        &self,
        worker: &Worker,
        resp: &CheckResponse,
    ) -> Option<(RateLimitHeaders, u64)> {
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
}

/// A shim failure let a request policy `index` applied to through: the
/// `failure_allowed` stat, and the worker's next report to the shim, which
/// never saw the request.
fn failure_passed(worker: &Worker, index: usize, fx: &mut Effects) {
    fx.count(index, PolicyStat::FailureAllowed);
    worker.failure_passed(index);
}

/// Whether a concurrency pool refused the request because its reserve holds
/// the request's class out: the service is short of capacity (503), not the
/// client over a quota.
fn held_out_by_reserve(policy: &Policy, outcome: &CheckOutcome) -> bool {
    policy.limits.iter().zip(&outcome.limits).any(|(limit, o)| !o.allowed && limit.reserve().is_some())
}

/// The occupancy of the pool of each admitted policy that sheds by it.
fn observe_pools(worker: &Worker, policies: &[usize], checks: &[Check], resp: &CheckResponse) {
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
                let occupancy = pool_occupancy(full.get(), u64::from(full.get()).saturating_sub(held));
                worker.change_shedding(|shedding| shedding.observe(index, occupancy));
            }
        }
    }
}
