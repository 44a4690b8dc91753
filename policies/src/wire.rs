//! The messages the filter and the shim exchange. Internal to Sluice: both
//! ends are built from this module.
//!
//! Each message is one type here, and each of its encodings derives from that
//! type: compact JSON (serde), and for the check and its answer, the binary
//! form the filter sends ([`Encoding::Binary`], borsh). The call's
//! `content-type` names its encoding and the shim answers in the same one;
//! JSON stays for debugging and `curl`. [`PROTOCOL_VERSION`] covers both.
//!
//! - `POST /v1/check`: a [`CheckRequest`], answered by a [`CheckResponse`].
//! - `POST /v1/checks`: a [`CheckBatch`], many checks' bodies in one call,
//!   answered by a [`BatchAnswer`]: each check's own status and body, in order.
//! - `POST /v1/release`: a [`ReleaseRequest`] at the end of an admitted
//!   request that holds a lease, answered by a [`ReleaseResponse`].
//! - `POST /v1/adjust`: an [`AdjustRequest`] once a response tells the true
//!   cost of a `points` request, answered by an [`AdjustResponse`].
//! - `POST /v1/lease`: a [`LeaseRequest`] from a gateway's root context for
//!   a leased policy (see [`crate::leased`]), answered by a [`LeaseResponse`].
//! - `POST /v1/report`: a [`ReportRequest`] from a gateway's root context:
//!   the requests `failure_mode: allow` let through, which the shim never
//!   saw, for its dashboard; answered by 200 and `{}`.
//!
//! A message's parts defined beneath it are re-exported here, so `wire::`
//! names them all: [`WireLimit`] (a view of [`crate::Limit`]), the
//! [`LimitOutcome`] of each limit in a check's reply (the algorithms' own),
//! and a refusal's [`Slowdown`] (the policy's `adapt`).

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use crate::algorithm::LimitOutcome;
pub use crate::feedback::Slowdown;
use crate::invalid::Invalid;
pub use crate::limit::{WireLimit, MAX_REFILL_US};
use crate::units::{is_false, Micros, Millis};
use crate::Duration;

/// The version of this wire, sent by the filter on every call as
/// [`PROTOCOL_HEADER`]. A shim refuses a call of another version (400, with
/// both versions named) rather than misread it; the filter then logs the
/// shim's message and `failure_mode` decides. Raise it with any change a
/// shim or filter of the previous release would misread.
pub const PROTOCOL_VERSION: &str = "4";
/// The header that carries [`PROTOCOL_VERSION`].
pub const PROTOCOL_HEADER: &str = "x-sluice-protocol";

/// How a call's body is written, named by its `content-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `application/json`: every call, and the one any other content type
    /// (or none) means.
    Json,
    /// [`BINARY_CONTENT_TYPE`]: the check and its answer, as the filter sends
    /// them. Borsh (<https://borsh.io>): the fields in their declared order,
    /// integers little-endian at their full width, a string or a list as its
    /// length (4 bytes) and its items, an option or an enum as a byte and
    /// its value. A field added to a type here is added to both encodings.
    Binary,
}

/// The `content-type` of [`Encoding::Binary`].
pub const BINARY_CONTENT_TYPE: &str = "application/x-sluice-binary";
/// The `content-type` of [`Encoding::Json`].
pub const JSON_CONTENT_TYPE: &str = "application/json";

impl Encoding {
    /// The encoding a `content-type` names: binary for exactly
    /// [`BINARY_CONTENT_TYPE`], JSON for any other.
    pub fn of_content_type(value: Option<&[u8]>) -> Encoding {
        match value {
            Some(v) if v == BINARY_CONTENT_TYPE.as_bytes() => Encoding::Binary,
            _ => Encoding::Json,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Json => JSON_CONTENT_TYPE,
            Encoding::Binary => BINARY_CONTENT_TYPE,
        }
    }

