//! Waiting on time-based limits: one atomic call (`lua/lib/reserve.lua`, the
//! waiting path of `lua/scripts/check.lua`) finds the earliest slot at which
//! every limit admits the request and charges them all there, or, if that
//! slot is further away than the wait, charges nothing and says how far it
//! is. The shim then sleeps until the slot, which is on Redis's clock (never
//! its own view of the time), placed on the shim's clock by the calls so far
//! (`timer::RedisClock`).
//!
//! At its slot a held request confirms its send (`lua/scripts/confirm.lua`)
//! against what was really sent on its keys: a request behind one that woke
//! late is told how much longer to wait, sleeps that long and confirms
//! again, so lateness shifts those behind by the lateness, in order, and the
//! gap between two sends is never under the interval. A late send that
//! pushes held requests past their deadlines drops them from the chain in
//! the same call and names them, in its reply and on the fleet's pub/sub
//! channel (`wakeups`): the shim that holds each, this one or another,
//! refuses it at once ([`Held::push_out`](super::Held)), told the wait it
//! would have had as its retry-after, and gives back the rest of its
//! reservation. One whose shim has not had the message when it confirms at
//! its slot (it is still on its way, or the subscriber was reconnecting)
//! finds its reservation gone and reserves again within what is left of its
//! wait: it gets a new place or the exact retry-after, as any refused
//! request does (nothing is sent out of the chain).
//!
//! If the client goes away while the answer is held (Envoy resets the h2
//! stream and hyper drops the handler's future), a drop guard ([`Cancel`])
//! spawns `lua/scripts/cancel.lua`, which gives the reservation back.
//!
//! A request of a policy that reads upstream feedback may have reserved its
//! slot before the partner paused the key. At its slot it checks the pause
//! (`lua/scripts/paused.lua`); if the key is paused, it gives the slot back
//! and reserves again, from the pause's end, within what is left of its wait.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_policies::algorithm::Algorithm;
use sluice_policies::units::Micros;
use sluice_policies::wire::{CheckRequest, CheckResponse};

use super::context::{ceil_ms, margins, moved_on, refuse_unsupported, Waiting};
use super::held::Ended;
use super::timer;
use crate::decision::{by_check, decode, store_error, CheckError, SlotReply};
use crate::keys::ScriptLimit;
use crate::logs::Throttled;
use crate::scripts::Scripts;
use crate::store::RedisClient;

/// Redis failures that every waiter or check meets in an outage: one line a minute each.
static GIVE_BACK_FAILED_LOG: Throttled = Throttled::per_minute();

