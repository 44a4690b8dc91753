//! The decisions: each request's checks as one atomic script call per Redis
//! Cluster slot, and the releases and adjustments that follow.
//!
//! On one Redis server every limit of a request goes into one call. On a
//! cluster, the checks are grouped by the slot of their hash tag, one call
//! per slot. If any slot denies, the slots that admitted are refunded
//! (`lua/scripts/refund.lua`): reserve-then-refund. While a reservation stands, other
//! requests see it, so the race can under-admit for that moment; it never
//! over-admits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::cluster_routing::Slot;
use redis::Script;
use sluice_policies::algorithm::{self, Algorithm, Refusals};
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{
    AdjustRequest, AdjustResponse, CheckRequest, CheckResponse, FeedbackRequest, FeedbackResponse,
    LeaseRequest, LeaseResponse, LimitOutcome, ReleaseRequest, ReleaseResponse, RenewRequest, RenewResponse,
    ShedRequest, ShedResponse, Views, COUNT_REFUSED, NO_RESET_WHEN_ADMITTED,
};
use sluice_policies::Invalid;

pub use crate::decision::CheckError;
use crate::decision::{by_check, decode, store_error, SlotReply};
use crate::keys::{
    feedback_keys, lease_key, script_adjustments, script_limits, valid_id, ScriptLimit, MAX_CHECKS,
};
use crate::scripts::Scripts;
use crate::store::{Connect, RedisClient, Target};
use crate::wait::Waiting;

/// Redis failures that every waiter or check meets in an outage: one line a minute each.
static REFUND_FAILED_LOG: crate::logs::Throttled = crate::logs::Throttled::per_minute();

pub struct Limiter {
    pub(crate) store: Arc<RedisClient>,
    pub(crate) scripts: Arc<Scripts>,
    /// Egress waiting's share of the shim (the same store, scripts and
    /// metrics, with the wake-ups, timers and holds).
    waiting: Waiting,
    /// The load shedder's fleet-wide controller (`lua/scripts/shed.lua`).
    shed: Arc<crate::shed::ShedScript>,
    /// What `GET /metrics` shows; the store and the wake-ups count in it too.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// Whether Redis's eviction policy can reset limits (`GET /healthz`).
    pub(crate) eviction: Arc<crate::eviction::Eviction>,
    /// Random per process: with `sequence` it makes request ids unique across shims.
    nonce: u64,
    sequence: AtomicU64,
}

impl Limiter {
    /// Connects lazily: the shim starts while Redis is down, and checks fail
    /// (and reconnect) until it is up.
    pub fn new(target: &Target, timeout: Duration, test_time: bool) -> anyhow::Result<Limiter> {
        Limiter::connect(&Connect { target, timeout, ca: None }, test_time)
    }

    /// As [`Limiter::new`], reaching Redis as `how` says: TLS with a CA of
    /// its own for both the store and the wake-up subscriber.
    pub fn connect(how: &Connect<'_>, test_time: bool) -> anyhow::Result<Limiter> {
        let nonce: u64 = rand::random();
        let url = match how.target {
            Target::Single(url) => url.clone(),
            Target::Cluster(seeds) => seeds.first().cloned().unwrap_or_default(),
            // The subscriber asks the store for the master the sentinels name.
            Target::Sentinel { .. } => String::new(),
        };
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let store = Arc::new(RedisClient::connect(how)?.with_metrics(metrics.clone()));
        let scripts = Arc::new(Scripts::new());
        let held: Arc<crate::wait::Held> = Arc::default();
        let waiting = Waiting {
            store: store.clone(),
            scripts: scripts.clone(),
            wakeups: Arc::new(
                crate::wait::wakeups::Wakeups::new(url, nonce)
                    .with_ca(how.ca.clone())
                    .counting(&metrics)
                    .following(matches!(how.target, Target::Sentinel { .. }).then(|| store.clone()))
                    .refusing(held.clone()),
            ),
            timers: Arc::default(),
            held,
            clock: Arc::default(),
            metrics: metrics.clone(),
            test_time,
            drain: Arc::default(),
        };
        // Listening before the first waiter comes (when there is a runtime
        // to run the subscriber; a limiter built outside one starts it on
        // first use).
        if tokio::runtime::Handle::try_current().is_ok() {
            waiting.wakeups.start();
        }
        Ok(Limiter {
            store,
            scripts,
            waiting,
            shed: Arc::default(),
            metrics,
            eviction: Arc::default(),
            nonce,
            sequence: AtomicU64::new(0),
        })
    }