    pub fn encode<T: Serialize + borsh::BorshSerialize>(self, value: &T) -> Result<Vec<u8>, WireError> {
        Ok(match self {
            Encoding::Json => serde_json::to_vec(value)?,
            Encoding::Binary => borsh::to_vec(value)?,
        })
    }

    /// `bytes` read whole: trailing bytes are an error too.
    pub fn decode<T: DeserializeOwned + borsh::BorshDeserialize>(self, bytes: &[u8]) -> Result<T, WireError> {
        Ok(match self {
            Encoding::Json => serde_json::from_slice(bytes)?,
            Encoding::Binary => borsh::from_slice(bytes)?,
        })
    }
}

/// Why a message could not be written or read in its encoding: the
/// encoder's own words.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// borsh reports through `std::io::Error`.
    #[error(transparent)]
    Binary(#[from] std::io::Error),
}

pub const CHECK_PATH: &str = "/v1/check";
pub const BATCH_PATH: &str = "/v1/checks";
pub const RELEASE_PATH: &str = "/v1/release";
pub const RENEW_PATH: &str = "/v1/renew";
pub const ADJUST_PATH: &str = "/v1/adjust";
pub const FEEDBACK_PATH: &str = "/v1/feedback";
pub const SHED_PATH: &str = "/v1/shed";
pub const LEASE_PATH: &str = "/v1/lease";
pub const REPORT_PATH: &str = "/v1/report";

/// The most entries one [`ReportRequest`] carries; a worker with more
/// policies to report sends the rest in its next report.
pub const MAX_REPORT_ENTRIES: usize = 256;
/// The largest `/v1/report` body the shim reads: [`MAX_REPORT_ENTRIES`]
/// entries of the longest name and count fit in it.
pub const MAX_REPORT_BODY: usize = 32 * 1024;

/// Every policy that applies to one request. The shim decides them all at
/// once: the request is admitted, and charged, only if every limit allows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, borsh::BorshSerialize, borsh::BorshDeserialize)]
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
    pub now_us: Option<Micros>,
    /// Egress waiting: the longest the shim may hold the request before it
    /// admits it, in milliseconds. Absent (or 0), the request is decided now.
    /// With it, the shim reserves the earliest time at which every limit
    /// admits the request (or queues it for a concurrency slot), holds its
    /// answer until then, and refuses at once, reserving nothing, a request
    /// whose slot lies further away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<Millis>,
    /// The parts of the reply the caller reads: absent, all of them.
    #[serde(default, skip_serializing_if = "Views::is_all")]
    pub views: Views,
}

/// Which views of a check's reply the caller reads, so the shim can skip
/// the work of the others (docs/performance.md, "Levers measured").
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    borsh::BorshSerialize,
    borsh::BorshDeserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Views {
    /// Every field of every [`LimitOutcome`].
    #[default]
    All,
    /// An admitted request's `reset_ms` is not read (no `RateLimit` header
    /// shows it: the document's `headers` is not `always`), so a request
    /// decided at once gets 0 there and the script skips what it costs (a
    /// sliding window's oldest entry). A denied request's reply is whole.
    NoResetWhenAdmitted,
}

/// [`Views::NoResetWhenAdmitted`] as the wire and the check script
/// (`lua/scripts/check.lua`) name it.
pub const NO_RESET_WHEN_ADMITTED: &str = "no_reset_when_admitted";

/// [`crate::algorithm::Refusals::Counted`] as the check script names it:
/// the RLS face's `charge: every_hit`, never sent over this wire.
pub const COUNT_REFUSED: &str = "count_refused";

impl Views {
    pub fn is_all(&self) -> bool {
        *self == Views::All
    }

    /// Whether an admitted request's reply carries its reset.
    pub fn reset_when_admitted(self) -> bool {
        self == Views::All
    }
}