/// A waiting check on time-based limits only: reserve, hold, answer.
pub(crate) async fn check(
    waiting: &Waiting,
    req: &CheckRequest<'_>,
    limits: &[ScriptLimit],
    id: &str,
    now: &str,
    wait_us: u64,
) -> Result<CheckResponse, CheckError> {
    let pauses: Vec<&ScriptLimit> =
        limits.iter().filter(|l| matches!(l.algorithm, Algorithm::Pause)).collect();
    let started = Instant::now();
    // The request's time, moved on by the hold (the shim's test mode), or Redis TIME.
    let at_now = |elapsed: Duration| moved_on(now, elapsed);
    let mut left_us = wait_us;
    let deadline = started + Duration::from_micros(wait_us);
    loop {
        let now = at_now(started.elapsed());
        let asked = Instant::now();
        let reply = reserve_owned(waiting, limits, &now, id, left_us, margins(req)).await?;
        let received = Instant::now();
        let mut response = CheckResponse {
            allowed: reply.allowed,
            retry_after_ms: reply.retry_after_ms,
            checks: by_check(req, reply.limits.into_iter()),
            lease: None,
            waited_ms: None,
        };
        let Some(at) = reply.at.filter(|_| reply.allowed) else { return Ok(response) };
        let delay = Duration::from_micros(at.saturating_sub(u64::try_from(reply.now).unwrap_or(0)));
        if delay.is_zero() {
            // Sent at once: the reservation recorded the send.
            response.waited_ms =
                (started.elapsed() > Duration::ZERO && left_us < wait_us).then(|| ceil_ms(started.elapsed()));
            return Ok(response);
        }
        // The slot on our clock, between `earliest` and `wake`: from Redis's
        // clock as the calls so far bound it, or (a request's own time, the
        // test mode) from this call alone: the script ran after `asked` and
        // before `received`. Waking at `wake` is never early; lateness is
        // counted from `earliest`.
        let (earliest, wake) = if now.is_empty() {
            waiting.clock.place(asked, received, u64::try_from(reply.now).unwrap_or(0), at)
        } else {
            (asked + delay, received + delay)
        };
        let mut guard = Cancel::new(waiting, id, at, limits.to_vec(), &now);
        let mut holding = waiting.held.hold(id);
        let _counted = waiting.metrics.hold();
        let mut until = wake;
        let mut first = true;
        let mut gone = false;
        loop {
            tokio::select! {
                () = timer::sleep_until(until) => {}
                ended = &mut holding.released => {
                    if let Ok(Ended::Pushed(us)) = ended {
                        // A late send ahead pushed it past its deadline.
                        guard.give_back().await;
                        return Ok(pushed_out(response, us));
                    }
                    // Let go by a release for this id: the guard, still armed, gives
                    // the reservation back as it is dropped.
                    return Ok(CheckResponse { allowed: false, retry_after_ms: None, ..response });
                }
                hold_until = waiting.drain.closed() => {
                    // The shim drains: served if the slot comes before the hold
                    // deadline; else the reservation is given back (awaited: the
                    // process exits soon) and the client told when its slot was.
                    if until > hold_until {
                        guard.give_back().await;
                        let retry = ceil_ms(until.saturating_duration_since(Instant::now()));
                        return Ok(CheckResponse { allowed: false, retry_after_ms: Some(retry), ..response });
                    }
                    timer::sleep_until(until).await;
                }
            }
            if first {
                first = false;
                waiting.metrics.woke(Instant::now().saturating_duration_since(earliest));
                // The partner may have paused the key while this request was
                // held for a slot reserved before the pause: then its slot
                // falls inside the pause. Give it back and reserve again from
                // the pause's end, within what is left of the wait.
                if !pauses.is_empty() && paused_for(waiting, &pauses, &at_now(started.elapsed())).await? > 0 {
                    break;
                }
            }
            let margins = margins(req);
            match confirm(waiting, limits, &at_now(started.elapsed()), id, at, &margins).await? {
                Confirmed::Sent { pushed } => {
                    guard.disarm();
                    for (other, wait_us) in &pushed {
                        waiting.held.push_out(other, *wait_us);
                    }
                    response.waited_ms = Some(ceil_ms(started.elapsed()));
                    return Ok(response);
                }
                Confirmed::Gone => {
                    // No longer held: pushed past its deadline (the push's
                    // message, if it came meanwhile, says how long it would
                    // have waited) or dropped past it. The script gave the
                    // rest back.
                    guard.disarm();
                    if let Ok(Ended::Pushed(us)) = holding.released.try_recv() {
                        return Ok(pushed_out(response, us));
                    }
                    // The push's message is still on its way (or there was
                    // none): ask again within what is left of the wait, so
                    // the request gets a place or the exact retry-after,
                    // never a bare refusal after it waited.
                    gone = true;
                    break;
                }
                Confirmed::Wait(us) => {
                    // Behind a send that went late: shifted by its lateness,
                    // unless that carries it past its own deadline.
                    waiting.metrics.shifted();
                    until = Instant::now() + Duration::from_micros(us);
                    if until > deadline {
                        guard.give_back().await;
                        let retry = ceil_ms(Duration::from_micros(us));
                        return Ok(CheckResponse { allowed: false, retry_after_ms: Some(retry), ..response });
                    }
                }
            }
        }
        if !gone {
            guard.give_back().await;
        }
        left_us = wait_us.saturating_sub(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
    }
}

/// A held request a late send pushed past its deadline: refused, told the
/// wait it would have had.
fn pushed_out(response: CheckResponse, us: u64) -> CheckResponse {
    CheckResponse { allowed: false, retry_after_ms: Some(ceil_ms(Duration::from_micros(us))), ..response }
}

/// What a held request at its slot may do (`lua/scripts/confirm.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmed {
    /// Sent now, and recorded; `pushed`: the held requests this send pushed
    /// past their deadlines, each with the wait (µs) it would have had.
    Sent { pushed: Vec<(String, u64)> },
    /// Not yet: wait this many µs more and confirm again.
    Wait(u64),
    /// No longer held: refused, the rest given back.
    Gone,
}

/// One call of `lua/scripts/confirm.lua` for request `id`, reserved at `at`.
pub(crate) async fn confirm(
    waiting: &Waiting,
    limits: &[ScriptLimit],
    now: &str,
    id: &str,
    at: u64,
    margins: &[u64],
) -> Result<Confirmed, CheckError> {
    let mut call = waiting.scripts.confirm.prepare_invoke();
    call.arg(now).arg(id).arg(at);
    for (limit, margin) in limits.iter().zip(margins) {
        let (name, [a, b, c, _]) = limit.script_args(now);
        call.key(&limit.key).arg(name).arg(a).arg(b).arg(c).arg(*margin);
    }
    let reply: (i64, i64, i64, Vec<(String, i64)>) =
        waiting.store.invoke(&call).await.map_err(store_error)?;
    match reply {
        (1, _, _, pushed) => Ok(Confirmed::Sent {
            pushed: pushed.into_iter().map(|(id, us)| (id, u64::try_from(us).unwrap_or(0))).collect(),
        }),
        (0, wait, _, _) => Ok(Confirmed::Wait(u64::try_from(wait).unwrap_or(0).max(1))),
        (-1, _, _, _) => Ok(Confirmed::Gone),
        _ => Err(CheckError::Store(format!("unexpected confirm reply {reply:?}"))),
    }
}

