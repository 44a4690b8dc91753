//! What every waiting path shares: the [`Waiting`] context the limiter
//! hands over (Redis, its scripts, the wake-ups, the timers, the held
//! requests), what waiting refuses, and each limit's margin.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_policies::algorithm::Algorithm;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::CheckRequest;
use sluice_policies::Invalid;

use super::held::Held;
use super::wakeups::Wakeups;
use crate::decision::CheckError;
use crate::drain::Drain;
use crate::keys::ScriptLimit;
use crate::metrics::Metrics;
use crate::scripts::Scripts;
use crate::store::RedisClient;

/// What egress waiting needs of the shim, handed to it by the limiter that
/// holds it: Redis and its scripts, the wake-up subscriber, the queue's
/// timers, the requests held for a time slot, the metrics, and the time mode.
#[derive(Clone)]
pub struct Waiting {
    pub(crate) store: Arc<RedisClient>,
    pub(crate) scripts: Arc<Scripts>,
    /// The shim's one pub/sub subscriber, for waiters on concurrency slots.
    pub(crate) wakeups: Arc<Wakeups>,
    pub(crate) timers: Arc<Timers>,
    /// Requests held until their time slot, by id: a release for the id
    /// (the filter's, when the client goes away) ends the hold at once.
    pub(crate) held: Arc<Held>,
    pub(crate) metrics: Arc<Metrics>,
    /// Redis's clock seen from ours, to wake held requests at their slots.
    pub(crate) clock: Arc<super::timer::RedisClock>,
    /// Whether a request's `now_us` is honoured (`--test-time`).
    pub(crate) test_time: bool,
    /// The shim's drain: holds end by its deadline, give-backs are awaited.
    pub(crate) drain: Arc<Drain>,
}

impl Waiting {
    /// The script's time argument: empty for Redis TIME.
    pub(crate) fn time_arg(&self, now_us: Option<Micros>) -> Result<String, CheckError> {
        match (now_us, self.test_time) {
            (None, _) => Ok(String::new()),
            (Some(now), true) => Ok(now.get().to_string()),
            (Some(_), false) => {
                Err(CheckError::BadRequest("now_us is honoured only with --test-time".into()))
            }
        }
    }
}

/// The script's time argument `elapsed` after `now`: Redis TIME (empty)
/// stays itself; a request's explicit time (the shim's test mode) moves on
/// by `elapsed`, as Redis's clock would have.
pub(crate) fn moved_on(now: &str, elapsed: Duration) -> String {
    match now.parse::<u64>() {
        Ok(t) => (t + u64::try_from(elapsed.as_micros()).unwrap_or(0)).to_string(),
        Err(_) => String::new(),
    }
}

/// `d` in whole milliseconds, rounded up: a wait or a hold told to a
/// client is never short of the real one.
pub(crate) fn ceil_ms(d: Duration) -> Millis {
    Millis(u64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(u64::MAX))
}

/// What a request still queued for a concurrency slot when the drain's
/// hold deadline comes is told to wait before it tries again (elsewhere):
/// when a slot frees is unknown, and another shim can queue it at once.
pub const DRAIN_RETRY_MS: u64 = 1000;

/// The longest a request may be held: a day, far beyond any sane wait, and
/// short enough that deadlines never overflow.
pub const MAX_WAIT_MS: u64 = 86_400_000;

/// Refuses what waiting cannot do: a wait beyond [`MAX_WAIT_MS`], approximate windows, a window's cost
/// above 1, and more than one concurrency limit (one queue per request).
pub(crate) fn refuse_unsupported(limits: &[ScriptLimit], wait_us: u64) -> Result<(), Invalid> {
    if wait_us > MAX_WAIT_MS * 1000 {
        return Err(Invalid::at("wait_ms", format!("at most {MAX_WAIT_MS} (a day)")));
    }
    if limits.iter().any(|l| matches!(l.algorithm, Algorithm::SlidingApprox { .. })) {
        return Err(Invalid::at(
            "wait_ms",
            "an approximate sliding window cannot wait (it keeps no per-request \
                    state to reserve a slot in); use an exact sliding_window",
        ));
    }
    if limits.iter().any(|l| matches!(l.algorithm, Algorithm::FirstHit { .. })) {
        return Err(Invalid::at(
            "wait_ms",
            "a first_hit window cannot wait (a slot's window would be the one a \
                    later request starts)",
        ));
    }
    if limits.iter().any(|l| matches!(l.algorithm, Algorithm::Calendar { .. })) {
        return Err(Invalid::at(
            "wait_ms",
            "a calendar window cannot wait (a full one opens again at its end, \
                    hours or days away)",
        ));
    }
    if limits.iter().any(|l| matches!(l.algorithm, Algorithm::FixedWindow { cost: 2.., .. })) {
        return Err(Invalid::at(
            "wait_ms",
            "a fixed_window reserves one request's slot; a cost above 1 cannot wait",
        ));
    }
    let leases = limits.iter().filter(|l| matches!(l.algorithm, Algorithm::Concurrency { .. })).count();
    if leases > 1 {
        return Err(Invalid::at("wait_ms", "a request can wait on one concurrency limit, not several"));
    }
    Ok(())
}

/// The margin of each limit, in µs: its check's `margin_ms`.
pub(crate) fn margins(req: &CheckRequest<'_>) -> Vec<u64> {
    req.checks
        .iter()
        .flat_map(|c| std::iter::repeat_n(c.margin_ms.unwrap_or_default().as_micros().get(), c.limits.len()))
        // The partner's pauses and rates, after every limit (`keys::script_limits`), have none.
        .chain(req.checks.iter().filter(|c| c.upstream).flat_map(|_| [0, 0]))
        .collect()
}

/// One reclaim timer per lease set, at the soonest lease expiry a waiter was
/// told about (armed by the queue, `Timers::arm`).
#[derive(Default)]
pub struct Timers {
    pub(super) armed: std::sync::Mutex<std::collections::HashMap<String, Instant>>,
}