    /// This limiter on a Redis connection of its own, sharing all else (the
    /// waiting, the metrics, the scripts, the shedder): for a thread that
    /// serves its own listener (`--listeners per-thread`), whose checks then
    /// go to Redis and back on that thread. Its request ids take a nonce of
    /// their own. A waiting check still goes through the shared waiting's
    /// connection.
    pub fn on_own_connection(&self, how: &Connect<'_>) -> anyhow::Result<Limiter> {
        Ok(Limiter {
            store: Arc::new(RedisClient::connect(how)?.with_metrics(self.metrics.clone())),
            scripts: self.scripts.clone(),
            waiting: self.waiting.clone(),
            shed: self.shed.clone(),
            metrics: self.metrics.clone(),
            eviction: self.eviction.clone(),
            nonce: rand::random(),
            sequence: AtomicU64::new(0),
        })
    }

    /// Egress waiting's share of the shim: what the waiting paths
    /// (`wait`, `queue`, `mixed`) are called with.
    pub fn waiting(&self) -> &Waiting {
        &self.waiting
    }

    /// The shim's drain (SIGTERM): what `/healthz` and the waiters follow.
    pub fn drain(&self) -> &Arc<crate::drain::Drain> {
        &self.waiting.drain
    }

    /// The script's time argument: empty for Redis TIME.
    pub(crate) fn time_arg(&self, now_us: Option<Micros>) -> Result<String, CheckError> {
        self.waiting.time_arg(now_us)
    }

    /// The limits' indexes grouped by the Redis Cluster slot of their keys;
    /// one group on a single server.
    fn slot_groups(&self, limits: &[ScriptLimit]) -> Vec<Vec<usize>> {
        if !self.store.is_cluster() {
            return vec![(0..limits.len()).collect()];
        }
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut by_slot: HashMap<Slot, usize> = HashMap::new();
        for (i, limit) in limits.iter().enumerate() {
            let group = *by_slot.entry(Slot::for_key(&limit.key)).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[group].push(i);
        }
        groups
    }

    pub async fn check(&self, req: &CheckRequest<'_>) -> Result<CheckResponse, CheckError> {
        self.check_charging(req, Refusals::Uncharged).await
    }