/// Runs `lua/scripts/confirm.lua` for a held reservation, for tests: what a
/// held request does at its slot.
pub async fn confirm_at(
    waiting: &Waiting,
    req: &CheckRequest<'_>,
    now: Option<Micros>,
    at: u64,
) -> Result<Confirmed, CheckError> {
    let limits = crate::keys::script_limits(&req.checks)?;
    let now = waiting.time_arg(now)?;
    let id = req.id.as_deref().unwrap_or("reserved");
    confirm(waiting, &limits, &now, id, at, &margins(req)).await
}

/// How much longer the partner's pauses hold, in µs (`lua/scripts/paused.lua`).
async fn paused_for(waiting: &Waiting, pauses: &[&ScriptLimit], now: &str) -> Result<u64, CheckError> {
    let mut call = waiting.scripts.paused.prepare_invoke();
    call.arg(now);
    for pause in pauses {
        call.key(&pause.key);
    }
    let left: i64 = waiting.store.invoke(&call).await.map_err(store_error)?;
    Ok(u64::try_from(left).unwrap_or(0))
}

/// A waiting request's reservation, not held: for tests.
#[derive(Debug)]
pub struct Reserved {
    pub response: CheckResponse,
    /// The slot admitted at, in µs on Redis's clock; `None` when denied.
    pub at: Option<u64>,
    /// The time the script decided at.
    pub now: u64,
}

/// Reserves a waiting request's time slots (one Redis slot, time-based
/// limits) without holding it: what [`check`] does before it sleeps.
pub async fn reserve_request(waiting: &Waiting, req: &CheckRequest<'_>) -> Result<Reserved, CheckError> {
    let limits = crate::keys::script_limits(&req.checks)?;
    let wait_us = req.wait_ms.unwrap_or_default().as_micros().get();
    refuse_unsupported(&limits, wait_us)?;
    let now = waiting.time_arg(req.now_us)?;
    let id = req.id.as_deref().unwrap_or("reserved");
    let reply = reserve(waiting, &limits, &now, id, wait_us, &margins(req), false).await?;
    Ok(Reserved {
        at: reply.at.filter(|_| reply.allowed),
        now: u64::try_from(reply.now).unwrap_or(0),
        response: CheckResponse {
            allowed: reply.allowed,
            retry_after_ms: reply.retry_after_ms,
            checks: by_check(req, reply.limits.into_iter()),
            lease: None,
            waited_ms: None,
        },
    })
}

/// One call of the check script's waiting path.
pub(crate) async fn reserve(
    waiting: &Waiting,
    limits: &[ScriptLimit],
    now: &str,
    id: &str,
    wait_us: u64,
    margins: &[u64],
    hold: bool,
) -> Result<SlotReply, CheckError> {
    let mut call = waiting.scripts.check.prepare_invoke();
    call.arg(now).arg(id);
    for limit in limits {
        let (name, [a, b, c, d]) = limit.script_args(now);
        call.key(&limit.key).arg(name).arg(a).arg(b).arg(c).arg(d);
    }
    call.arg(wait_us);
    for margin in margins {
        call.arg(*margin);
    }
    if hold {
        call.arg("hold");
    }
    let reply: Vec<i64> = waiting.store.call(&call).await.map_err(store_error)?;
    decode(limits.len(), &reply)
        .ok_or_else(|| CheckError::Store(format!("unexpected script reply {reply:?}")))
}

