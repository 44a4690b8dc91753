//! The compact JSON the filter and the shim exchange. Internal to Sluice: both
//! ends are built from this module.
//!
//! `POST /v1/check` carries a [`CheckRequest`] and answers a [`CheckResponse`].

use serde::{Deserialize, Serialize};

use crate::limit::Cost;
use crate::{Applied, Limit, Request};

pub const CHECK_PATH: &str = "/v1/check";

/// Every policy that applies to one request. The shim decides them all at
/// once: the request is admitted, and charged, only if every limit allows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    pub checks: Vec<Check>,
    /// An explicit time in microseconds since the epoch, honoured only by a
    /// shim started with `--test-time`; otherwise the shim refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_us: Option<u64>,
}

/// One policy's limits on one key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    pub policy: String,
    /// The encoded key, see [`crate::key`].
    pub key: String,
    pub limits: Vec<WireLimit>,
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

impl WireLimit {
    /// `limit` as it applies to `req`: a `points` cost read from its header.
    pub fn of(limit: &Limit, req: &impl Request) -> WireLimit {
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
            Limit::Concurrency { limit, lease } => {
                WireLimit::Concurrency { limit: limit.get(), lease_ms: lease.as_millis() }
            }
            Limit::Points { capacity, refill, ref cost, .. } => WireLimit::Points {
                capacity: capacity.get(),
                refill_ms: refill.as_millis(),
                cost: request_cost(cost, req),
            },
        }
    }
}

/// A request's cost: a header value that is not a plain integer counts as the default.
fn request_cost(cost: &Cost, req: &impl Request) -> u32 {
    match cost {
        Cost::Fixed(n) => *n,
        Cost::Header { header, default } => req
            .header(header.as_str())
            .and_then(|v| std::str::from_utf8(&v).ok().and_then(|v| v.trim().parse().ok()))
            .unwrap_or(*default),
    }
}

impl Applied<'_> {
    pub fn check(&self, req: &impl Request) -> Check {
        Check {
            policy: self.policy.name.as_str().to_string(),
            key: self.key.clone(),
            limits: self.policy.limits.iter().map(|l| WireLimit::of(l, req)).collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckResponse {
    pub allowed: bool,
    /// When denied: the earliest time, in ms from now, at which the same
    /// request would pass. 0 when allowed.
    pub retry_after_ms: u64,
    /// One entry per check of the request, in order.
    pub checks: Vec<CheckOutcome>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckOutcome {
    /// One entry per limit of the check, in order.
    pub limits: Vec<LimitOutcome>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitOutcome {
    pub allowed: bool,
    /// Requests this limit would still admit after this one.
    pub remaining: u64,
    /// Milliseconds until this limit next frees capacity.
    pub reset_ms: u64,
    /// Milliseconds until this limit would admit the request; 0 if it did.
    pub retry_after_ms: u64,
}

impl CheckResponse {
    /// The index of the first check that denied the request, if any.
    pub fn denied_check(&self) -> Option<usize> {
        self.checks.iter().position(|c| c.limits.iter().any(|l| !l.allowed))
    }
}