    /// [`Limiter::check`], with what a refusal is charged: the RLS face's
    /// `charge: every_hit` counts it ([`Refusals::Counted`]), on windows
    /// only, decided at once.
    pub async fn check_charging(
        &self,
        req: &CheckRequest<'_>,
        refusals: Refusals,
    ) -> Result<CheckResponse, CheckError> {
        let limits = script_limits(&req.checks)?;
        let counted = refusals == Refusals::Counted;
        if counted
            && (req.wait_ms.is_some_and(|w| w.get() > 0) || !limits.iter().all(|l| l.algorithm.is_window()))
        {
            return Err(CheckError::BadRequest(
                "a refusal is counted only by windows, decided at once".to_string(),
            ));
        }
        let now = self.time_arg(req.now_us)?;
        if limits.is_empty() {
            return Ok(CheckResponse {
                allowed: true,
                retry_after_ms: Some(Millis(0)),
                checks: Vec::new(),
                lease: None,
                waited_ms: None,
            });
        }
        let id = match &req.id {
            Some(id) if valid_id(id) => id.to_string(),
            Some(_) => {
                return Err(CheckError::BadRequest("id: expected 1 to 64 of A-Z a-z 0-9 . _ -".into()))
            }
            None => format!("{:x}.{:x}", self.nonce, self.sequence.fetch_add(1, Ordering::Relaxed)),
        };
        let wait_us = req.wait_ms.unwrap_or_default().as_micros().get();
        if wait_us > 0 {
            crate::wait::refuse_unsupported(&limits, wait_us)?;
        }
        if req.checks.iter().any(|c| c.margin_ms.is_some_and(|m| m.get() > crate::wait::MAX_WAIT_MS)) {
            return Err(CheckError::BadRequest(format!(
                "margin_ms: at most {} (a day)",
                crate::wait::MAX_WAIT_MS
            )));
        }
        let groups = self.slot_groups(&limits);
        if wait_us > 0 && groups.len() == 1 {
            return crate::wait::check(&self.waiting, req, &limits, &id, &now, wait_us).await;
        }
        if wait_us > 0 {
            tracing::debug!(
                slots = groups.len(),
                "a waiting request whose checks span several Redis Cluster slots is decided at once"
            );
        }
        // Slot by slot, stopping at the first that denies or fails: a slot
        // after a denial would only be charged to be refunded. Counted
        // refusals charge every slot, and none is refunded.
        let mut replies = Vec::with_capacity(groups.len());
        let mut failed = None;
        for group in &groups {
            let group_limits: Vec<&ScriptLimit> = group.iter().map(|&i| &limits[i]).collect();
            match self.check_slot(&group_limits, &now, &id, req.views, refusals).await {
                Ok(reply) => {
                    let stop = !reply.allowed && !counted;
                    replies.push(reply);
                    if stop {
                        break;
                    }
                }
                Err(err) => {
                    failed = Some(err);
                    break;
                }
            }
        }
        let allowed = failed.is_none() && replies.len() == groups.len() && replies.iter().all(|r| r.allowed);
        if !allowed && !counted {
            // Give back what the slots before the denial (or failure) charged.
            // A refund that fails leaves that charge in place, which can only
            // under-admit; the decision stays a denial (never a 503 that
            // failure_mode could turn into an admission).
            for (group, reply) in groups.iter().zip(&replies).filter(|(_, r)| r.allowed) {
                let group_limits: Vec<&ScriptLimit> = group.iter().map(|&i| &limits[i]).collect();
                if let Err(err) = self.refund(&group_limits, reply, &id).await {
                    if let Some(suppressed) = REFUND_FAILED_LOG.admit() {
                        tracing::warn!(
                            ?err,
                            suppressed,
                            "refund after a denial failed; the charge stays until it expires"
                        );
                    }
                }
            }
        }
        if let Some(err) = failed {
            return Err(err);
        }
        // Slots never asked (after the denial) show their limits as full.
        let mut outcomes: Vec<LimitOutcome> = limits.iter().map(|l| unasked(&l.algorithm)).collect();
        for (group, reply) in groups.iter().zip(&replies) {
            for (&i, outcome) in group.iter().zip(&reply.limits) {
                outcomes[i] = *outcome;
            }
        }
        let checks = by_check(req, outcomes.into_iter());
        let holds_lease = limits.iter().any(|l| matches!(l.algorithm, Algorithm::Concurrency { .. }));
        Ok(CheckResponse {
            allowed,
            retry_after_ms: combined_retry(&replies),
            checks,
            lease: (allowed && holds_lease).then_some(id),
            waited_ms: None,
        })
    }

    pub(crate) async fn check_slot(
        &self,
        limits: &[&ScriptLimit],
        now: &str,
        id: &str,
        views: Views,
        refusals: Refusals,
    ) -> Result<SlotReply, CheckError> {
        let mut call = self.scripts.check.prepare_invoke();
        call.arg(now).arg(id);
        for limit in limits {
            let (name, [a, b, c, d]) = limit.script_args(now);
            call.key(&limit.key).arg(name).arg(a).arg(b).arg(c).arg(d);
        }
        let counted = refusals == Refusals::Counted;
        if !views.reset_when_admitted() || counted {
            // No wait, then the views and the refusals (check.lua's arguments).
            call.arg(0).arg(if views.reset_when_admitted() { "" } else { NO_RESET_WHEN_ADMITTED });
        }
        if counted {
            call.arg(COUNT_REFUSED);
        }
        let reply: Vec<i64> = self.store.call(&call).await.map_err(store_error)?;
        decode(limits.len(), &reply)
            .ok_or_else(|| CheckError::Store(format!("unexpected script reply {reply:?}")))
    }