/// One policy's limits on one key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, borsh::BorshSerialize, borsh::BorshDeserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    pub policy: String,
    /// The encoded key, see [`crate::key`].
    pub key: String,
    pub limits: Vec<WireLimit>,
    /// Egress waiting: milliseconds added to each time-based slot of this
    /// check's limits when the request is reserved (see the README's `wait.margin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin_ms: Option<Millis>,
    /// Upstream feedback: this check's policy reads the partner's "slow
    /// down", so the shim checks the pause recorded for its key with its
    /// limits, in the same script call.
    #[serde(default, skip_serializing_if = "is_false")]
    pub upstream: bool,
    /// Quotas in a hierarchy: the levels below the policy's top one, in
    /// order, each with its own key and the limits from its `from` on (to
    /// the next level's). Every level's state lives under the check's hash
    /// tag, so the whole check stays one atomic script call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub levels: Vec<CheckLevel>,
}

/// One level of a hierarchy in a [`Check`].
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, borsh::BorshSerialize, borsh::BorshDeserialize,
)]
#[serde(deny_unknown_fields)]
pub struct CheckLevel {
    #[serde(flatten)]
    pub level: LevelKey,
    /// The index in the check's `limits` of this level's first limit.
    pub from: usize,
}

/// A level's name and its key: the encoded parts of its key sources beyond
/// the top level's (whose key is the check's), joined by `:`.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, borsh::BorshSerialize, borsh::BorshDeserialize,
)]
#[serde(deny_unknown_fields)]
pub struct LevelKey {
    pub name: String,
    pub key: String,
}

impl LevelKey {
    /// Where this level's state lives under the check's hash tag `tag`.
    pub fn under(&self, tag: &str) -> String {
        format!("{tag}:@{}:{}", self.name, self.key)
    }
}

/// `sluice:{<policy>:<key>}`: the start of every state key of a policy's
/// check on `key`; the hash tag puts them all in one Redis Cluster slot.
pub fn hash_tag(policy: &str, key: &str) -> String {
    format!("sluice:{{{policy}:{key}}}")
}

impl Check {
    /// The level limit `limit` belongs to; `None` for the top level's.
    pub fn level_of(&self, limit: usize) -> Option<&LevelKey> {
        self.levels.iter().rev().find(|l| l.from <= limit).map(|l| &l.level)
    }

    /// Where limit `limit`'s state lives, but for its algorithm's suffix:
    /// the hash tag, then for a level's limit `:@<level>:<level key>`.
    pub fn state_prefix(&self, limit: usize) -> String {
        let tag = hash_tag(&self.policy, &self.key);
        self.level_of(limit).map_or_else(|| tag.clone(), |level| level.under(&tag))
    }

    /// The keys whose state the check charges, as the dashboard lists them:
    /// its key, then each level's `<key>:@<level>:<level key>` (the level's
    /// state prefix without the hash tag; see [`split_shown`]).
    pub fn shown_keys(&self) -> impl Iterator<Item = String> + '_ {
        std::iter::once(self.key.clone()).chain(self.levels.iter().map(|l| l.level.under(&self.key)))
    }
}

/// A key of [`Check::shown_keys`] read back: the check's key, and the
/// level's name and key for a level's. (`@` is in no encoded key.)
pub fn split_shown(shown: &str) -> (&str, Option<LevelKey>) {
    let Some((key, level)) = shown.split_once(":@") else { return (shown, None) };
    match level.split_once(':') {
        Some((name, level_key)) => {
            (key, Some(LevelKey { name: name.to_string(), key: level_key.to_string() }))
        }
        None => (shown, None),
    }
}

#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, borsh::BorshSerialize, borsh::BorshDeserialize,
)]
#[serde(deny_unknown_fields)]
pub struct CheckResponse {
    pub allowed: bool,
    /// When denied: the earliest time, in ms from now, at which the same
    /// request would pass; `None` when no one can know (a concurrency limit
    /// waits for a release). 0 when allowed.
    pub retry_after_ms: Option<Millis>,
    /// One entry per check of the request, in order.
    pub checks: Vec<CheckOutcome>,
    /// When admitted with concurrency limits: the lease to release at the
    /// stream's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// Egress waiting: how long the shim held the request before admitting
    /// it, in milliseconds; absent when it was decided at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<Millis>,
}

