//! Leased mode: a policy's `leased`, and the bounds of the lease calls'
//! wire fields (`wire::LeaseRequest`), which the filter and the shim both
//! enforce, so they live here, once.
//!
//! ```json
//! "leased": {"tokens": 200, "ttl": "2s"}
//! ```
//!
//! The shim grants each gateway (each Envoy, all its workers together) a
//! lease of up to `tokens` taken from the policy's `fixed_window` in Redis,
//! all at once; the workers spend it locally (Envoy shared data, compare and
//! swap) with no call per request. Tokens are taken before they are spent,
//! so the window never admits more than its limit across every gateway.
//!
//! - `tokens`: the size of one lease, 1 to [`MAX_TOKENS`], at most the
//!   window's `limit`. A gateway asks for the next lease, off the request
//!   path, once it holds [`Leased::low_water`] (half a lease) or fewer.
//! - `ttl`: how long a lease's unused tokens stay with a gateway after its
//!   last grant before they go back to the window, 1 ms to [`MAX_TTL_MS`];
//!   [`DEFAULT_TTL_MS`] if not given. Tokens never outlive their window.
//!
//! **What a lease costs: under-admission, bounded.** Tokens held by one
//! gateway cannot admit another gateway's requests. A gateway holds at most
//! [`Leased::held_at_most`] tokens (a lease on top of half a lease), so a
//! window offered more than `limit` requests admits at least
//! `limit - gateways × 1.5 × tokens` of them, and never more than `limit`.
//! A lease whose answer was lost (a timeout) is sent again with the same id
//! and the shim answers it with the grant it recorded, charged once
//! (`wire::LeaseCall`), so its tokens reach the gateway after all.
//!
//! **Why only `fixed_window`.** Its tokens belong to one window, so a token
//! spent anywhere inside its window is within the limit, and unused tokens
//! can go back to the same window exactly (the count goes down by what was
//! never spent). A token bucket's tokens could be spent up to `ttl` after
//! they were taken, bunching them beyond `burst` in a short interval; a
//! sliding window's could be spent in an interval its count never saw.

use serde::de::{self, Deserialize, Deserializer};

use crate::{Duration, Limit};

/// The largest lease: 100,000 tokens.
pub const MAX_TOKENS: u32 = 100_000;
/// The longest `ttl`: an hour.
pub const MAX_TTL_MS: u64 = 3_600_000;
/// The `ttl` of a lease that gives none: 2 s.
pub const DEFAULT_TTL_MS: u64 = 2_000;

/// A policy's `leased`: spend the window's tokens locally, a lease at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leased {
    tokens: u32,
    ttl_ms: u64,
}

impl Leased {
    /// A lease within the bounds, or why not.
    pub fn new(tokens: u32, ttl_ms: u64) -> Result<Leased, String> {
        if tokens == 0 || tokens > MAX_TOKENS {
            return Err(format!("tokens {tokens} out of range (1 to {MAX_TOKENS})"));
        }
        if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
            let shown = Duration::from_millis(ttl_ms).map_or(format!("{ttl_ms}ms"), |d| d.to_string());
            return Err(format!("ttl {shown} out of range (1ms to 1h)"));
        }
        Ok(Leased { tokens, ttl_ms })
    }

    pub fn tokens(self) -> u32 {
        self.tokens
    }

    pub fn ttl_ms(self) -> u64 {
        self.ttl_ms
    }

    /// A gateway asks for its next lease once it holds this many or fewer:
    /// half a lease, so the next one comes while the last half is spent.
    pub fn low_water(self) -> u64 {
        u64::from(self.tokens / 2)
    }

    /// The most tokens one gateway holds unspent: a lease granted on top of
    /// the low water. The under-admission bound is this times the gateways.
    pub fn held_at_most(self) -> u64 {
        u64::from(self.tokens) + self.low_water()
    }

    /// Whether a policy with these `limits` can be leased: exactly one
    /// `fixed_window`, of at least `tokens`; or why not.
    pub fn fits(self, limits: &[Limit]) -> Result<(), String> {
        match limits {
            [Limit::FixedWindow { limit, .. }] if limit.get() >= self.tokens => Ok(()),
            [Limit::FixedWindow { limit, .. }] => Err(format!(
                "`leased.tokens` {} is more than the window's limit {}: a lease is part of one window",
                self.tokens,
                limit.get()
            )),
            [Limit::CalendarWindow { .. }] => Err(
                "`leased` needs a fixed_window with a duration `window`, not a calendar: a lease names its window by its index since the epoch"
                    .to_string(),
            ),
            [_] => Err(
                "`leased` needs a fixed_window limit: only a window's tokens can be spent anywhere in it and given back exactly"
                    .to_string(),
            ),
            _ => Err("`leased` needs exactly one limit, a fixed_window".to_string()),
        }
    }
}

/// Leased mode: the shim grants this gateway a lease of the window's tokens,
/// spent locally by every worker with no call per request.
#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLeased {
    /// Tokens per lease, 1 to 100000, at most the window's limit.
    tokens: u32,
    /// How long unused tokens stay after the last grant before they go back, 1ms to 1h; default "2s".
    #[serde(default)]
    ttl: Option<Duration>,
}

impl<'de> Deserialize<'de> for Leased {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawLeased::deserialize(d)?;
        let ttl = raw.ttl.map_or(DEFAULT_TTL_MS, Duration::as_millis);
        Leased::new(raw.tokens, ttl).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_the_held_tokens() {
        assert!(Leased::new(0, 1).is_err());
        assert!(Leased::new(MAX_TOKENS + 1, 1).is_err());
        assert!(Leased::new(1, MAX_TTL_MS + 1).is_err());
        let lease = Leased::new(200, 2_000).expect("valid");
        assert_eq!((lease.low_water(), lease.held_at_most()), (100, 300));
        assert_eq!(Leased::new(1, 1).map(|l| (l.low_water(), l.held_at_most())), Ok((0, 1)));
    }
}