    /// Takes back what `reply`'s slot charged for request `id`
    /// (`lua/scripts/refund.lua`).
    async fn refund(&self, limits: &[&ScriptLimit], reply: &SlotReply, id: &str) -> Result<(), CheckError> {
        let mut call = self.scripts.refund.prepare_invoke();
        call.arg(reply.now).arg(id);
        // A calendar's ends around the time of the charge hold its window.
        let charged_at = reply.now.to_string();
        for limit in limits {
            let (name, [a, b, c, d]) = limit.script_args(&charged_at);
            call.key(&limit.key).arg(name).arg(a).arg(b).arg(c).arg(d);
        }
        // Where each bucket's charge ended, for its refund log (settle.lua).
        for outcome in &reply.limits {
            call.arg(outcome.held_until_us.map_or(0, Micros::get)).arg(outcome.refunded_us.get());
        }
        let _: i64 = self.store.invoke(&call).await.map_err(store_error)?;
        Ok(())
    }

    /// Ends the lease of an admitted request on each of its concurrency
    /// limits, hands the freed slots to waiters, and tombstones the lease id.
    pub async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResponse, CheckError> {
        self.release_at(req, None).await
    }

    /// [`Limiter::release`] at an explicit time (test mode only).
    pub async fn release_at(
        &self,
        req: &ReleaseRequest,
        now_us: Option<Micros>,
    ) -> Result<ReleaseResponse, CheckError> {
        let now = self.time_arg(now_us)?;
        let leases = lease_limits(req)?;
        // A request this shim still holds for its time slot is let go: its
        // reservation is given back where safe (wait::Cancel).
        self.waiting.held.cancel(&req.lease);
        let released = self.on_leases(&self.scripts.release, &req.lease, &leases, &now).await?;
        Ok(ReleaseResponse { released })
    }

    /// Keeps the leases of a request still in flight: each live one lasts
    /// another lease length from now. Renewing never admits: a lease
    /// already gone stays gone.
    pub async fn renew(&self, req: &RenewRequest) -> Result<RenewResponse, CheckError> {
        self.renew_at(req, None).await
    }

    /// [`Limiter::renew`] at an explicit time (test mode only).
    pub async fn renew_at(
        &self,
        req: &RenewRequest,
        now_us: Option<Micros>,
    ) -> Result<RenewResponse, CheckError> {
        let now = self.time_arg(now_us)?;
        let leases = lease_limits(req)?;
        let renewed = self.on_leases(&self.scripts.renew, &req.lease, &leases, &now).await?;
        Ok(RenewResponse { renewed })
    }

    /// Runs `script` (release.lua or renew.lua) for lease `lease` on each
    /// of `leases`, one call per Redis Cluster slot; the leases it ended or
    /// renewed.
    async fn on_leases(
        &self,
        script: &Script,
        lease: &str,
        leases: &[ScriptLimit],
        now: &str,
    ) -> Result<u64, CheckError> {
        let mut changed = 0;
        for group in self.slot_groups(leases) {
            let mut call = script.prepare_invoke();
            call.arg(lease).arg(now);
            for i in group {
                let (_, [limit, lease_us, ..]) = leases[i].algorithm.script_args(0);
                call.key(&leases[i].key).arg(limit).arg(lease_us);
            }
            changed += self.store.invoke::<u64>(&call).await.map_err(store_error)?;
        }
        Ok(changed)
    }