#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, borsh::BorshSerialize, borsh::BorshDeserialize,
)]
#[serde(deny_unknown_fields)]
pub struct CheckOutcome {
    /// One entry per limit of the check, in order.
    pub limits: Vec<LimitOutcome>,
    /// Upstream feedback: the key is paused by the partner for this many
    /// more milliseconds; decided at once the check is refused, waiting its
    /// slot is the pause's end. Absent when not paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_ms: Option<Millis>,
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

/// Shared callouts: the checks of many requests in one call. Each entry is
/// a [`CheckRequest`]'s body in the batch's own encoding, exactly as
/// `POST /v1/check` reads it, and is decided on its own (atomic, with its
/// id and lease), as if it came alone. A check that waits (`wait_ms`) is
/// refused here (400): it goes alone.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, borsh::BorshSerialize, borsh::BorshDeserialize,
)]
#[serde(deny_unknown_fields)]
pub struct CheckBatch {
    pub checks: Vec<Vec<u8>>,
}

/// The answer to a [`CheckBatch`]: one entry per check, in order.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, borsh::BorshSerialize, borsh::BorshDeserialize,
)]
#[serde(deny_unknown_fields)]
pub struct BatchAnswer {
    pub answers: Vec<Answered>,
}

/// One check's answer in a [`BatchAnswer`]: the status and body that
/// `POST /v1/check` would have answered it with.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, borsh::BorshSerialize, borsh::BorshDeserialize,
)]
#[serde(deny_unknown_fields)]
pub struct Answered {
    pub status: u16,
    pub body: Vec<u8>,
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
    pub now_us: Option<Micros>,
}

/// What a settlement moved: per adjustment, in order, the units charged
/// (positive) or given back (negative). A settlement sent again moves
/// nothing, and a refund gives back at most what its charge still held.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdjustResponse {
    #[serde(default)]
    pub moved: Vec<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Adjustment {
    pub policy: String,
    pub key: String,
    /// The settlement's id: the admitted check's id. Each key applies a
    /// settlement of an id once, however often it is sent
    /// (`lua/lib/settle.lua`); without one, every time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The `points` limit as it was charged: its `cost` is the estimate.
    pub limit: WireLimit,
    pub actual: u32,
    /// The admitted check's `held_until_us` for this limit. A refund
    /// (`actual` below the estimate) without it returns nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_until_us: Option<Micros>,
    /// The admitted check's `refunded_us` for this limit.
    #[serde(default, skip_serializing_if = "Micros::is_zero")]
    pub refunded_us: Micros,
    /// The hierarchy level the limit belongs to (`Check::level_of`); none
    /// for the top level's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<LevelKey>,
}

/// Upstream feedback: the partner asked these keys to slow down. The shim
/// records each pause fleet-wide, extend-only (`lua/scripts/upstream.lua`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackRequest {
    pub pauses: Vec<Pause>,
    /// As in [`CheckRequest::now_us`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_us: Option<Micros>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pause {
    pub policy: String,
    pub key: String,
    /// How long from now the partner asked us to stop, already clamped to
    /// the policy's `max_pause` by the filter.
    pub pause_ms: Millis,
    /// The partner refused the call and the policy adapts its rate: the
    /// first refusal after the key ran freely lowers it (`lua/scripts/upstream.lua`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow: Option<Slowdown>,
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
/// policy (`lua/scripts/shed.lua`), so every gateway sheds the same fraction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShedRequest {
    pub policy: String,
    /// The document's classes, 1 to [`crate::class::MAX_CLASSES`].
    pub classes: usize,
    pub high: f64,
    pub low: f64,
    pub delay_ms: Millis,
    pub ramp_ms: Millis,
    pub recovery_ms: Millis,
    /// The utilization this gateway saw since its last report, 0 to 1;
    /// absent, the level is only read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<f64>,
    /// As in [`CheckRequest::now_us`], in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_ms: Option<Millis>,
}

