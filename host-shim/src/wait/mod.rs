//! Egress waiting: a check with `wait_ms` is held instead of denied, until
//! its slot comes or its wait runs out.
//!
//! # Layout
//!
//! Arrows run one way, down this list:
//! - this module: [`check`] sends a waiting check down the path its limits
//!   need.
//! - [`mixed`]: a concurrency slot and time slots together.
//! - [`queue`]: a concurrency slot: the fleet-wide FCFS queue, hand-over,
//!   reclaim timers.
//! - [`time`]: time slots: reserve, hold until the slot, confirm the send
//!   against what was really sent (a late send shifts those behind), give
//!   back.
//! - [`context`]: what the paths share: the [`Waiting`] context, what
//!   waiting refuses, the margins.
//! - [`wakeups`]: the shim's one pub/sub subscriber: it wakes queued
//!   requests and refuses held ones another shim's send pushed out.
//! - [`held`]: the requests held for a time slot, by id, and why a hold
//!   ends before its slot.
//! - `timer`: waking a held request at its slot's instant, not on Tokio's
//!   next millisecond tick.
//!
//! Approximate windows keep no per-request state, so they cannot reserve; a
//! waiting request holding one is refused (400).

pub mod context;
pub mod held;
pub mod mixed;
pub mod queue;
pub mod time;
mod timer;
pub mod wakeups;

pub(crate) use context::refuse_unsupported;
pub use context::{Timers, Waiting, MAX_WAIT_MS};
pub use held::Held;
pub use time::{cancel, confirm_at, reserve_request, Confirmed, Reserved};

use sluice_policies::algorithm::Algorithm;
use sluice_policies::wire::{CheckRequest, CheckResponse};

use crate::decision::CheckError;
use crate::keys::ScriptLimit;

/// A waiting check on one Redis slot: on a concurrency limit alone, on one
/// with time limits, or on time limits only.
pub(crate) async fn check(
    waiting: &Waiting,
    req: &CheckRequest<'_>,
    limits: &[ScriptLimit],
    id: &str,
    now: &str,
    wait_us: u64,
) -> Result<CheckResponse, CheckError> {
    if let [limit @ ScriptLimit { algorithm: Algorithm::Concurrency { .. }, .. }] = limits {
        return queue::check(waiting, req, limit, id, now, wait_us).await;
    }
    if limits.iter().any(|l| matches!(l.algorithm, Algorithm::Concurrency { .. })) {
        return mixed::check(waiting, req, limits, id, now, wait_us).await;
    }
    time::check(waiting, req, limits, id, now, wait_us).await
}
