//! The compact JSON the filter and the shim exchange. Internal to Sluice: both
//! ends are built from this module.
//!
//! - `POST /v1/check`: a [`CheckRequest`], answered by a [`CheckResponse`].
//! - `POST /v1/release`: a [`ReleaseRequest`] at the end of an admitted
//!   request that holds a lease, answered by a [`ReleaseResponse`].
//! - `POST /v1/adjust`: an [`AdjustRequest`] once a response tells the true
//!   cost of a `points` request, answered by 200 and `{}`.
//! - `POST /v1/lease`: a [`LeaseRequest`] from a gateway's root context for
//!   a leased policy (see [`crate::leased`]), answered by a [`LeaseResponse`].

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::algorithm::Algorithm;
use crate::cost::read_cost;
use crate::limit::Cost;
use crate::units::MAX_COUNT;
use crate::{Applied, Count, Duration, Limit, Request};

pub const CHECK_PATH: &str = "/v1/check";
pub const RELEASE_PATH: &str = "/v1/release";
pub const RENEW_PATH: &str = "/v1/renew";
pub const ADJUST_PATH: &str = "/v1/adjust";
pub const FEEDBACK_PATH: &str = "/v1/feedback";
pub const SHED_PATH: &str = "/v1/shed";
pub const LEASE_PATH: &str = "/v1/lease";

/// Every policy that applies to one request. The shim decides them all at
/// once: the request is admitted, and charged, only if every limit allows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest<'a> {
    /// Borrowed when the filter sends its own checks, owned when the shim reads them.
    pub checks: Cow<'a, [Check]>,
    /// An id the filter chose for this request (1 to 64 of `A-Z a-z 0-9 . _ -`).
    /// The shim uses it as the request's log entry and lease id, so the filter
    /// can release a lease whose answer it never saw (a client reset while the
    /// check was in flight). Without it, the shim makes one up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Cow<'a, str>>,
    /// An explicit time in microseconds since the epoch, honoured only by a
    /// shim started with `--test-time`; otherwise the shim refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_us: Option<u64>,
    /// Egress waiting: the longest the shim may hold the request before it
    /// admits it, in milliseconds. Absent (or 0), the request is decided now.
    /// With it, the shim reserves the earliest time at which every limit
    /// admits the request (or queues it for a concurrency slot), holds its
    /// answer until then, and refuses at once, reserving nothing, a request
    /// whose slot lies further away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// One policy's limits on one key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    pub policy: String,
    /// The encoded key, see [`crate::key`].
    pub key: String,
    pub limits: Vec<WireLimit>,
    /// Egress waiting: milliseconds added to each time-based slot of this
    /// check's limits when the request is reserved (see the README's `wait.margin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin_ms: Option<u64>,
    /// Upstream feedback: this check's policy reads the partner's "slow
    /// down", so the shim checks the pause recorded for its key with its
    /// limits, in the same script call.
    #[serde(default, skip_serializing_if = "is_false")]
    pub upstream: bool,
}

/// A limit as the shim takes it: durations in milliseconds, the request's
/// cost resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum WireLimit {
    FixedWindow {
        limit: u32,
        window_ms: u64,
    },
    SlidingWindow {
        limit: u32,
        window_ms: u64,
        #[serde(default, skip_serializing_if = "is_false")]
        approximate: bool,
    },
    TokenBucket {
        rate: u32,
        per_ms: u64,
        burst: u32,
    },
    LeakyBucket {
        capacity: u32,
        drain_ms: u64,
    },
    Interval {
        every_ms: u64,
    },
    Concurrency {
        limit: u32,
        lease_ms: u64,
    },
    Points {
        capacity: u32,
        refill_ms: u64,
        cost: u32,
    },
}

fn is_false(b: &bool) -> bool {
    !b
}

/// The longest a bucket may take to refill completely: ten years.
pub const MAX_REFILL_US: u64 = 10 * 365 * 24 * 3600 * 1_000_000;

