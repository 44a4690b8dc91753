//! Leased mode: a policy's `leased`, and the bounds of the lease calls'
//! wire fields (`wire::LeaseRequest`), which the filter and the shim both
//! enforce, so they live here, once.
//!
//! ```json
//! "leased": {"tokens": 200, "ttl": "2s"}
//! ```
//!
//! The shim grants each gateway (each Envoy, all its workers together) a
//! lease of up to `tokens` taken from the policy's one limit in Redis, all
//! at once; the workers spend it locally (Envoy shared data, compare and
//! swap) with no call per request. Tokens are charged before they are
//! spent, so the limit is never exceeded across every gateway.
//!
//! - `tokens`: the size of one lease, 1 to [`MAX_TOKENS`], at most the
//!   window's `limit` (a bucket's burst). A gateway asks for the next lease,
//!   off the request path, once it holds [`Leased::low_water`] (half a
//!   lease) or fewer.
//! - `ttl`: how long a lease's unused tokens stay with a gateway after its
//!   last grant before they go back, 1 ms to [`MAX_TTL_MS`];
//!   [`DEFAULT_TTL_MS`] if not given. Tokens never outlive their window
//!   (a bucket's: their lease period, `ttl` long).
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
//! **Which limits** ([`Source`]). A `fixed_window`: its tokens belong to one
//! window, so a token spent anywhere inside its window is within the limit,
//! and unused tokens can go back to the same window exactly. A
//! `token_bucket` or `leaky_bucket` (both GCRA, one token per request): a
//! lease is granted only while the bucket holds all its tokens, and charged
//! as if they were all spent at the end of its period (`ttl` long, aligned
//! to the epoch), after which none is spent; unused ones go back then
//! (`algorithm::gcra::lease_grant`). Spent earlier than charged, they can
//! only lower the bucket's true arrival time below the charged one, and
//! they were all in the bucket at the grant. Charged at the grant instead,
//! a token spent later would bunch with the requests the shim admits once
//! the bucket has refilled. A sliding window's tokens could be spent in an
//! interval its count never saw; `points` costs a request more than one
//! token, known only from it (or its response); an `interval` holds one
//! request, so a lease would hold that one and cost `ttl` of spacing.

use serde::de::{self, Deserialize, Deserializer};

use crate::invalid::Invalid;
use crate::limit::{WindowStart, WireLimit};
use crate::units::per_unit;
use crate::{Duration, Limit};

/// The largest lease: 100,000 tokens.
pub const MAX_TOKENS: u32 = 100_000;
/// The longest `ttl`: an hour.
pub const MAX_TTL_MS: u64 = 3_600_000;
/// The `ttl` of a lease that gives none: 2 s.
pub const DEFAULT_TTL_MS: u64 = 2_000;

/// A policy's `leased`: spend its limit's tokens locally, a lease at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leased {
    tokens: u32,
    ttl_ms: u64,
    /// Whether the document gave `ttl` (a bucket's default depends on it).
    ttl_given: bool,
    source: Source,
}

/// What a lease's tokens are taken from, which sets how they die and go back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// A `fixed_window`: tokens die with their window; unused ones go back
    /// into it `ttl` after the last grant.
    #[default]
    Window,
    /// A `token_bucket` or `leaky_bucket`: tokens die at the end of their
    /// lease period (`ttl` long, aligned to the epoch), as of when they are
    /// charged, and unused ones go back then.
    Bucket,
}

