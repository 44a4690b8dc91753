//! Egress waiting on a concurrency limit together with time-based limits,
//! in an order that never holds one slot idle while waiting for another:
//!
//! 1. reserve the time slots (FCFS, `lua/lib/reserve.lua`) without taking the
//!    concurrency slot; a time slot beyond the wait is refused at once;
//! 2. at the time slot, take the concurrency slot if it is free and nobody
//!    waits (`lua/scripts/take.lua`); if not, give back the time reservation where
//!    provably safe and queue for the concurrency slot, time limits attached;
//! 3. a hand-over re-checks the time limits in the same atomic call
//!    (`lua/lib/queue.lua`): admissible now, they are charged and the slot is
//!    ours; otherwise our time slot t' is reserved, the concurrency slot
//!    passes on to the next waiter, and we go back to 2 at t'.
//!
//! Everything is bounded by the wait; cancellation and timeouts give back
//! what the current step holds (`time::Cancel`, `queue::Leave`).

use std::time::{Duration, Instant};

use sluice_policies::algorithm::Algorithm;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{CheckRequest, CheckResponse, LimitOutcome};

use super::context::{ceil_ms, margins, moved_on, Waiting};
use super::queue::{args, decode, AcquireReply, Leave};
use super::time::{reserve, Cancel};
use crate::decision::{by_check, store_error, CheckError};
use crate::keys::ScriptLimit;

/// The time limits as `lua/lib/slots.lua` reads them from a waiter's record.
fn specs(time: &[ScriptLimit], margins: &[u64]) -> String {
    let mut out = Vec::new();
    for (limit, margin) in time.iter().zip(margins) {
        // A calendar window never waits: the three numbers of the others.
        let (name, [a, b, c, _]) = limit.algorithm.script_args(0);
        out.push(format!("{} {name} {a} {b} {c} {margin}", limit.key));
    }
    out.join(" ")
}