impl ShedRequest {
    /// The controller's settings, checked as the parser checks a policy's.
    pub fn settings(&self) -> Result<crate::shed::ShedSettings, Invalid> {
        let duration = |ms: Millis, name: &str| {
            Duration::from_millis(ms.get())
                .ok_or_else(|| Invalid::new(format!("{name} {}ms out of range (1ms to 365d)", ms.get())))
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
            return Err(Invalid::new(format!(
                "classes {} out of range (1 to {})",
                self.classes,
                crate::class::MAX_CLASSES
            )));
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
    /// The policy's `fixed_window`, `token_bucket` or `leaky_bucket`.
    pub limit: WireLimit,
    /// Tokens wanted, 0 to the policy's `leased.tokens` (0: only give back).
    pub want: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub give_back: Option<GiveBack>,
    /// A bucket's lease period, the policy's `leased.ttl`: a lease belongs
    /// to the period (aligned to the epoch) it is granted in and is charged
    /// as if spent at its end ([`crate::algorithm::gcra::lease_grant`]).
    /// Needed for a bucket, absent for a window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<Millis>,
    /// As in [`CheckRequest::now_us`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_us: Option<Micros>,
    /// The call's id, so a lost answer costs nothing: the same call sent
    /// again gets the answer it had, charged once. Without it, a lease whose
    /// answer is lost stays charged until its window ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<LeaseCall>,
}

/// A lease call's id: the gateway's (random, one per gateway and policy)
/// and the call's sequence number there, which goes up by one for each new
/// call and stays the same when a call whose answer was lost is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseCall {
    pub gateway: u64,
    pub seq: u64,
}

/// Tokens a gateway took out of its shared data unspent, for the window
/// they were granted in: the shim takes them back only into that window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GiveBack {
    /// The window index of their grant ([`LeaseResponse::window`]).
    pub window: u64,
    pub tokens: u32,
    /// A bucket's: the tokens of that period's leases this gateway still
    /// holds charged, spent or not (at least `tokens`; absent: `tokens`).
    /// The more it was charged, the later the bucket's charges reach, and
    /// the more of a late give-back the bucket can take back exactly
    /// ([`crate::algorithm::gcra::lease_give_back`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charged: Option<u32>,
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
    pub expires_in_ms: Millis,
    /// What the window has left after this grant.
    pub remaining: u64,
}

impl From<crate::algorithm::Grant> for LeaseResponse {
    /// The answer to a grant, as the shim sends it: the time to the end
    /// rounded down to milliseconds, so a gateway stops spending no later.
    fn from(grant: crate::algorithm::Grant) -> LeaseResponse {
        LeaseResponse {
            granted: u32::try_from(grant.granted).unwrap_or(u32::MAX),
            window: grant.window,
            expires_in_ms: Millis(grant.expires_in_us / 1000),
            remaining: grant.remaining,
        }
    }
}

impl LeaseRequest {
    /// The most tokens one call gives back to a limit of `limit`.
    pub fn most_given_back(limit: u32) -> u32 {
        limit.max(crate::leased::MAX_TOKENS)
    }