impl Leased {
    /// A lease within the bounds, or why not.
    pub fn new(tokens: u32, ttl_ms: u64) -> Result<Leased, Invalid> {
        if tokens == 0 || tokens > MAX_TOKENS {
            return Err(Invalid::new(format!("tokens {tokens} out of range (1 to {MAX_TOKENS})")));
        }
        if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
            let shown = Duration::from_millis(ttl_ms).map_or(format!("{ttl_ms}ms"), |d| d.to_string());
            return Err(Invalid::new(format!("ttl {shown} out of range (1ms to 1h)")));
        }
        Ok(Leased { tokens, ttl_ms, ttl_given: true, source: Source::Window })
    }

    pub fn tokens(self) -> u32 {
        self.tokens
    }

    pub fn ttl_ms(self) -> u64 {
        self.ttl_ms
    }

    /// What the tokens are taken from ([`Leased::fits`] sets it).
    pub fn source(self) -> Source {
        self.source
    }

    /// This lease taken from `source` as it is, without [`Leased::fits`]'s
    /// checks or its bucket's default `ttl`: for models exploring leases a
    /// document may not give.
    pub fn taken_from(self, source: Source) -> Leased {
        Leased { source, ..self }
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

    /// This lease on a policy with these `limits`, taken from its one
    /// `fixed_window` (of at least `tokens`) or its one `token_bucket` or
    /// `leaky_bucket` (of a burst of at least `tokens`); or why it cannot be.
    ///
    /// A bucket's lease is charged as if spent at the end of its period,
    /// `ttl` long, so a period must be shorter than the bucket takes to
    /// refill beyond a lease (its burst less `tokens`), or one lease would
    /// hold all the bucket's other tokens back until then; without a `ttl`,
    /// a tenth of that (at most [`DEFAULT_TTL_MS`], at least 1 ms), which
    /// under-admits 1 to 2% in the model (docs/leased-mode.md).
    pub fn fits(self, limits: &[Limit]) -> Result<Leased, Invalid> {
        let (most, what, source) = match limits {
            [Limit::FixedWindow { start: WindowStart::FirstHit, .. }] => {
                return Err(Invalid::new(
                    "`leased` needs a fixed_window aligned to the epoch, not `start: first_hit`: a lease names its window by its index since the epoch"
                        .to_string(),
                ))
            }
            [Limit::FixedWindow { limit, .. }] => (limit.get(), "the window's limit", Source::Window),
            [Limit::TokenBucket { burst, .. }] => (burst.get(), "the bucket's burst", Source::Bucket),
            [Limit::LeakyBucket { capacity, .. }] => (capacity.get(), "the bucket's capacity", Source::Bucket),
            [Limit::CalendarWindow { .. }] => {
                return Err(Invalid::new(
                    "`leased` needs a fixed_window with a duration `window`, not a calendar: a lease names its window by its index since the epoch"
                        .to_string(),
                ))
            }
            [other] => {
                return Err(Invalid::new(format!(
                    "`leased` needs a fixed_window, token_bucket or leaky_bucket limit, not a {}: only their tokens are spent one per request and charged before they are spent",
                    other.type_name()
                )))
            }
            _ => return Err(Invalid::new("`leased` needs exactly one limit: a fixed_window, token_bucket or leaky_bucket")),
        };
        if self.tokens > most {
            let why = match source {
                Source::Window => "a lease is part of one window",
                Source::Bucket => "a lease is granted only while the bucket holds all its tokens",
            };
            return Err(Invalid::new(format!(
                "`leased.tokens` {} is more than {what} {most}: {why}",
                self.tokens
            )));
        }
        let (Source::Bucket, [limit]) = (source, limits) else { return Ok(self) };
        // One token every `interval_us`, as the algorithm takes it.
        let interval_us = match WireLimit::with_cost(limit, 1) {
            WireLimit::TokenBucket { rate, per_ms, .. } => per_unit(per_ms, rate),
            WireLimit::LeakyBucket { capacity, drain_ms, .. } => per_unit(drain_ms, capacity),
            _ => return Ok(self),
        };
        // The time the bucket takes to refill beyond a lease.
        let room_us = u64::from(most - self.tokens).saturating_mul(interval_us.get());
        let ttl_ms = if self.ttl_given { self.ttl_ms } else { (room_us / 10_000).clamp(1, DEFAULT_TTL_MS) };
        let room = Duration::from_millis(room_us / 1000).map_or(format!("{room_us}µs"), |d| d.to_string());
        if ttl_ms.saturating_mul(1000) >= room_us && !self.ttl_given {
            return Err(Invalid::new(format!(
                "`leased.tokens` {} leaves the bucket too little to refill beyond a lease ({room}, its burst less the lease) for a lease period of 1ms: lease fewer tokens",
                self.tokens
            )));
        }
        if ttl_ms.saturating_mul(1000) >= room_us {
            let ttl = Duration::from_millis(ttl_ms).map_or(format!("{ttl_ms}ms"), |d| d.to_string());
            return Err(Invalid::new(format!(
                "`leased.ttl` {ttl} is not under {room}, the time the bucket takes to refill beyond a lease (its burst less `leased.tokens`): a lease is charged as if spent at the end of its period, `ttl` long, and holds the bucket's other tokens back until then (a tenth of it under-admits 1 to 2%; leave `ttl` out for that)"
            )));
        }
        Ok(Leased { ttl_ms, source, ..self })
    }
}