/// One call of `lua/scripts/take.lua`; also the differential test's.
#[allow(clippy::too_many_arguments)]
pub async fn take(
    waiting: &Waiting,
    concurrency: &ScriptLimit,
    time: &[ScriptLimit],
    margins: &[u64],
    now: &str,
    id: &str,
    wait_us: u64,
    channel: &str,
    at: u64,
    held: &[u64],
) -> Result<(AcquireReply, u64), CheckError> {
    let (n, lease) = args(concurrency);
    let mut call = waiting.scripts.take.prepare_invoke();
    call.key(&concurrency.key);
    for limit in time {
        call.key(&limit.key);
    }
    call.arg(now).arg(id).arg(n).arg(lease).arg(wait_us).arg(channel).arg(at).arg(specs(time, margins));
    for h in held {
        call.arg(*h);
    }
    let reply: Vec<i64> = waiting.store.invoke(&call).await.map_err(store_error)?;
    decode("take", &reply)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A waiting check with one concurrency limit and time-based limits.
pub(crate) async fn check(
    waiting: &Waiting,
    req: &CheckRequest<'_>,
    limits: &[ScriptLimit],
    id: &str,
    now: &str,
    wait_us: u64,
) -> Result<CheckResponse, CheckError> {
    let started = Instant::now();
    let deadline = started + Duration::from_micros(wait_us);
    let all_margins = margins(req);
    let is_lease = |l: &ScriptLimit| matches!(l.algorithm, Algorithm::Concurrency { .. });
    let Some(concurrency) = limits.iter().find(|l| is_lease(l)) else {
        return Err(CheckError::BadRequest("no concurrency limit".into()));
    };
    let (time, time_margins): (Vec<ScriptLimit>, Vec<u64>) =
        limits.iter().zip(&all_margins).filter(|(l, _)| !is_lease(l)).map(|(l, m)| (l.clone(), *m)).unzip();

    // 1. The time slots, FCFS, without the concurrency slot.
    let reply = reserve(waiting, &time, now, id, wait_us, &time_margins, true).await?;
    let mut time_outcomes = reply.limits.clone().into_iter();
    let free = LimitOutcome {
        allowed: true,
        remaining: 0,
        reset_ms: Millis(0),
        retry_after_ms: Some(Millis(0)),
        reclaimed: 0,
        held_until_us: None,
        refunded_us: Micros(0),
    };
    let outcomes: Vec<LimitOutcome> = limits
        .iter()
        .map(|l| if is_lease(l) { free } else { time_outcomes.next().unwrap_or(free) })
        .collect();
    let answer = |allowed: bool, retry: Option<Millis>, lease: bool, waited: bool| CheckResponse {
        allowed,
        retry_after_ms: retry,
        checks: by_check(
            req,
            outcomes.iter().zip(limits).map(|(o, l)| {
                if is_lease(l) {
                    LimitOutcome { allowed, retry_after_ms: allowed.then_some(Millis(0)), ..*o }
                } else {
                    *o
                }
            }),
        ),
        lease: lease.then(|| id.to_string()),
        waited_ms: waited.then(|| ceil_ms(started.elapsed())),
    };
    let Some(mut at) = reply.at.filter(|_| reply.allowed) else {
        return Ok(answer(false, reply.retry_after_ms, false, false));
    };
    let mut held: Vec<u64> = reply.limits.iter().map(|l| l.held_until_us.map_or(0, Micros::get)).collect();
    let mut delay = at.saturating_sub(u64::try_from(reply.now).unwrap_or(0));
    // Held at all (a time slot ahead, or the queue): then `waited_ms` is set.
    let mut held_any = delay > 0;
    loop {
        let _counted = waiting.metrics.hold();
        // Hold until the time slot; a client gone meanwhile gives it back.
        let mut cancel = Cancel::new(waiting, id, at, time.clone(), now);
        // Never past the deadline, whatever a wake-up said.
        let until = (Instant::now() + Duration::from_micros(delay.min(wait_us))).min(deadline);
        tokio::select! {
            () = super::timer::sleep_until(until) => {}
            hold_until = waiting.drain.closed() => {
                // The shim drains: held on if the time slot comes before the
                // hold deadline; else given back (awaited) and refused.
                if until > hold_until {
                    cancel.give_back().await;
                    let retry = ceil_ms(until.saturating_duration_since(Instant::now()));
                    return Ok(answer(false, Some(retry), false, false));
                }
                super::timer::sleep_until(until).await;
            }
        }
        let mut registration = waiting.wakeups.register(id);
        let left = deadline.saturating_duration_since(Instant::now());
        if !waiting.wakeups.subscribed(left).await {
            return Err(CheckError::Store("the wake-up subscriber is not connected to Redis".into()));
        }
        // 2. The concurrency slot, or the queue.
        let left = micros(deadline.saturating_duration_since(Instant::now())).max(1);
        let script_now = moved_on(now, started.elapsed());
        let channel = waiting.wakeups.channel().to_string();
        let (acquired, _) =
            take(waiting, concurrency, &time, &time_margins, &script_now, id, left, &channel, at, &held)
                .await?;
        cancel.disarm();
        let soonest = match acquired {
            AcquireReply::Leased => return Ok(answer(true, Some(Millis(0)), true, held_any)),
            AcquireReply::Refused => return Ok(answer(false, None, false, false)),
            AcquireReply::Queued { soonest } => soonest,
        };
        let mut leave = Leave::queued(waiting, concurrency, id, soonest);
        // 3. The hand-over decides, with our time limits.
        let lost = || CheckError::Store("the wake-up subscriber lost Redis while waiting".into());
        let message = tokio::select! {
            woken = &mut registration.woken => woken.ok(),
            () = tokio::time::sleep_until(deadline.into()) => None,
            () = waiting.wakeups.lost() => return Err(lost()),
            hold_until = waiting.drain.closed() => {
                // The shim drains: a hand-over before the hold deadline is
                // taken; after it, the request leaves the queue (awaited) and
                // is refused, to retry elsewhere.
                let message = tokio::select! {
                    woken = &mut registration.woken => woken.ok(),
                    () = tokio::time::sleep_until(deadline.min(hold_until).into()) => None,
                    () = waiting.wakeups.lost() => return Err(lost()),
                };
                if message.is_none() && Instant::now() < deadline {
                    leave.leave().await;
                    return Ok(answer(false, Some(Millis(super::context::DRAIN_RETRY_MS)), false, false));
                }
                message
            }
        };
        let Some(message) = message else {
            // Timed out: answered now; the armed guard leaves the queue.
            return Ok(answer(false, None, false, false));
        };
        // Handed over or refused: we are out of the queue either way.
        leave.armed = false;
        held_any = true;
        let words: Vec<&str> = message.split(' ').collect();
        match words.as_slice() {
            [_] => return Ok(answer(true, Some(Millis(0)), true, true)),
            [_, slot, wait] => {
                at = slot.parse().map_err(|_| CheckError::Store(format!("bad wake-up {message:?}")))?;
                delay = wait.parse().map_err(|_| CheckError::Store(format!("bad wake-up {message:?}")))?;
                // The hand-over's reservation is held under our id: a
                // give-back finds it by id.
                held = vec![0; time.len()];
            }
            _ => return Ok(answer(false, None, false, false)),
        }
    }
}