impl WireLimit {
    /// `limit` as it applies to `req` of `class`: a `points` cost read from
    /// its header; a `concurrency` pool less its reserve for a class the
    /// reserve holds out.
    pub fn of(limit: &Limit, req: &impl Request, class: usize) -> WireLimit {
        match limit {
            Limit::Points { cost, capacity, .. } => {
                WireLimit::with_cost(limit, request_cost(cost, capacity.get(), req))
            }
            Limit::Concurrency { limit, lease, reserve: Some(reserve) } => WireLimit::Concurrency {
                limit: reserve.pool_for(limit.get(), class),
                lease_ms: lease.as_millis(),
            },
            _ => WireLimit::with_cost(limit, 1),
        }
    }

    /// `limit` with a `points` cost of `cost`.
    pub fn with_cost(limit: &Limit, cost: u32) -> WireLimit {
        match *limit {
            Limit::FixedWindow { limit, window } => {
                WireLimit::FixedWindow { limit: limit.get(), window_ms: window.as_millis() }
            }
            Limit::SlidingWindow { limit, window, approximate } => {
                WireLimit::SlidingWindow { limit: limit.get(), window_ms: window.as_millis(), approximate }
            }
            Limit::TokenBucket { rate, per, burst } => {
                WireLimit::TokenBucket { rate: rate.get(), per_ms: per.as_millis(), burst: burst.get() }
            }
            Limit::LeakyBucket { capacity, drain } => {
                WireLimit::LeakyBucket { capacity: capacity.get(), drain_ms: drain.as_millis() }
            }
            Limit::Interval { every } => WireLimit::Interval { every_ms: every.as_millis() },
            Limit::Concurrency { limit, lease, .. } => {
                WireLimit::Concurrency { limit: limit.get(), lease_ms: lease.as_millis() }
            }
            Limit::Points { capacity, refill, .. } => {
                WireLimit::Points { capacity: capacity.get(), refill_ms: refill.as_millis(), cost }
            }
        }
    }

    /// Checks the ranges the policy language guarantees, for a shim that
    /// must not trust its caller: counts 1 to 1e9, durations 1 ms to a year,
    /// a bucket unit of at least a microsecond, a refill of at most ten years,
    /// a points cost of at most the capacity.
    pub fn validate(&self) -> Result<(), String> {
        let (counts, durations): (&[u32], &[u64]) = match self {
            WireLimit::FixedWindow { limit, window_ms }
            | WireLimit::SlidingWindow { limit, window_ms, .. } => (&[*limit], &[*window_ms]),
            WireLimit::TokenBucket { rate, per_ms, burst } => (&[*rate, *burst], &[*per_ms]),
            WireLimit::LeakyBucket { capacity, drain_ms } => (&[*capacity], &[*drain_ms]),
            WireLimit::Interval { every_ms } => (&[], &[*every_ms]),
            WireLimit::Concurrency { limit, lease_ms } => (&[*limit], &[*lease_ms]),
            WireLimit::Points { capacity, refill_ms, .. } => (&[*capacity], &[*refill_ms]),
        };
        if let Some(n) = counts.iter().find(|n| Count::new(u64::from(**n)).is_none()) {
            return Err(format!("count {n} out of range (1 to {MAX_COUNT})"));
        }
        if let Some(ms) = durations.iter().find(|ms| Duration::from_millis(**ms).is_none()) {
            return Err(format!("duration {ms}ms out of range (1ms to 365d)"));
        }
        let (period_ms, units, burst) = match *self {
            WireLimit::TokenBucket { rate, per_ms, burst } => (per_ms, rate, burst),
            WireLimit::LeakyBucket { capacity, drain_ms } => (drain_ms, capacity, capacity),
            WireLimit::Points { capacity, refill_ms, .. } => (refill_ms, capacity, capacity),
            _ => return Ok(()),
        };
        if period_ms * 1000 < u64::from(units) {
            return Err(format!(
                "{units} per {} is more than one per microsecond, the finest rate Sluice keeps",
                Duration::from_millis(period_ms).map(|d| d.to_string()).unwrap_or_default()
            ));
        }
        if let WireLimit::Points { capacity, cost, .. } = *self {
            if cost > capacity {
                return Err(format!("cost {cost} exceeds the capacity {capacity}"));
            }
        }
        if let Algorithm::Gcra { interval_us, .. } = Algorithm::of(self) {
            if interval_us.saturating_mul(u64::from(burst)) > MAX_REFILL_US {
                return Err("the bucket would take more than ten years to refill".to_string());
            }
        }
        Ok(())
    }
}