/// Leased mode: the shim grants this gateway a lease of the window's tokens,
/// spent locally by every worker with no call per request.
#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLeased {
    /// Tokens per lease, 1 to 100000, at most the window's limit (a bucket's burst or capacity).
    tokens: u32,
    /// How long unused tokens stay after the last grant before they go back (a bucket's: the length of its lease periods, under the time it takes to refill beyond a lease), 1ms to 1h; default "2s" (a bucket's: a tenth of that time, at most "2s").
    #[serde(default)]
    ttl: Option<Duration>,
}

impl<'de> Deserialize<'de> for Leased {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawLeased::deserialize(d)?;
        let ttl = raw.ttl.map_or(DEFAULT_TTL_MS, Duration::as_millis);
        let lease = Leased::new(raw.tokens, ttl).map_err(de::Error::custom)?;
        Ok(Leased { ttl_given: raw.ttl.is_some(), ..lease })
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

    /// A window's lease and a bucket's, each within its limit.
    #[test]
    fn the_source_is_the_limit() {
        let count = |n| crate::Count::new(n).expect("valid");
        let second = Duration::from_millis(1_000).expect("valid");
        let lease = Leased::new(100, 2_000).expect("valid");
        let window = Limit::FixedWindow { limit: count(100), window: second, start: WindowStart::Epoch };
        let bucket = Limit::TokenBucket { rate: count(10), per: second, burst: count(1_000) };
        let leaky = Limit::LeakyBucket { capacity: count(99), drain: second };
        assert_eq!(lease.fits(std::slice::from_ref(&window)).map(Leased::source), Ok(Source::Window));
        assert_eq!(lease.fits(std::slice::from_ref(&bucket)).map(Leased::source), Ok(Source::Bucket));
        assert_eq!(
            lease.fits(std::slice::from_ref(&leaky)).map_err(|e| e.to_string()),
            Err("`leased.tokens` 100 is more than the bucket's capacity 99: a lease is granted only while the bucket holds all its tokens".into())
        );
        assert_eq!(lease.source(), Source::Window, "before it fits, a window's");
        // A bucket of 10 a second and a burst of 100 refills beyond a lease
        // of 20 in 8 s: its default period is a tenth of that, a given one
        // must be under it.
        let bucket = Limit::TokenBucket { rate: count(10), per: second, burst: count(100) };
        let raw =
            |ttl: &str| serde_json::from_str::<Leased>(&format!(r#"{{"tokens": 20{ttl}}}"#)).expect("valid");
        assert_eq!(raw("").fits(std::slice::from_ref(&bucket)).map(Leased::ttl_ms), Ok(800));
        assert_eq!(
            raw(r#", "ttl": "7s""#).fits(std::slice::from_ref(&bucket)).map(Leased::ttl_ms),
            Ok(7_000)
        );
        assert_eq!(
            raw(r#", "ttl": "8s""#).fits(std::slice::from_ref(&bucket)).map(Leased::ttl_ms).map_err(|e| e.to_string()),
            Err("`leased.ttl` 8s is not under 8s, the time the bucket takes to refill beyond a lease (its burst less `leased.tokens`): a lease is charged as if spent at the end of its period, `ttl` long, and holds the bucket's other tokens back until then (a tenth of it under-admits 1 to 2%; leave `ttl` out for that)".into())
        );
        assert_eq!(
            raw("").fits(std::slice::from_ref(&window)).map(Leased::ttl_ms),
            Ok(DEFAULT_TTL_MS),
            "a window's default"
        );
        let full = Leased::new(100, 1).expect("valid");
        assert!(full.fits(std::slice::from_ref(&bucket)).is_err(), "a lease of the whole burst: no room");
        let slow = Limit::TokenBucket {
            rate: count(1),
            per: Duration::from_millis(3_600_000).expect("valid"),
            burst: count(100),
        };
        assert_eq!(
            raw("").fits(std::slice::from_ref(&slow)).map(Leased::ttl_ms),
            Ok(DEFAULT_TTL_MS),
            "at most the default"
        );
    }
}
