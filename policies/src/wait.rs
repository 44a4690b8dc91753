//! Egress waiting: a policy's `wait`, and the bounds of the wire fields it
//! becomes (`CheckRequest::wait_ms`, `Check::margin_ms`), which the filter
//! and the shim both enforce, so they live here, once.
//!
//! ```json
//! "wait": {"timeout": "15s", "margin": "4ms"}
//! ```
//!
//! - `timeout`: the longest the gateway holds a request for this policy
//!   before it gives up and answers 429; 1 ms to [`MAX_TIMEOUT_MS`].
//! - `margin`: added to each time-based slot the shim reserves, so that the
//!   partner, which counts arrivals on its own clock after a network hop
//!   whose delay varies, never sees two calls closer than the limit allows;
//!   `0ms` to [`MAX_MARGIN_MS`], [`DEFAULT_MARGIN_MS`] if not given.
//!
//! **Why at most 5 minutes.** Envoy's `stream_idle_timeout` defaults to
//! 5 minutes, and a held request is an idle stream; a longer hold needs every
//! timeout on the path raised, and a caller that would wait longer is better
//! served by a 429 with an exact `retry-after` and a scheduled retry (the S1
//! callers give up after 15 s). It also bounds how far ahead the shim
//! reserves slots.
//!
//! **Why a 4 ms margin by default.** The margin is paid on every slot: with
//! `{"type": "interval", "every": "100ms"}`, calls leave every 100 ms plus the
//! margin, so the mean gap at the partner is the interval plus the margin
//! (4 % at 100 ms, 0.4 % at 1 s): throughput given away for safety. It has to
//! cover the *variation* of the delay from a request's slot to its arrival
//! at the partner (the constant part shifts every call alike): the shim's
//! wake-up, which it bounds (a request that wakes later than half its margin
//! is given a new slot instead of being sent), and the way from its answer
//! through Envoy to the partner, which the other half covers. Measured on
//! one shared 2-core host (`cargo xtask bench --jitter`, docs/egress-waiting.md),
//! the slot-to-arrival jitter's p99 was about 2 to 4 ms: 1 ms let 14 % of
//! gaps at 20 ms fall under the interval, 4 ms nearly none on the host as it
//! was. A busy host, a gateway on another host than its shim, or a partner
//! across the internet should set a margin from its own measurement.

use serde::de::{self, Deserialize, Deserializer};

use crate::invalid::Invalid;
use crate::{Duration, Limit};

/// The longest `wait.timeout`: 5 minutes, Envoy's default `stream_idle_timeout`.
pub const MAX_TIMEOUT_MS: u64 = 5 * 60 * 1000;
/// The largest `wait.margin`: 10 s.
pub const MAX_MARGIN_MS: u64 = 10_000;
/// The margin of a `wait` that gives none.
pub const DEFAULT_MARGIN_MS: u64 = 4;

/// A policy's `wait`: hold its requests up to `timeout` instead of refusing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    timeout_ms: u64,
    margin_ms: u64,
}

impl Wait {
    /// A wait within the bounds, or why not.
    pub fn new(timeout_ms: u64, margin_ms: u64) -> Result<Wait, Invalid> {
        check_wire(Some(timeout_ms), Some(margin_ms))?;
        if timeout_ms == 0 {
            return Err(Invalid::new("a wait timeout of 0 never waits: leave `wait` out instead"));
        }
        Ok(Wait { timeout_ms, margin_ms })
    }

    pub fn timeout_ms(self) -> u64 {
        self.timeout_ms
    }

    pub fn margin_ms(self) -> u64 {
        self.margin_ms
    }
}

/// The bounds of the wire fields, for a shim that must not trust its
/// caller: `wait_ms` at most [`MAX_TIMEOUT_MS`], `margin_ms` at most
/// [`MAX_MARGIN_MS`].
pub fn check_wire(wait_ms: Option<u64>, margin_ms: Option<u64>) -> Result<(), Invalid> {
    if let Some(ms) = wait_ms.filter(|ms| *ms > MAX_TIMEOUT_MS) {
        return Err(Invalid::new(format!(
            "wait timeout {} is longer than 5m, the longest hold",
            Duration::show(ms)
        )));
    }
    if let Some(ms) = margin_ms.filter(|ms| *ms > MAX_MARGIN_MS) {
        return Err(Invalid::new(format!("wait margin {} is larger than 10s", Duration::show(ms))));
    }
    Ok(())
}

/// Whether the shim can hold a request with all these limits (of every
/// enforced policy that applies to it): it queues a request for one
/// `concurrency` limit (alone, or with time-based limits: a mixed wait),
/// not for several.
pub fn can_wait<'l>(limits: impl IntoIterator<Item = &'l Limit>) -> bool {
    limits.into_iter().filter(|limit| limit.lease().is_some()).count() <= 1
}

/// Egress waiting: hold a request until its slot opens, up to `timeout`, instead of refusing it.
#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWait {
    /// The longest a request is held for a slot, 1ms to 5m; past it, 429.
    timeout: Duration,
    /// Added to each time-based slot, "0ms" to "10s"; default "4ms".
    #[serde(default)]
    margin: Option<Margin>,
}

/// A duration that may be zero: `0ms` (or `0s`), else a [`Duration`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Margin(u64);

impl<'de> Deserialize<'de> for Margin {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let zero = matches!(text.as_str(), "0ms" | "0s");
        let ms = if zero { Some(0) } else { Duration::parse(&text).map(Duration::as_millis) };
        ms.map(Margin).ok_or_else(|| {
            de::Error::custom(format!("invalid margin {text:?} (expected e.g. \"0ms\", \"1ms\", \"20ms\")"))
        })
    }
}

impl<'de> Deserialize<'de> for Wait {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawWait::deserialize(d)?;
        let margin = raw.margin.map_or(DEFAULT_MARGIN_MS, |m| m.0);
        Wait::new(raw.timeout.as_millis(), margin).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_hold_on_the_wire_and_in_the_document() {
        assert!(check_wire(Some(MAX_TIMEOUT_MS), Some(MAX_MARGIN_MS)).is_ok());
        assert!(check_wire(None, None).is_ok());
        assert_eq!(
            check_wire(Some(MAX_TIMEOUT_MS + 1), None).map_err(|e| e.to_string()),
            Err("wait timeout 300001ms is longer than 5m, the longest hold".into())
        );
        assert_eq!(
            check_wire(None, Some(60_000)).map_err(|e| e.to_string()),
            Err("wait margin 1m is larger than 10s".into())
        );
        assert!(Wait::new(0, 1).is_err());
        assert_eq!(Wait::new(15_000, 0).map(|w| (w.timeout_ms(), w.margin_ms())), Ok((15_000, 0)));
    }
}