/// A request's cost, at most `capacity` (see [`crate::cost`]): a header
/// value that is not a whole number counts as the default.
fn request_cost(cost: &Cost, capacity: u32, req: &impl Request) -> u32 {
    match cost {
        Cost::Fixed(n) => *n,
        Cost::Header { header, default } => {
            req.header(header.as_str()).and_then(|v| read_cost(&v, capacity)).unwrap_or(*default)
        }
    }
}

impl Applied<'_> {
    pub fn check(&self, req: &impl Request) -> Check {
        Check {
            policy: self.policy.name.as_str().to_string(),
            key: self.key.clone(),
            limits: self.policy.limits.iter().map(|l| WireLimit::of(l, req, self.class)).collect(),
            margin_ms: self.policy.wait.map(|w| w.margin_ms()),
            upstream: self.policy.upstream.is_some(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckResponse {
    pub allowed: bool,
    /// When denied: the earliest time, in ms from now, at which the same
    /// request would pass; `None` when no one can know (a concurrency limit
    /// waits for a release). 0 when allowed.
    pub retry_after_ms: Option<u64>,
    /// One entry per check of the request, in order.
    pub checks: Vec<CheckOutcome>,
    /// When admitted with concurrency limits: the lease to release at the
    /// stream's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// Egress waiting: how long the shim held the request before admitting
    /// it, in milliseconds; absent when it was decided at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckOutcome {
    /// One entry per limit of the check, in order.
    pub limits: Vec<LimitOutcome>,
    /// Upstream feedback: the key is paused by the partner for this many
    /// more milliseconds; decided at once the check is refused, waiting its
    /// slot is the pause's end. Absent when not paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitOutcome {
    pub allowed: bool,
    /// Requests this limit would still admit after this one.
    pub remaining: u64,
    /// Milliseconds until this limit next frees capacity.
    pub reset_ms: u64,
    /// Milliseconds until this limit would admit the request; 0 if it did;
    /// `None` when unknown.
    pub retry_after_ms: Option<u64>,
    /// Expired leases this check reclaimed: their holders died without releasing.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reclaimed: u64,
    /// An admitted `points` limit: the time, in microseconds on the shim's
    /// clock, until which this request's charge holds in the bucket. A later
    /// refund can give back at most what is left of it: what the bucket has
    /// refilled since was never the request's to return.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_until_us: Option<u64>,
    /// With `held_until_us`: what the bucket's refunds had given back so
    /// far, in microseconds, when this charge was made. Refunds since then
    /// of earlier charges moved this one earlier; the counter tells a later
    /// refund by how much at most.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refunded_us: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl CheckResponse {
    /// The index of the first check that denied the request, if any.
    /// A limit's denial first; else a check whose key the partner paused.
    pub fn denied_check(&self) -> Option<usize> {
        self.checks
            .iter()
            .position(|c| c.limits.iter().any(|l| !l.allowed))
            .or_else(|| self.checks.iter().position(|c| c.paused_ms.is_some()))
    }
}

/// Ends the lease of an admitted request: the checks it was admitted with,
/// and the lease the shim gave it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    pub lease: String,
    pub checks: Vec<Check>,
}

/// Keeps the leases of a request still in flight: the same lease and checks
/// as its release.
pub type RenewRequest = ReleaseRequest;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewResponse {
    /// Leases renewed; 0 when they were gone (released, or reclaimed).
    pub renewed: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseResponse {
    /// Leases ended; 0 when they had already been released or reclaimed.
    pub released: u64,
}

/// Charges or refunds the difference between the estimated and the actual
/// cost of `points` requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdjustRequest {
    pub adjustments: Vec<Adjustment>,
    /// As in [`CheckRequest::now_us`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_us: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Adjustment {
    pub policy: String,
    pub key: String,
    /// The `points` limit as it was charged: its `cost` is the estimate.
    pub limit: WireLimit,
    pub actual: u32,
    /// The admitted check's `held_until_us` for this limit. A refund
    /// (`actual` below the estimate) without it returns nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_until_us: Option<u64>,
    /// The admitted check's `refunded_us` for this limit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refunded_us: u64,
}

/// Upstream feedback: the partner asked these keys to slow down. The shim
/// records each pause fleet-wide, extend-only (`lua/upstream.lua`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackRequest {
    pub pauses: Vec<Pause>,
    /// As in [`CheckRequest::now_us`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_us: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pause {
    pub policy: String,
    pub key: String,
    /// How long from now the partner asked us to stop, already clamped to
    /// the policy's `max_pause` by the filter.
    pub pause_ms: u64,
    /// The partner refused the call and the policy adapts its rate: the
    /// first refusal after the key ran freely lowers it (`lua/upstream.lua`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow: Option<Slowdown>,
}

/// How a refusal lowers a key's rate, in parts per million of the policy's
/// own (`algorithm::rate`): the filter sends it from the policy's `adapt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slowdown {
    /// The factor the rate is multiplied by.
    pub decrease_ppm: u64,
    /// How long the rate takes to climb from nothing back to the policy's own.
    pub recover_ms: u64,
    /// The lowest the rate goes.
    pub min_ppm: u64,
}

