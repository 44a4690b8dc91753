//! Egress waiting on a concurrency limit: the request joins the fleet-wide
//! FCFS queue in Redis (`lua/scripts/acquire.lua`) and waits, without polling, for a
//! release or reclaim to hand it a slot and wake it by pub/sub ([`super::wakeups`]).
//!
//! - On its deadline, or if its client goes away (the handler's future is
//!   dropped), it leaves the queue in one atomic call (`lua/scripts/leave.lua`); a
//!   slot handed to it meanwhile passes on to the next waiter.
//! - While it waits, the shim arms one timer per lease set at the soonest
//!   lease expiry it was told about and then reclaims (`lua/scripts/reclaim.lua`), so
//!   a crashed holder's slot reaches the queue without new traffic.
//! - A wait that times out is answered allowed=false, retry unknown (None).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_policies::algorithm::Algorithm;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{CheckOutcome, CheckRequest, CheckResponse, LimitOutcome};

use super::context::{ceil_ms, Timers, Waiting};
use crate::decision::{store_error, CheckError};
use crate::keys::ScriptLimit;
use crate::logs::Throttled;
use crate::scripts::Scripts;
use crate::store::RedisClient;

/// Redis failures that every waiter or check meets in an outage: one line a minute each.
static LEAVE_FAILED_LOG: Throttled = Throttled::per_minute();
static RECLAIM_FAILED_LOG: Throttled = Throttled::per_minute();

/// What `lua/scripts/acquire.lua` answered: the reference model's own type, as the
/// script mirrors the model (`sluice_policies::algorithm::queue::acquire`).
/// A `soonest` of `None` needs no timer.
pub use sluice_policies::algorithm::queue::AcquireReply;

pub(crate) fn args(limit: &ScriptLimit) -> (u64, u64) {
    match limit.algorithm {
        Algorithm::Concurrency { limit, lease_us } => (limit, lease_us.get()),
        _ => (0, 0),
    }
}

/// One call of `lua/scripts/acquire.lua`; also (test mode) the differential test's.
pub async fn acquire(
    waiting: &Waiting,
    limit: &ScriptLimit,
    now: &str,
    id: &str,
    wait_us: u64,
    channel: &str,
) -> Result<(AcquireReply, u64), CheckError> {
    let (n, lease) = args(limit);
    let mut call = waiting.scripts.acquire.prepare_invoke();
    call.key(&limit.key).arg(now).arg(id).arg(n).arg(lease).arg(wait_us).arg(channel);
    let reply: Vec<i64> = waiting.store.invoke(&call).await.map_err(store_error)?;
    decode("acquire", &reply)
}

/// The reply of `acquire.lua` or `take.lua`, `{state, now, reclaimed,
/// soonest}`: what became of the request, and how many leases it reclaimed.
pub(crate) fn decode(script: &str, reply: &[i64]) -> Result<(AcquireReply, u64), CheckError> {
    let &[state, _now, reclaimed, soonest] = reply else {
        return Err(CheckError::Store(format!("unexpected {script} reply {reply:?}")));
    };
    let reclaimed = u64::try_from(reclaimed).unwrap_or(0);
    Ok(match state {
        1 => (AcquireReply::Leased, reclaimed),
        0 => (AcquireReply::Queued { soonest: u64::try_from(soonest).ok() }, reclaimed),
        _ => (AcquireReply::Refused, reclaimed),
    })
}

/// `lua/scripts/leave.lua` for request `id`, for tests.
pub async fn leave_now(
    waiting: &Waiting,
    limit: &ScriptLimit,
    now: &str,
    id: &str,
) -> Result<i64, CheckError> {
    leave(&waiting.store, &waiting.scripts, limit, now, id).await
}

/// `lua/scripts/reclaim.lua`, for tests: (reclaimed, µs until the next timer).
pub async fn reclaim_now(
    waiting: &Waiting,
    limit: &ScriptLimit,
    now: &str,
) -> Result<(u64, Option<u64>), CheckError> {
    reclaim(&waiting.store, &waiting.scripts, limit, now).await
}

/// One call of `lua/scripts/leave.lua`: 1 left the queue, 2 passed a slot on, 0 neither.
async fn leave(
    store: &RedisClient,
    scripts: &Scripts,
    limit: &ScriptLimit,
    now: &str,
    id: &str,
) -> Result<i64, CheckError> {
    let (n, lease) = args(limit);
    let mut call = scripts.leave.prepare_invoke();
    call.key(&limit.key).arg(now).arg(id).arg(n).arg(lease);
    store.invoke(&call).await.map_err(store_error)
}

