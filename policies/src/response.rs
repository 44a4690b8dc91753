//! What the gateway answers, and when: the RateLimit headers setting, the
//! status and body of a denial, the failure mode and its status, and the
//! bounded settings of the outage breaker and the over-limit cache.
//!
//! Each type checks its range while it parses, so an error names its path.

use std::collections::BTreeMap;

use serde::de::{self, Deserialize, Deserializer};

use crate::HeaderName;

/// When the `RateLimit` and `RateLimit-Policy` headers are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum HeadersMode {
    /// Never.
    Off,
    /// On denials only.
    #[default]
    OnDeny,
    /// On denials and on every admitted request's response.
    Always,
}

/// Which rate-limit headers the RLS face adds to its answer, when
/// `headers` says it sends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum HeaderFormat {
    /// The IETF `RateLimit` and `RateLimit-Policy` of the most restrictive
    /// limit (draft -11).
    #[default]
    Ietf,
    /// Draft 03's `X-RateLimit-Limit`, `-Remaining` and `-Reset` over every
    /// limit the call met, as Limitador's `--rate-limit-headers
    /// DRAFT_VERSION_03` writes them.
    #[serde(rename = "draft_version_03")]
    DraftVersion03,
}

/// What happens when the shim cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Let the request through (fail open).
    #[default]
    Allow,
    /// Answer `failure_status` (fail closed).
    Deny,
}

/// An HTTP status for a refusal, 400 to 599.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenyStatus(u16);

impl DenyStatus {
    pub const TOO_MANY_REQUESTS: DenyStatus = DenyStatus(429);
    pub const UNAVAILABLE: DenyStatus = DenyStatus(503);

    pub fn get(self) -> u16 {
        self.0
    }
}

impl Default for DenyStatus {
    fn default() -> Self {
        DenyStatus::UNAVAILABLE
    }
}

impl<'de> Deserialize<'de> for DenyStatus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        in_range(n, 400, 599, "status").map(|n| DenyStatus(n as u16))
    }
}

/// The response to a request a policy denies: 429 and the small JSON body
/// unless the policy says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DenyResponse {
    /// The status, 400 to 599; 429 if not given.
    #[serde(default)]
    pub status: Option<DenyStatus>,
    /// The body, sent as is; the JSON `{"error":"rate_limited",...}` if not given.
    #[serde(default)]
    pub body: Option<String>,
    /// Extra response headers; `content-type` here replaces the default one.
    #[serde(default)]
    pub headers: ExtraHeaders,
}

/// Response headers set by a policy: valid names, not pseudo-headers, and
/// values without control characters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExtraHeaders(pub Vec<(HeaderName, String)>);

impl<'de> Deserialize<'de> for ExtraHeaders {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = BTreeMap::<HeaderName, String>::deserialize(d)?;
        for (name, value) in &raw {
            if name.as_str().starts_with(':') {
                return Err(de::Error::custom(format!(
                    "\"{name}\" is a pseudo-header; a policy cannot set it"
                )));
            }
            if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
                return Err(de::Error::custom(format!(
                    "the value of \"{name}\" has a control character (CR, LF or another)"
                )));
            }
        }
        Ok(ExtraHeaders(raw.into_iter().collect()))
    }
}

/// Consecutive shim failures that open the outage breaker, 0 (never) to 1000.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureThreshold(u32);

impl FailureThreshold {
    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for FailureThreshold {
    fn default() -> Self {
        FailureThreshold(5)
    }
}

impl<'de> Deserialize<'de> for FailureThreshold {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        in_range(n, 0, 1000, "failure_threshold").map(|n| FailureThreshold(n as u32))
    }
}

/// Shared callouts: the most check calls a worker keeps in flight at once;
/// a check that comes while they are out waits, and the waiting checks go
/// together in one call when one returns. 0 sends every check alone. 0 to 64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SharedCalls(u32);

impl SharedCalls {
    pub fn get(self) -> u32 {
        self.0
    }
}

impl<'de> Deserialize<'de> for SharedCalls {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        in_range(n, 0, 64, "shared_calls").map(|n| SharedCalls(n as u32))
    }
}

/// How long an open breaker decides locally before probing the shim again, 1 ms to 10 min.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CooldownMs(u32);

impl CooldownMs {
    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for CooldownMs {
    fn default() -> Self {
        CooldownMs(2000)
    }
}

impl<'de> Deserialize<'de> for CooldownMs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        in_range(n, 1, 600_000, "cooldown_ms").map(|n| CooldownMs(n as u32))
    }
}

/// Slots of the over-limit cache, 0 (off) to 65536.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSlots(u32);

impl CacheSlots {
    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for CacheSlots {
    fn default() -> Self {
        CacheSlots(1024)
    }
}

impl<'de> Deserialize<'de> for CacheSlots {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        in_range(n, 0, 65_536, "over_limit_cache_slots").map(|n| CacheSlots(n as u32))
    }
}

fn in_range<E: de::Error>(n: u64, lo: u64, hi: u64, what: &str) -> Result<u64, E> {
    if (lo..=hi).contains(&n) {
        Ok(n)
    } else {
        Err(E::custom(format!("invalid {what} {n} (expected {lo} to {hi})")))
    }
}