    /// The bounds a shim holds a caller to: a `fixed_window`, `token_bucket`
    /// or `leaky_bucket` limit that validates; `want` at most
    /// [`crate::leased::MAX_TOKENS`] and the limit (a bucket's burst); a
    /// give-back of at most [`LeaseRequest::most_given_back`]; and for a
    /// bucket, its lease period within `leased.ttl`'s bounds.
    pub fn validate(&self) -> Result<(), Invalid> {
        let limit = match self.limit {
            WireLimit::FixedWindow { limit, .. } => limit,
            WireLimit::TokenBucket { burst, .. } => burst,
            WireLimit::LeakyBucket { capacity, .. } => capacity,
            _ => {
                return Err(Invalid::at(
                    "limit",
                    "only a fixed_window, token_bucket or leaky_bucket is leased",
                ))
            }
        };
        self.limit.validate().map_err(|e| e.within("limit"))?;
        if self.want > crate::leased::MAX_TOKENS || self.want > limit {
            return Err(Invalid::at(
                "want",
                format!(
                    "{} is more than {} (at most the limit and {})",
                    self.want,
                    limit.min(crate::leased::MAX_TOKENS),
                    crate::leased::MAX_TOKENS
                ),
            ));
        }
        // Tokens granted under an earlier, higher limit (before a reload)
        // may go back under a lowered one: a give-back is bounded by the
        // largest lease, not by the limit.
        let most_back = Self::most_given_back(limit);
        if let Some(back) = self.give_back.filter(|b| b.tokens > most_back) {
            return Err(Invalid::at(
                "give_back.tokens",
                format!(
                    "{} is more than {most_back} (the limit or {}, the larger)",
                    back.tokens,
                    crate::leased::MAX_TOKENS
                ),
            ));
        }
        let bucket = !matches!(self.limit, WireLimit::FixedWindow { .. });
        match self.ttl_ms {
            None if bucket => {
                Err(Invalid::at("ttl_ms", "a bucket's lease needs its period, the policy's `leased.ttl`"))
            }
            Some(_) if !bucket => Err(Invalid::at("ttl_ms", "only a bucket's lease has a period")),
            Some(ttl) if ttl.get() == 0 || ttl.get() > crate::leased::MAX_TTL_MS => Err(Invalid::at(
                "ttl_ms",
                format!("{} out of range (1 to {})", ttl.get(), crate::leased::MAX_TTL_MS),
            )),
            _ => Ok(()),
        }
    }
}

/// What a gateway's worker decided without the shim since its last report,
/// per policy: the shim never saw these requests, so this is how its
/// dashboard learns of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportRequest {
    /// Failure-mode passes: let through with `failure_mode: allow` (the
    /// shim did not answer in time).
    pub passes: Vec<Passes>,
    /// Denials answered from the worker's over-limit cache, with no call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache_denied: Vec<Passes>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Passes {
    pub policy: String,
    pub count: u64,
}