/// One call of `lua/scripts/reclaim.lua`: (reclaimed, µs until the next timer).
async fn reclaim(
    store: &RedisClient,
    scripts: &Scripts,
    limit: &ScriptLimit,
    now: &str,
) -> Result<(u64, Option<u64>), CheckError> {
    let (n, lease) = args(limit);
    let mut call = scripts.reclaim.prepare_invoke();
    call.key(&limit.key).arg(now).arg(n).arg(lease);
    let reply: Vec<i64> = store.invoke(&call).await.map_err(store_error)?;
    let &[reclaimed, soonest] = reply.as_slice() else {
        return Err(CheckError::Store(format!("unexpected reclaim reply {reply:?}")));
    };
    Ok((u64::try_from(reclaimed).unwrap_or(0), u64::try_from(soonest).ok()))
}

pub(crate) fn response(req: &CheckRequest<'_>, allowed: bool, reclaimed: u64) -> CheckResponse {
    let outcome = LimitOutcome {
        allowed,
        remaining: 0,
        reset_ms: Millis(0),
        retry_after_ms: allowed.then_some(Millis(0)),
        reclaimed,
        held_until_us: None,
        refunded_us: Micros(0),
    };
    CheckResponse {
        allowed,
        retry_after_ms: allowed.then_some(Millis(0)),
        checks: req
            .checks
            .iter()
            .map(|c| CheckOutcome { limits: vec![outcome; c.limits.len()], paused_ms: None })
            .collect(),
        lease: None,
        waited_ms: None,
    }
}

/// A waiting check whose one limit is a concurrency limit.
pub(crate) async fn check(
    waiting: &Waiting,
    req: &CheckRequest<'_>,
    limit: &ScriptLimit,
    id: &str,
    now: &str,
    wait_us: u64,
) -> Result<CheckResponse, CheckError> {
    let started = Instant::now();
    let deadline = started + Duration::from_micros(wait_us);
    let mut registration = waiting.wakeups.register(id);
    if !waiting.wakeups.subscribed(Duration::from_micros(wait_us)).await {
        return Err(CheckError::Store("the wake-up subscriber is not connected to Redis".into()));
    }
    let left_us = u64::try_from(deadline.saturating_duration_since(Instant::now()).as_micros()).unwrap_or(0);
    let (acquired, reclaimed) =
        acquire(waiting, limit, now, id, left_us.max(1), waiting.wakeups.channel()).await?;
    let soonest = match acquired {
        AcquireReply::Leased => {
            let mut resp = response(req, true, reclaimed);
            resp.lease = Some(id.to_string());
            return Ok(resp);
        }
        AcquireReply::Refused => return Ok(response(req, false, reclaimed)),
        AcquireReply::Queued { soonest } => soonest,
    };
    let mut guard = Leave::queued(waiting, limit, id, soonest);
    let _counted = waiting.metrics.hold();
    let lost = || CheckError::Store("the wake-up subscriber lost Redis while waiting".into());
    let woken = tokio::select! {
        woken = &mut registration.woken => woken.is_ok_and(|m| m == id),
        () = tokio::time::sleep_until(deadline.into()) => false,
        // The wake-up could not reach us: 503, and the filter applies
        // its failure_mode. The guard leaves the queue.
        () = waiting.wakeups.lost() => return Err(lost()),
        hold_until = waiting.drain.closed() => {
            // The shim drains: a slot handed over before the hold deadline
            // is served; after it, the request leaves the queue (awaited:
            // the process exits soon) and is refused, to retry elsewhere.
            let woken = tokio::select! {
                woken = &mut registration.woken => woken.is_ok_and(|m| m == id),
                () = tokio::time::sleep_until(deadline.min(hold_until).into()) => false,
                () = waiting.wakeups.lost() => return Err(lost()),
            };
            if !woken && Instant::now() < deadline {
                guard.leave().await;
                let mut resp = response(req, false, reclaimed);
                resp.retry_after_ms = Some(Millis(super::context::DRAIN_RETRY_MS));
                return Ok(resp);
            }
            woken
        }
    };
    if woken {
        guard.armed = false;
        let mut resp = response(req, true, reclaimed);
        resp.lease = Some(id.to_string());
        resp.waited_ms = Some(ceil_ms(started.elapsed()));
        return Ok(resp);
    }
    // Timed out: answered now, so never later than the wait; the guard,
    // still armed, leaves the queue from a spawned task (a slot handed over
    // meanwhile passes on to the next waiter).
    drop(guard);
    Ok(response(req, false, reclaimed))
}