impl Slowdown {
    /// The longest `recover`: a day.
    pub const MAX_RECOVER_MS: u64 = 86_400_000;
    /// The lowest `min`: a thousandth of the policy's rate.
    pub const LEAST_MIN_PPM: u64 = 1_000;

    /// The bounds the parser and the shim both hold it to; the error starts
    /// with the field's name.
    pub fn validate(&self) -> Result<(), String> {
        use crate::algorithm::rate::PPM;
        if self.decrease_ppm == 0 || self.decrease_ppm >= PPM {
            return Err(format!(
                "decrease: above 0 and below 1, got {}",
                self.decrease_ppm as f64 / PPM as f64
            ));
        }
        if self.recover_ms == 0 || self.recover_ms > Self::MAX_RECOVER_MS {
            return Err(format!("recover: above 0 and at most 1d, got {} ms", self.recover_ms));
        }
        if !(Self::LEAST_MIN_PPM..=PPM).contains(&self.min_ppm) {
            return Err(format!(
                "min: at least 0.001 and at most 1, got {}",
                self.min_ppm as f64 / PPM as f64
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackResponse {
    /// Pauses that moved later (a shorter or stale answer moves none).
    pub extended: u64,
    /// Rates lowered (only the first refusal after a key ran freely lowers it).
    #[serde(default)]
    pub slowed: u64,
}

/// Load shedding: a gateway's utilization report for one policy, and a read
/// of the fleet's shed level. The shim runs the controller on one state per
/// policy (`lua/shed.lua`), so every gateway sheds the same fraction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShedRequest {
    pub policy: String,
    /// The document's classes, 1 to [`crate::class::MAX_CLASSES`].
    pub classes: usize,
    pub high: f64,
    pub low: f64,
    pub delay_ms: u64,
    pub ramp_ms: u64,
    pub recovery_ms: u64,
    /// The utilization this gateway saw since its last report, 0 to 1;
    /// absent, the level is only read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<f64>,
    /// As in [`CheckRequest::now_us`], in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_ms: Option<u64>,
}

impl ShedRequest {
    /// The report of `utilization` (none: a read) for `policy`.
    pub fn new(
        policy: &crate::Policy,
        shed: &crate::shed::Shed,
        classes: usize,
        utilization: Option<f64>,
    ) -> Self {
        let c = &shed.controller;
        ShedRequest {
            policy: policy.name.as_str().to_string(),
            classes,
            high: c.high,
            low: c.low,
            delay_ms: c.delay.as_millis(),
            ramp_ms: c.ramp.as_millis(),
            recovery_ms: c.recovery.as_millis(),
            utilization,
            now_ms: None,
        }
    }

    /// The controller's settings, checked as the parser checks a policy's.
    pub fn settings(&self) -> Result<crate::shed::ShedSettings, String> {
        let duration = |ms: u64, name: &str| {
            Duration::from_millis(ms).ok_or_else(|| format!("{name} {ms}ms out of range (1ms to 365d)"))
        };
        let settings = crate::shed::ShedSettings {
            high: self.high,
            low: self.low,
            delay: duration(self.delay_ms, "delay_ms")?,
            ramp: duration(self.ramp_ms, "ramp_ms")?,
            recovery: duration(self.recovery_ms, "recovery_ms")?,
        };
        settings.validate()?;
        if !(1..=crate::class::MAX_CLASSES).contains(&self.classes) {
            return Err(format!(
                "classes {} out of range (1 to {})",
                self.classes,
                crate::class::MAX_CLASSES
            ));
        }
        Ok(settings)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShedResponse {
    /// From 0 (nothing shed) to `classes - 1` (every class but the most
    /// critical): see [`crate::shed::Shedder::shed_fraction`].
    pub level: f64,
}

/// Leased mode: a gateway gives back the unused tokens of its last lease
/// (if any) and asks for up to `want` more of the window, in one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    pub policy: String,
    /// The encoded key (for `key: []`, the empty string).
    pub key: String,
    /// The policy's `fixed_window`.
    pub limit: WireLimit,
    /// Tokens wanted, 0 to the policy's `leased.tokens` (0: only give back).
    pub want: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub give_back: Option<GiveBack>,
    /// As in [`CheckRequest::now_us`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_us: Option<u64>,
}

/// Tokens a gateway took out of its shared data unspent, for the window
/// they were granted in: the shim takes them back only into that window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GiveBack {
    /// The window index of their grant ([`LeaseResponse::window`]).
    pub window: u64,
    pub tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseResponse {
    /// Tokens granted, 0 to `want`: fewer when the window has fewer left.
    pub granted: u32,
    /// The index of the window they belong to (its start over its length).
    pub window: u64,
    /// Milliseconds, rounded down, from the shim's grant to the window's end:
    /// no token may be spent after it.
    pub expires_in_ms: u64,
    /// What the window has left after this grant.
    pub remaining: u64,
}

impl LeaseRequest {
    /// The bounds a shim holds a caller to: a `fixed_window` limit that
    /// validates; `want` at most [`crate::leased::MAX_TOKENS`] and the
    /// limit; a give-back of at most the limit.
    pub fn validate(&self) -> Result<(), String> {
        let WireLimit::FixedWindow { limit, .. } = self.limit else {
            return Err("limit: only a fixed_window is leased".into());
        };
        self.limit.validate().map_err(|e| format!("limit: {e}"))?;
        if self.want > crate::leased::MAX_TOKENS || self.want > limit {
            return Err(format!(
                "want: {} is more than {} (at most the limit and {})",
                self.want,
                limit.min(crate::leased::MAX_TOKENS),
                crate::leased::MAX_TOKENS
            ));
        }
        if let Some(back) = self.give_back.filter(|b| b.tokens > limit) {
            return Err(format!("give_back.tokens: {} is more than the limit {limit}", back.tokens));
        }
        Ok(())
    }
}