impl ReportRequest {
    /// The bounds a shim holds a report to: at most [`MAX_REPORT_ENTRIES`]
    /// entries in both lists together, each naming a valid policy.
    pub fn validate(&self) -> Result<(), Invalid> {
        let entries = self.passes.len() + self.cache_denied.len();
        if entries > MAX_REPORT_ENTRIES {
            let field = if self.cache_denied.is_empty() { "passes" } else { "passes and cache_denied" };
            return Err(Invalid::at(
                field,
                format!("{entries} entries, more than the {MAX_REPORT_ENTRIES} a report may carry"),
            ));
        }
        for (field, entries) in [("passes", &self.passes), ("cache_denied", &self.cache_denied)] {
            for (i, passes) in entries.iter().enumerate() {
                if crate::PolicyName::new(&passes.policy).is_none() {
                    return Err(Invalid::at(
                        format!("{field}[{i}].policy"),
                        format!(
                            "invalid policy name {:?} (expected 1 to 64 of A-Z a-z 0-9 _ -)",
                            passes.policy
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_are_named_once() {
        let name = serde_json::to_string(&Views::NoResetWhenAdmitted).expect("serializes");
        assert_eq!(name, format!("\"{NO_RESET_WHEN_ADMITTED}\""));
        let lua = include_str!("../../lua/scripts/check.lua");
        assert!(lua.contains(&format!("'{NO_RESET_WHEN_ADMITTED}'")), "check.lua names the view");
        assert!(lua.contains(&format!("'{COUNT_REFUSED}'")), "check.lua names counted refusals");
        let json = r#"{"checks":[]}"#;
        let req: CheckRequest<'_> = serde_json::from_str(json).expect("parses");
        assert_eq!(req.views, Views::All, "absent, every view");
    }

    /// The check and its answer read back as they were written, in both
    /// encodings, with every limit kind and every optional field absent
    /// and present; the binary form is the shorter.
    #[test]
    fn checks_and_answers_read_back_in_both_encodings() {
        let ms = Millis(1_000);
        let limits = vec![
            WireLimit::FixedWindow { limit: 1, window_ms: ms, cost: 1 },
            WireLimit::SlidingWindow { limit: 2, window_ms: ms, approximate: true },
            WireLimit::SlidingWindow { limit: 2, window_ms: ms, approximate: false },
            WireLimit::TokenBucket { rate: 3, per_ms: ms, burst: 4 },
            WireLimit::LeakyBucket { capacity: 5, drain_ms: ms },
            WireLimit::Interval { every_ms: ms },
            WireLimit::Concurrency { limit: 6, lease_ms: ms },
            WireLimit::Points { capacity: 7, refill_ms: ms, cost: u32::MAX },
        ];
        let bare = Check {
            policy: "p".into(),
            key: String::new(),
            limits: limits.clone(),
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        };
        let full = Check {
            policy: "q".into(),
            key: "k\u{e9}\"".into(),
            limits,
            margin_ms: Some(Millis(4)),
            upstream: true,
            levels: Vec::new(),
        };
        let checks = [bare, full];
        let requests = [
            CheckRequest {
                checks: Cow::Borrowed(&checks[..]),
                id: None,
                now_us: None,
                wait_ms: None,
                views: Views::All,
            },
            CheckRequest {
                checks: Cow::Borrowed(&checks[..]),
                id: Some("id-1".into()),
                now_us: Some(Micros(u64::MAX)),
                wait_ms: Some(Millis(0)),
                views: Views::NoResetWhenAdmitted,
            },
        ];
        let outcome = |allowed| LimitOutcome {
            allowed,
            remaining: u64::MAX,
            reset_ms: ms,
            retry_after_ms: (!allowed).then_some(ms),
            reclaimed: 3,
            held_until_us: allowed.then_some(Micros(9)),
            refunded_us: Micros(8),
        };
        let answers = [
            CheckResponse {
                allowed: false,
                retry_after_ms: None,
                checks: vec![],
                lease: None,
                waited_ms: None,
            },
            CheckResponse {
                allowed: true,
                retry_after_ms: Some(Millis(0)),
                checks: vec![
                    CheckOutcome { limits: vec![outcome(true), outcome(false)], paused_ms: Some(ms) },
                    CheckOutcome { limits: vec![], paused_ms: None },
                ],
                lease: Some("lease".into()),
                waited_ms: Some(Millis(12)),
            },
        ];
        for encoding in [Encoding::Json, Encoding::Binary] {
            for request in &requests {
                let bytes = encoding.encode(request).expect("encodes");
                assert_eq!(
                    &encoding.decode::<CheckRequest>(&bytes).expect("decodes"),
                    request,
                    "{encoding:?}"
                );
            }
            for answer in &answers {
                let bytes = encoding.encode(answer).expect("encodes");
                assert_eq!(
                    &encoding.decode::<CheckResponse>(&bytes).expect("decodes"),
                    answer,
                    "{encoding:?}"
                );
            }
        }
        for request in &requests {
            let (json, binary) = (Encoding::Json.encode(request), Encoding::Binary.encode(request));
            assert!(binary.expect("binary").len() < json.expect("json").len());
        }
    }

    /// The content type names the encoding; anything else is JSON.
    #[test]
    fn the_content_type_names_the_encoding() {
        for encoding in [Encoding::Json, Encoding::Binary] {
            assert_eq!(Encoding::of_content_type(Some(encoding.content_type().as_bytes())), encoding);
        }
        assert_eq!(Encoding::of_content_type(None), Encoding::Json);
        assert_eq!(Encoding::of_content_type(Some(b"text/plain")), Encoding::Json);
    }

    /// The largest report a worker sends fits in the body the shim reads,
    /// and the shim refuses one beyond the bounds, naming the entry.
    #[test]
    fn reports_are_bounded() {
        let entry = |policy: String| Passes { policy, count: u64::MAX };
        let largest = ReportRequest {
            passes: vec![entry("p".repeat(64)); MAX_REPORT_ENTRIES],
            cache_denied: Vec::new(),
        };
        assert_eq!(largest.validate(), Ok(()));
        assert!(serde_json::to_vec(&largest).map(|b| b.len()).unwrap_or(usize::MAX) <= MAX_REPORT_BODY);
        let more = ReportRequest {
            passes: vec![entry("p".into()); MAX_REPORT_ENTRIES + 1],
            cache_denied: Vec::new(),
        };
        assert_eq!(
            more.validate().map_err(|e| e.to_string()),
            Err("passes: 257 entries, more than the 256 a report may carry".into())
        );
        let bad = ReportRequest {
            passes: vec![entry("ok".into()), entry("not ok".into())],
            cache_denied: Vec::new(),
        };
        assert_eq!(
            bad.validate().map_err(|e| e.to_string()),
            Err(r#"passes[1].policy: invalid policy name "not ok" (expected 1 to 64 of A-Z a-z 0-9 _ -)"#
                .into())
        );
    }

    /// The shim refuses a lease call beyond what a policy could send.
    #[test]
    fn lease_calls_are_bounded() {
        let req = |limit, want, back| LeaseRequest {
            policy: "p".into(),
            key: String::new(),
            limit,
            want,
            give_back: back,
            ttl_ms: None,
            now_us: None,
            call: None,
        };
        let back = |tokens| Some(GiveBack { window: 7, tokens, charged: None });
        let window = WireLimit::FixedWindow { limit: 100, window_ms: Millis(1_000), cost: 1 };
        assert_eq!(req(window, 100, back(100)).validate(), Ok(()));
        assert_eq!(
            req(window, 101, None).validate().map_err(|e| e.to_string()),
            Err("want: 101 is more than 100 (at most the limit and 100000)".into())
        );
        // Tokens of a higher limit before a reload go back under a lower one.
        assert_eq!(req(window, 1, back(101)).validate(), Ok(()));
        assert_eq!(
            req(window, 1, back(100_001)).validate().map_err(|e| e.to_string()),
            Err("give_back.tokens: 100001 is more than 100000 (the limit or 100000, the larger)".into())
        );
        let zero = WireLimit::FixedWindow { limit: 100, window_ms: Millis(0), cost: 1 };
        assert!(req(zero, 1, None).validate().is_err());
        assert_eq!(
            LeaseRequest { ttl_ms: Some(Millis(1_000)), ..req(window, 1, None) }
                .validate()
                .map_err(|e| e.to_string()),
            Err("ttl_ms: only a bucket's lease has a period".into())
        );
        // A bucket: at most its burst, with its lease period.
        let bucket = WireLimit::TokenBucket { rate: 1, per_ms: Millis(1_000), burst: 10 };
        let period = |r: LeaseRequest, ms| LeaseRequest { ttl_ms: Some(Millis(ms)), ..r };
        assert_eq!(period(req(bucket, 10, back(10)), 2_000).validate(), Ok(()));
        assert_eq!(
            period(req(bucket, 11, None), 2_000).validate().map_err(|e| e.to_string()),
            Err("want: 11 is more than 10 (at most the limit and 100000)".into())
        );
        assert_eq!(
            req(bucket, 1, None).validate().map_err(|e| e.to_string()),
            Err("ttl_ms: a bucket's lease needs its period, the policy's `leased.ttl`".into())
        );
        assert_eq!(
            period(req(bucket, 1, None), 3_600_001).validate().map_err(|e| e.to_string()),
            Err("ttl_ms: 3600001 out of range (1 to 3600000)".into())
        );
        let leaky = WireLimit::LeakyBucket { capacity: 5, drain_ms: Millis(1_000) };
        assert_eq!(period(req(leaky, 5, None), 1).validate(), Ok(()));
        let sliding = WireLimit::SlidingWindow { limit: 100, window_ms: Millis(1_000), approximate: false };
        assert_eq!(
            req(sliding, 1, None).validate().map_err(|e| e.to_string()),
            Err("limit: only a fixed_window, token_bucket or leaky_bucket is leased".into())
        );
    }
}