    /// Load shedding: records a gateway's utilization report for a policy
    /// (or, without one, only reads) and answers the fleet's shed level.
    pub async fn shed(&self, req: &ShedRequest) -> Result<ShedResponse, CheckError> {
        let settings = req.settings()?;
        if req.now_ms.is_some() && !self.waiting.test_time {
            return Err(CheckError::BadRequest("now_ms is honoured only with --test-time".into()));
        }
        let level = match req.utilization {
            Some(u) => {
                self.shed.report(&self.store, &req.policy, req.classes, &settings, u, req.now_ms).await
            }
            None => self.shed.read(&self.store, &req.policy, req.classes).await,
        };
        Ok(ShedResponse { level: level?.level })
    }

    /// Charges or refunds points once the true costs are known, each
    /// settlement once per key (`lua/lib/settle.lua`): what each moved.
    pub async fn adjust(&self, req: &AdjustRequest) -> Result<AdjustResponse, CheckError> {
        let adjustments = script_adjustments(&req.adjustments)?;
        let now = self.time_arg(req.now_us)?;
        let mut moved = vec![0; adjustments.len()];
        // One call per key keeps every call in one slot.
        for (a, moved) in adjustments.iter().zip(&mut moved).filter(|(a, _)| a.delta != 0) {
            let mut call = self.scripts.adjust.prepare_invoke();
            call.arg(&now)
                .arg(a.id.as_deref().unwrap_or_default())
                .key(&a.key)
                .arg(a.interval_us)
                .arg(a.delta)
                .arg(a.held_until_us)
                .arg(a.refunded_us);
            let reply: Vec<i64> = self.store.invoke(&call).await.map_err(store_error)?;
            *moved = reply.first().copied().unwrap_or_default();
        }
        self.metrics.settled(&req.adjustments, &moved);
        Ok(AdjustResponse { moved })
    }

    /// Leased mode: takes back a gateway's unused tokens, then grants it up
    /// to `want` more of the window (`lua/scripts/lease.lua`) or the bucket
    /// (`lua/scripts/lease_bucket.lua`), in one atomic call.
    pub async fn lease(&self, req: &LeaseRequest) -> Result<LeaseResponse, CheckError> {
        let limit = lease_key(req)?;
        let now = self.time_arg(req.now_us)?;
        let mut call = match (limit.algorithm, req.ttl_ms) {
            (Algorithm::FixedWindow { limit: most, window_us, .. }, None) => {
                let mut call = self.scripts.lease.prepare_invoke();
                call.key(&limit.key).arg(now).arg(most).arg(window_us.get()).arg(req.want);
                match req.give_back {
                    Some(back) => call.arg(back.window).arg(back.tokens),
                    None => call.arg("").arg(0),
                };
                call
            }
            (Algorithm::Gcra { interval_us, burst, cost: 1 }, Some(period)) => {
                let mut call = self.scripts.lease_bucket.prepare_invoke();
                call.key(&limit.key).arg(now).arg(interval_us.get()).arg(burst);
                call.arg(period.as_micros().get()).arg(req.want);
                match req.give_back {
                    Some(back) => {
                        call.arg(back.window).arg(back.tokens).arg(back.charged.unwrap_or(back.tokens))
                    }
                    None => call.arg("").arg(0).arg(0),
                };
                call
            }
            // `validate` refused anything else.
            _ => return Err(CheckError::BadRequest("limit: not a leased kind".into())),
        };
        if let Some(id) = req.call {
            // Same slot: the calls' record shares the limit's hash tag.
            call.key(algorithm::lease_calls_key(&limit.key)).arg(id.gateway.to_string()).arg(id.seq);
        }
        let reply: Vec<i64> = self.store.invoke(&call).await.map_err(store_error)?;
        let unexpected = || CheckError::Store(format!("unexpected lease reply {reply:?}"));
        let [granted, window, expires_in_us, remaining] = reply[..] else { return Err(unexpected()) };
        let count = |n: i64| u64::try_from(n).map_err(|_| unexpected());
        Ok(LeaseResponse {
            granted: u32::try_from(granted).map_err(|_| unexpected())?,
            window: count(window)?,
            // Rounded down: the gateway stops spending no later than the window ends.
            expires_in_ms: Millis(count(expires_in_us)? / 1000),
            remaining: count(remaining)?,
        })
    }