/// The check script's waiting path in a task of its own. If the waiter goes
/// away while the script runs (its client resets the stream and hyper drops
/// the handler), the reply still comes, and a slot held for it is given
/// back instead of staying held until its deadline (a phantom slot). A
/// reply lost to an error (a response timeout: the script may have run all
/// the same) is given back by id once the waiter has its answer.
async fn reserve_owned(
    waiting: &Waiting,
    limits: &[ScriptLimit],
    now: &str,
    id: &str,
    wait_us: u64,
    margins: Vec<u64>,
) -> Result<SlotReply, CheckError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (w, limits, now, id) = (waiting.clone(), limits.to_vec(), now.to_string(), id.to_string());
    // Counted: a draining shim exits only once it has run.
    let cleanup = waiting.drain.cleanup();
    tokio::spawn(async move {
        let _cleanup = cleanup;
        let reply = reserve(&w, &limits, &now, &id, wait_us, &margins, false).await;
        let failed = reply.is_err();
        match tx.send(reply) {
            Err(Ok(reply)) => {
                let sent_at = u64::try_from(reply.now).unwrap_or(0);
                if let Some(at) = reply.at.filter(|&at| reply.allowed && at > sent_at) {
                    Cancel::new(&w, &id, at, limits, &now).give_back().await;
                }
            }
            // A fixed window's count needs the slot to find its window: that
            // one stays counted until its window ends.
            _ if failed => Cancel::new(&w, &id, 0, limits, &now).give_back().await,
            _ => {}
        }
    });
    rx.await.map_err(|_| CheckError::Store("the reservation's task ended without a reply".into()))?
}

/// Gives a held reservation back if dropped while armed: the client went away.
pub(crate) struct Cancel {
    store: Arc<RedisClient>,
    scripts: Arc<Scripts>,
    id: String,
    at: u64,
    limits: Vec<ScriptLimit>,
    /// The script time the reservation was made with: moved on by the hold.
    now: String,
    started: Instant,
    armed: bool,
    drain: Arc<crate::drain::Drain>,
}

impl Cancel {
    /// Armed, for a reservation at `at` made with the script time `now`.
    pub(crate) fn new(waiting: &Waiting, id: &str, at: u64, limits: Vec<ScriptLimit>, now: &str) -> Cancel {
        Cancel {
            store: waiting.store.clone(),
            scripts: waiting.scripts.clone(),
            id: id.to_string(),
            at,
            limits,
            now: now.to_string(),
            started: Instant::now(),
            armed: true,
            drain: waiting.drain.clone(),
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

/// What the cancel script needs, owned, so that it can run after the guard.
struct GiveBack {
    store: Arc<RedisClient>,
    scripts: Arc<Scripts>,
    now: String,
    id: String,
    at: u64,
    limits: Vec<ScriptLimit>,
}

impl GiveBack {
    async fn run(self) -> redis::RedisResult<i64> {
        let mut call = self.scripts.cancel.prepare_invoke();
        call.arg(&self.now).arg(&self.id).arg(self.at);
        for limit in &self.limits {
            let (name, [a, b, c, d]) = limit.script_args(&self.now);
            call.key(&limit.key).arg(name).arg(a).arg(b).arg(c).arg(d);
        }
        self.store.invoke::<i64>(&call).await
    }
}

impl Cancel {
    fn give_back_args(&mut self) -> GiveBack {
        GiveBack {
            store: self.store.clone(),
            scripts: self.scripts.clone(),
            now: moved_on(&self.now, self.started.elapsed()),
            id: self.id.clone(),
            at: self.at,
            limits: std::mem::take(&mut self.limits),
        }
    }

    /// Gives the reservation back now and waits for it: the request reserves
    /// again under the same id, which a late cancel must not touch.
    pub(crate) async fn give_back(mut self) {
        self.armed = false;
        let args = self.give_back_args();
        let id = args.id.clone();
        if let Err(err) = args.run().await {
            if let Some(suppressed) = GIVE_BACK_FAILED_LOG.admit() {
                tracing::warn!(?id, %err, suppressed, "cannot give back a held reservation");
            }
        }
    }
}

impl Drop for Cancel {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let args = self.give_back_args();
        let id = args.id.clone();
        // Counted: a draining shim exits only once it has run.
        let cleanup = self.drain.cleanup();
        runtime.spawn(async move {
            let _cleanup = cleanup;
            match args.run().await {
                Ok(_) => tracing::debug!(?id, "client gone while held: reservation given back"),
                Err(err) => {
                    if let Some(suppressed) = GIVE_BACK_FAILED_LOG.admit() {
                        tracing::warn!(?id, %err, suppressed, "cannot give back a cancelled reservation");
                    }
                }
            }
        });
    }
}

/// Runs `lua/scripts/cancel.lua` for a reservation now, for tests: what the drop
/// guard does when the client goes away.
pub async fn cancel(
    waiting: &Waiting,
    limits: &[ScriptLimit],
    now: Option<Micros>,
    id: &str,
    at: u64,
) -> Result<(), CheckError> {
    let now = waiting.time_arg(now)?;
    let mut call = waiting.scripts.cancel.prepare_invoke();
    call.arg(&now).arg(id).arg(at);
    for limit in limits {
        let (name, [a, b, c, d]) = limit.script_args(&now);
        call.key(&limit.key).arg(name).arg(a).arg(b).arg(c).arg(d);
    }
    let _: i64 = waiting.store.invoke(&call).await.map_err(store_error)?;
    Ok(())
}