/// Leaves the queue if dropped while armed: the wait ran out, or the client
/// went away.
pub(crate) struct Leave {
    pub store: Arc<RedisClient>,
    pub scripts: Arc<Scripts>,
    pub limit: ScriptLimit,
    pub id: String,
    pub armed: bool,
    drain: Arc<crate::drain::Drain>,
}

impl Leave {
    /// Armed for request `id`, just queued on `limit`; with the soonest
    /// lease expiry the queueing script reported (µs from now), arms the
    /// reclaim timer, so a crashed holder's slot reaches the queue.
    pub(crate) fn queued(waiting: &Waiting, limit: &ScriptLimit, id: &str, soonest: Option<u64>) -> Leave {
        if let Some(us) = soonest {
            waiting.timers.arm(waiting, limit, Duration::from_micros(us));
        }
        Leave {
            store: waiting.store.clone(),
            scripts: waiting.scripts.clone(),
            limit: limit.clone(),
            id: id.to_string(),
            armed: true,
            drain: waiting.drain.clone(),
        }
    }

    /// Leaves the queue now and waits for it (the drain: the process is
    /// about to exit, so a spawned call might never run).
    pub(crate) async fn leave(mut self) {
        self.armed = false;
        if let Err(err) = leave(&self.store, &self.scripts, &self.limit, "", &self.id).await {
            tracing::warn!(id = %self.id, ?err, "cannot leave the queue while draining; the deadline will skip it");
        }
    }
}

impl Drop for Leave {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (store, scripts, limit, id) =
            (self.store.clone(), self.scripts.clone(), self.limit.clone(), std::mem::take(&mut self.id));
        // Counted: a draining shim exits only once it has run.
        let cleanup = self.drain.cleanup();
        runtime.spawn(async move {
            let _cleanup = cleanup;
            match leave(&store, &scripts, &limit, "", &id).await {
                Ok(_) => tracing::debug!(?id, "client gone while queued: left the queue"),
                Err(err) => {
                    if let Some(suppressed) = LEAVE_FAILED_LOG.admit() {
                        tracing::warn!(
                            ?id,
                            ?err,
                            suppressed,
                            "cannot leave the queue; the deadline will skip it"
                        );
                    }
                }
            }
        });
    }
}

impl Timers {
    /// Arms the reclaim timer of `limit`'s lease set `after` from now, unless
    /// one is armed sooner.
    pub(crate) fn arm(&self, waiting: &Waiting, limit: &ScriptLimit, after: Duration) {
        // A millisecond past the expiry: the lease is live while now < expiry.
        let at = Instant::now() + after + Duration::from_millis(1);
        {
            let Ok(mut armed) = self.armed.lock() else { return };
            if armed.get(&limit.key).is_some_and(|&t| t <= at) {
                return;
            }
            armed.insert(limit.key.clone(), at);
        }
        let (store, scripts, timers, limit) =
            (waiting.store.clone(), waiting.scripts.clone(), waiting.timers.clone(), limit.clone());
        tokio::spawn(async move {
            let mut at = at;
            loop {
                tokio::time::sleep_until(at.into()).await;
                let next = match reclaim(&store, &scripts, &limit, "").await {
                    Ok((_, next)) => next,
                    Err(err) => {
                        if let Some(suppressed) = RECLAIM_FAILED_LOG.admit() {
                            tracing::warn!(?err, key = ?limit.key, suppressed, "reclaim for waiters failed");
                        }
                        None
                    }
                };
                let Ok(mut armed) = timers.armed.lock() else { return };
                if armed.get(&limit.key) != Some(&at) {
                    return;
                }
                match next {
                    Some(us) => {
                        at = Instant::now() + Duration::from_micros(us) + Duration::from_millis(1);
                        armed.insert(limit.key.clone(), at);
                    }
                    None => {
                        armed.remove(&limit.key);
                        return;
                    }
                }
            }
        });
    }
}