    /// Records the partner's pauses, fleet-wide and extend-only, and lowers
    /// the rates of keys it refused while they ran freely.
    pub async fn feedback(&self, req: &FeedbackRequest) -> Result<FeedbackResponse, CheckError> {
        if req.pauses.len() > MAX_CHECKS {
            return Err(CheckError::BadRequest(format!("too many pauses: at most {MAX_CHECKS}")));
        }
        let now = self.time_arg(req.now_us)?;
        let mut out = FeedbackResponse { extended: 0, slowed: 0 };
        // One call per key keeps every call in one slot.
        for (i, pause) in req.pauses.iter().enumerate() {
            let at = format!("pauses[{i}]");
            let [pause_key, rate_key] =
                feedback_keys(&pause.policy, &pause.key).map_err(|e| e.within(&at))?;
            if pause.pause_ms.get() > MAX_PAUSE_MS {
                return Err(Invalid::at("pause_ms", format!("at most {MAX_PAUSE_MS}")).within(&at).into());
            }
            let slow = match &pause.slow {
                Some(slow) => {
                    slow.validate().map_err(|e| e.within("slow").within(&at))?;
                    [slow.decrease_ppm, slow.recover_ms.as_micros().get(), slow.min_ppm]
                }
                None => [0, 0, 0],
            };
            let mut call = self.scripts.upstream.prepare_invoke();
            call.arg(&now).key(pause_key).key(rate_key).arg(pause.pause_ms.as_micros().get());
            for n in slow {
                call.arg(n);
            }
            let (moved, slowed): (u64, u64) = self.store.invoke(&call).await.map_err(store_error)?;
            self.metrics.fed_back(&pause.policy, moved > 0, slowed > 0);
            out.extended += moved;
            out.slowed += slowed;
        }
        Ok(out)
    }
}

/// The longest pause the shim records: a day. The filter clamps to each
/// policy's `max_pause` first; this bounds a caller that does not.
pub const MAX_PAUSE_MS: u64 = 86_400_000;

/// The outcome shown for a limit on a cluster slot the shim did not ask
/// (another slot had already denied): allowed, with its whole capacity.
fn unasked(algorithm: &Algorithm) -> LimitOutcome {
    let capacity = match *algorithm {
        Algorithm::FixedWindow { limit, .. }
        | Algorithm::SlidingWindow { limit, .. }
        | Algorithm::SlidingApprox { limit, .. }
        | Algorithm::Concurrency { limit, .. }
        | Algorithm::Calendar { limit, .. }
        | Algorithm::FirstHit { limit, .. } => limit,
        Algorithm::Gcra { burst, .. } => burst,
        Algorithm::Pause => 1,
        Algorithm::Rate => sluice_policies::algorithm::rate::PPM,
    };
    LimitOutcome {
        allowed: true,
        remaining: capacity,
        reset_ms: Millis(0),
        retry_after_ms: Some(Millis(0)),
        reclaimed: 0,
        held_until_us: None,
        refunded_us: Micros(0),
    }
}

/// Admitted: 0. Denied: the longest wait of any denying slot, unknown if any is.
/// The concurrency limits a release or renewal names, checked.
fn lease_limits(req: &ReleaseRequest) -> Result<Vec<ScriptLimit>, CheckError> {
    let limits = script_limits(&req.checks)?;
    if req.lease.is_empty() || req.lease.len() > 64 {
        return Err(CheckError::BadRequest("a lease id is 1 to 64 bytes".into()));
    }
    Ok(limits.into_iter().filter(|l| matches!(l.algorithm, Algorithm::Concurrency { .. })).collect())
}

fn combined_retry(replies: &[SlotReply]) -> Option<Millis> {
    let denied: Vec<&SlotReply> = replies.iter().filter(|r| !r.allowed).collect();
    if denied.is_empty() {
        return Some(Millis(0));
    }
    denied.iter().try_fold(Millis(0), |most, r| r.retry_after_ms.map(|ms| most.max(ms)))
}
