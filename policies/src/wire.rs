//! The compact JSON the filter and the shim exchange. Internal to Sluice: both
//! ends are built from this module.
//!
//! `POST /v1/check` carries a [`CheckRequest`] and answers a [`CheckResponse`].

use serde::{Deserialize, Serialize};

use crate::{Document, Limit, Request};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum WireLimit {
    SlidingWindow { limit: u32, window_ms: u64 },
}

impl From<&Limit> for WireLimit {
    fn from(limit: &Limit) -> Self {
        match *limit {
            Limit::SlidingWindow { limit, window } => {
                WireLimit::SlidingWindow { limit: limit.get(), window_ms: window.as_millis() }
            }
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

impl Document {
    /// The checks for every policy that matches `req`; empty when none does.
    pub fn checks(&self, req: &impl Request) -> Vec<Check> {
        self.policies
            .iter()
            .filter(|p| p.matches(req))
            .map(|p| Check {
                policy: p.name.as_str().to_string(),
                key: p.key(req),
                limits: p.limits.iter().map(WireLimit::from).collect(),
            })
            .collect()
    }
}
