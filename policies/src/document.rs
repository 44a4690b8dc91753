//! The policy document.
//!
//! ```json
//! {
//!   "shim": {"cluster": "sluice_shim", "timeout_ms": 50},
//!   "failure_mode": "allow",
//!   "policies": [{
//!     "name": "partner-api",
//!     "match": {"path_prefix": "/v42/", "methods": ["GET", "POST"]},
//!     "key": ["header:x-api-key"],
//!     "limits": [
//!       {"type": "sliding_window", "limit": 25, "window": "5s"},
//!       {"type": "sliding_window", "limit": 300, "window": "1m"}
//!     ]
//!   }]
//! }
//! ```
//!
//! Every policy whose `match` holds, and none of whose `bypass` entries hold,
//! applies to a request; the request passes only if every limit of every one
//! of them allows it.
//!
//! Validation happens inside deserialization, so that each error carries the
//! parser's position. Unknown fields are refused everywhere.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};

use crate::algorithm::Algorithm;
use crate::bounds::{
    worst_case_body, worst_case_checks, MAX_BODY, MAX_CHECKS, MAX_CONDITION_ENTRIES, MAX_KEY_SOURCES,
    MAX_LIMITS, MAX_POLICIES,
};
use crate::class::Classes;
#[cfg(feature = "schema")]
use crate::condition::RawCondition;
use crate::condition::{raw_key, Condition};
use crate::feedback::Upstream;
use crate::invalid::Invalid;
use crate::key::{self, ClientIp, KeySource, OnMissingKey};
use crate::llm::Llm;
use crate::request::{Attribute, Face};
pub use crate::response::FailureMode;
use crate::response::{
    CacheSlots, CooldownMs, DenyResponse, DenyStatus, FailureThreshold, HeaderFormat, HeadersMode,
    SharedCalls,
};
use crate::shed::ShedPolicy;
use crate::units::Millis;
use crate::wait::Wait;
use crate::wire::{Check, CheckLevel, LevelKey, ShedRequest, WireLimit};
use crate::{HeaderName, Limit, PolicyName, Request};

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Document {
    /// The JSON Schema of the document, for editors; ignored.
    #[serde(rename = "$schema", default)]
    pub schema: Option<String>,
    #[serde(default)]
    pub shim: Shim,
    /// What happens when the shim cannot answer in time; a policy may override it.
    #[serde(default)]
    pub failure_mode: FailureMode,
    /// The status of a request refused because the shim failed, 400 to 599; a policy may override it.
    #[serde(default)]
    pub failure_status: DenyStatus,
    /// When the `RateLimit` and `RateLimit-Policy` headers are sent: `off`, `on_deny` or `always`.
    #[serde(default)]
    pub headers: HeadersMode,
    /// RLS face: which headers those are: `ietf` (the default: `RateLimit`
    /// and `RateLimit-Policy`) or `draft_version_03` (`X-RateLimit-Limit`,
    /// `-Remaining` and `-Reset` over every limit the call met, as
    /// Limitador's `--rate-limit-headers DRAFT_VERSION_03`).
    #[serde(default)]
    pub header_format: HeaderFormat,
    /// Adds `x-sluice-shadow: would-deny; policy="NAME"` to a request a shadow policy would have denied.
    #[serde(default)]
    pub shadow_header: bool,
    /// Adds `x-sluice-verdict` to every response of a request a policy applies
    /// to: `allowed`, `denied`, `cache_denied`, `shed`, `failure_allowed`,
    /// `failure_denied` or `missing_key`, so that a request `failure_mode` let
    /// through undecided is never read as admitted.
    #[serde(default)]
    pub verdict_header: bool,
    /// Slots of the over-limit cache shared by the workers, 0 (off) to 65536.
    #[serde(default)]
    pub over_limit_cache_slots: CacheSlots,
    /// For the `ip` key source: 0 takes the proxy's downstream peer address; N
    /// takes the Nth address from the right of `x-forwarded-for`.
    #[serde(default)]
    pub trusted_hops: TrustedHops,
    /// Priority classes, most important first (see `class`); none: one class.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "Vec<crate::class::RawClass>"))]
    pub classes: Classes,
    /// A request header that names the request's class.
    #[serde(default)]
    pub class_header: Option<HeaderName>,
    /// The largest request body read for a policy that needs it (`llm`,
    /// `body:` keys, `body` conditions), 1 to 16777216; a larger one is
    /// refused with 413. 1048576 if not given.
    #[serde(default)]
    pub max_request_body_bytes: BodyLimit,
    /// RLS face: how the descriptors of one call are charged: `all_or_none`
    /// (the call is admitted, and charged, only if every limit of every
    /// descriptor allows it), `each_descriptor` (each descriptor is decided
    /// and charged on its own, in order) or `every_hit` (as
    /// `each_descriptor`, and a refused descriptor's cost is counted too,
    /// past the limit, as envoyproxy/ratelimit counts it; fixed windows only).
    #[serde(default)]
    pub charge: Charge,
    /// RLS face: which value the policies read of an entry key a descriptor
    /// carries twice: `first` (the default) or `last` (Limitador's rule).
    #[serde(default)]
    pub repeated_entry: RepeatedEntry,
    /// RLS face: whether a descriptor's own `limit` (Envoy's override)
    /// counts: `ignore` (the default: the policies hold the limits) or
    /// `honour` (it alone limits the descriptor, as envoyproxy/ratelimit
    /// does; see `descriptor_limit`).
    #[serde(default)]
    pub descriptor_limit: crate::descriptor_limit::DescriptorLimitMode,
    /// RLS face: what the answer says of each descriptor: `each` (the
    /// default: a status per descriptor, its code and most restrictive
    /// limit) or `overall` (the overall code alone, as Limitador answers).
    #[serde(default)]
    pub statuses: Statuses,
    /// RLS face: whether the answer carries `dynamic_metadata` as
    /// envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA` fills it: the
    /// call's `domain`, its `descriptors` (each one's entries as
    /// `key=value`, and its own `hits_addend`), the call's `hitsAddend`
    /// when not 0, and the `metadata` of the policies of the descriptors
    /// that passed. Off by default, as the peer.
    #[serde(default)]
    pub dynamic_metadata: bool,
    pub policies: Policies,
    /// The templates an honoured override is planned with.
    #[serde(skip)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub overrides: crate::descriptor_limit::Overrides,
}

/// What an RLS answer says of each descriptor of the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Statuses {
    /// A status per descriptor: its code, its most restrictive limit, what
    /// that limit has left and until when (Envoy's `x-ratelimit-*` headers
    /// are read from them).
    #[default]
    Each,
    /// None: the overall code alone, as Limitador answers.
    Overall,
}

/// Which value of an entry key an RLS descriptor carries twice counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RepeatedEntry {
    /// The first: the others are kept, in order, for a descriptor tree's walk.
    #[default]
    First,
    /// The last, as Limitador reads a descriptor (a map from key to value):
    /// the earlier ones are dropped.
    Last,
}

/// How an RLS call's descriptors are charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Charge {
    /// One decision for the whole call: admitted and charged only if every
    /// limit of every descriptor allows it.
    #[default]
    AllOrNone,
    /// Each descriptor decided and charged on its own, in the call's order,
    /// whatever the others' answers.
    EachDescriptor,
    /// As `each_descriptor`, and a refused descriptor's cost is counted too:
    /// every window it reaches adds it, past the limit (envoyproxy/ratelimit's
    /// counter). A window refused so stays refused to its end; it never
    /// admits past its limit. Only fixed windows count a cost so.
    EveryHit,
}

impl Charge {
    /// Whether a refused request's cost is counted too ([`Charge::EveryHit`]).
    pub fn counts_refused(self) -> bool {
        self == Charge::EveryHit
    }
}

/// The largest request body read, 1 byte to 16 MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimit(u32);

impl BodyLimit {
    pub const MAX: u32 = 16 * 1024 * 1024;

    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for BodyLimit {
    fn default() -> Self {
        BodyLimit(1024 * 1024)
    }
}

impl<'de> Deserialize<'de> for BodyLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        u32::try_from(n).ok().filter(|n| (1..=BodyLimit::MAX).contains(n)).map(BodyLimit).ok_or_else(|| {
            de::Error::custom(format!(
                "invalid max_request_body_bytes {n} (expected 1 to {})",
                BodyLimit::MAX
            ))
        })
    }
}

/// How the filter reaches the shim.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Shim {
    /// The Envoy cluster of the shim.
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// How long a request waits for the shim's answer before `failure_mode` decides, 1 to 60000.
    #[serde(default = "default_timeout")]
    pub timeout_ms: TimeoutMs,
    /// Consecutive failed checks after which the filter stops asking the shim
    /// for `cooldown_ms` and applies `failure_mode` at once, 0 (never) to 1000.
    #[serde(default)]
    pub failure_threshold: FailureThreshold,
    /// How long the filter decides alone before it probes the shim again, 1 to 600000.
    #[serde(default)]
    pub cooldown_ms: CooldownMs,
    /// Shared callouts: the most check calls a worker keeps in flight
    /// before it queues checks and sends the queue as one call, 0 (every
    /// check alone) to 64.
    #[serde(default)]
    pub shared_calls: SharedCalls,
}

fn default_cluster() -> String {
    "sluice_shim".to_string()
}

fn default_timeout() -> TimeoutMs {
    TimeoutMs(100)
}

impl Default for Shim {
    fn default() -> Self {
        Shim {
            cluster: default_cluster(),
            timeout_ms: default_timeout(),
            failure_threshold: FailureThreshold::default(),
            cooldown_ms: CooldownMs::default(),
            shared_calls: SharedCalls::default(),
        }
    }
}

/// The shim timeout, 1 ms to 60 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeoutMs(u32);

impl TimeoutMs {
    pub fn get(self) -> u32 {
        self.0
    }
}

impl<'de> Deserialize<'de> for TimeoutMs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ms = u64::deserialize(d)?;
        u32::try_from(ms)
            .ok()
            .filter(|ms| (1..=60_000).contains(ms))
            .map(TimeoutMs)
            .ok_or_else(|| de::Error::custom(format!("invalid timeout {ms} (expected 1 to 60000 ms)")))
    }
}

/// How many proxies in front of this one append to `x-forwarded-for`, 0 to 16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrustedHops(u8);

impl TrustedHops {
    /// `n` if it is one of 0 to 16.
    pub fn new(n: u64) -> Option<TrustedHops> {
        u8::try_from(n).ok().filter(|n| *n <= 16).map(TrustedHops)
    }

    pub fn client_ip(self) -> ClientIp {
        ClientIp { trusted_hops: self.0 }
    }
}

impl<'de> Deserialize<'de> for TrustedHops {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        TrustedHops::new(n)
            .ok_or_else(|| de::Error::custom(format!("invalid trusted_hops {n} (expected 0 to 16)")))
    }
}

/// The policies of a document, with unique names.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Policies(pub Vec<Policy>);

impl std::ops::Deref for Policies {
    type Target = [Policy];
    fn deref(&self) -> &[Policy] {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Policies {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct UniqueNames;
        impl<'de> Visitor<'de> for UniqueNames {
            type Value = Policies;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of policies")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Policies, A::Error> {
                let mut policies: Vec<Policy> = Vec::new();
                let mut names = BTreeSet::new();
                while let Some(policy) = seq.next_element::<Policy>()? {
                    if policies.len() == MAX_POLICIES {
                        return Err(de::Error::custom(format!(
                            "more than {MAX_POLICIES} policies: matching scans them for every request; \
                             key one policy by tenant instead of writing a policy per tenant"
                        )));
                    }
                    if !names.insert(policy.name.clone()) {
                        return Err(de::Error::custom(format!(
                            "duplicate policy name \"{}\" at policies[{}]",
                            policy.name,
                            policies.len()
                        )));
                    }
                    policies.push(policy);
                }
                shared_budgets(&policies).map_err(de::Error::custom)?;
                let checks = worst_case_checks(&policies);
                if checks.total > MAX_CHECKS {
                    return Err(de::Error::custom(format!(
                        "{} policies can apply to one request{}, more than the {MAX_CHECKS} the shim checks at once: give them paths that exclude each other, or merge some",
                        checks.total,
                        checks.path_hint()
                    )));
                }
                let body = worst_case_body(&policies);
                if body.total > MAX_BODY {
                    return Err(de::Error::custom(format!(
                        "the policies that can apply to one request{} could need a {}-byte call to the shim, more than the {MAX_BODY} it takes: use fewer policies, limits or key sources",
                        body.path_hint(),
                        body.total
                    )));
                }
                Ok(Policies(policies))
            }
        }
        d.deserialize_seq(UniqueNames)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub name: PolicyName,
    pub matcher: Condition,
    pub bypass: Vec<Condition>,
    pub key: Vec<KeySource>,
    pub on_missing_key: OnMissingKey,
    /// Every limit: the top level's, then each level's in order (a level's
    /// start at its `from`).
    pub limits: Vec<Limit>,
    /// Quotas in a hierarchy: the levels below the top one (`key`), each
    /// keyed within the one above it; see [`Level`].
    pub levels: Vec<Level>,
    pub shadow: bool,
    pub failure_mode: Option<FailureMode>,
    pub failure_status: Option<DenyStatus>,
    pub response: DenyResponse,
    /// Egress waiting: hold this policy's requests for a slot instead of refusing them.
    pub wait: Option<Wait>,
    pub upstream: Option<Upstream>,
    /// Load shedding by class when the service is busy (S4d).
    pub shed: Option<ShedPolicy>,
    /// Leased mode: spend leases of its limit's tokens locally.
    pub leased: Option<crate::leased::Leased>,
    /// LLM token budgets: how the `llm_tokens` cost is reserved and read.
    pub llm: Option<Llm>,
    /// A budget this policy shares with others (one per API shape): its
    /// checks name the budget, not the policy, so every policy of it
    /// charges the same counters ([`Policy::state_name`]).
    pub budget: Option<PolicyName>,
    /// A gRPC-face policy that limits nothing: its requests are answered
    /// OK and counted as `unlimited` (`limits` is then empty).
    pub unlimited: bool,
    /// RLS face: every request refused, with no counter; answered as a
    /// limit of 0 per this window.
    pub blocked: Option<crate::units::Duration>,
    /// RLS face: the name of its limit in an answer's `current_limit`;
    /// `None`: the policy's name.
    pub limit_name: Option<String>,
    /// RLS face: the limit names it replaces in the calls it applies to.
    pub replaces: Vec<String>,
    /// RLS face, a `descriptor_tree` node: what each level shows in the
    /// `descriptor` label of `sluice_descriptor_decisions_total`; `None`:
    /// no such label (see [`crate::descriptor_metric`]).
    pub descriptor_metric: Option<Vec<crate::descriptor_metric::MetricLevel>>,
    /// RLS face: a quota limit; its refusal refuses the call only when
    /// every quota descriptor of the call is refused (see
    /// [`crate::plan::Plan::refuses`]).
    pub quota: bool,
    /// RLS face: what a descriptor this policy decides adds, when it
    /// passes, to the answer's `dynamic_metadata` (with the document's
    /// `dynamic_metadata`).
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    /// 1 to 64 of `A-Z a-z 0-9 _ -`, unique in the document.
    pub(crate) name: PolicyName,
    /// Which requests the policy applies to; every condition given must hold.
    #[serde(rename = "match")]
    pub(crate) matcher: Option<Condition>,
    /// Requests exempt from the policy: any entry that holds exempts.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "Vec<RawCondition>"))]
    pub(crate) bypass: Vec<Condition>,
    /// Where the key comes from; `[]` is one bucket for every request.
    #[serde(default)]
    pub(crate) key: Vec<KeySource>,
    /// A request without one of the key sources: `shared` bucket, `deny` (400) or `skip` the policy.
    #[serde(default)]
    pub(crate) on_missing_key: OnMissingKey,
    /// At least one limit, unless `unlimited` or `blocked`; the request must
    /// pass all of them. `[]` only for a `descriptor_tree` node that limits
    /// nothing.
    #[serde(default)]
    pub(crate) limits: Option<Vec<Limit>>,
    /// Quotas in a hierarchy: levels below this one, each with its own
    /// `key` (beginning with the key of the level above it) and `limits`. A
    /// request is checked against every level and charged to all or none.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "Vec<RawLevel>"))]
    pub(crate) levels: Vec<RawLevel>,
    /// gRPC faces: the policy limits nothing; its requests are answered OK and
    /// counted as unlimited. Give no `limits`.
    #[serde(default)]
    pub(crate) unlimited: bool,
    /// RLS face: refuse every request, with no counter; answered as a limit
    /// of 0 per this window (envoyproxy/ratelimit's `requests_per_unit: 0`).
    /// Give no `limits`.
    #[serde(default)]
    pub(crate) blocked: Option<crate::units::Duration>,
    /// RLS face: the name of its limit in an answer's `current_limit`; the
    /// policy's name if not given, `""` for none.
    #[serde(default)]
    pub(crate) limit_name: Option<String>,
    /// RLS face: limit names (each policy's `limit_name`, else its name)
    /// this policy replaces: when it applies to a descriptor of a call, the
    /// policies so named apply to none of that call's descriptors
    /// (envoyproxy/ratelimit's `replaces`).
    #[serde(default)]
    pub(crate) replaces: Vec<String>,
    /// RLS face, a `descriptor_tree` node: one entry per level of its path,
    /// `"value"` (the descriptor's value) or `"step"` (the path's step as
    /// written): its decisions are also counted per descriptor in
    /// `sluice_descriptor_decisions_total`, labelled as envoyproxy/ratelimit
    /// names its stats (`detailed_metric`, `value_to_metric`).
    #[serde(default)]
    pub(crate) descriptor_metric: Option<Vec<crate::descriptor_metric::MetricLevel>>,
    /// RLS face: a quota limit (envoyproxy/ratelimit's `quota_mode`): a
    /// descriptor it refuses is answered over the limit, but the call is
    /// refused only when every descriptor of it decided by quota policies
    /// is refused (or a descriptor is refused by another policy). Needs the
    /// document's `charge` `each_descriptor` or `every_hit`.
    #[serde(default)]
    pub(crate) quota: bool,
    /// RLS face: a JSON object merged into the answer's
    /// `dynamic_metadata.metadata` when a descriptor this policy decides
    /// passes, with the document's `dynamic_metadata` on
    /// (envoyproxy/ratelimit's `metadata`).
    #[serde(default)]
    pub(crate) metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// Count and report every decision, but never refuse a request.
    #[serde(default)]
    pub(crate) shadow: bool,
    /// Overrides the document's `failure_mode` for requests this policy applies to.
    #[serde(default)]
    pub(crate) failure_mode: Option<FailureMode>,
    /// Overrides the document's `failure_status`.
    #[serde(default)]
    pub(crate) failure_status: Option<DenyStatus>,
    /// The response to a request this policy denies: `status`, `body`, `headers`.
    #[serde(default)]
    pub(crate) response: DenyResponse,
    /// Egress: hold a request until its slot (up to `timeout`) instead of answering 429.
    #[serde(default)]
    pub(crate) wait: Option<Wait>,
    /// Egress: which answers of the partner mean "slow down"; `{}` takes every default.
    #[serde(default)]
    pub(crate) upstream: Option<Upstream>,
    /// Load shedding: drop this policy's less important classes while the
    /// service is busy.
    pub(crate) shed: Option<ShedPolicy>,
    /// Ingress, high rates: spend leases of a fixed_window's, token_bucket's or
    /// leaky_bucket's tokens locally, with no shim call per request
    /// (`{"tokens": 200, "ttl": "2s"}`).
    #[serde(default)]
    pub(crate) leased: Option<crate::leased::Leased>,
    /// LLM token budgets: where a request's true cost in tokens is read
    /// (`{"api": "openai_chat"}`), for its points limits with `"cost": "llm_tokens"`.
    #[serde(default)]
    llm: Option<Llm>,
    /// A budget several policies share, one per API shape (chat, responses,
    /// messages): 1 to 64 of `A-Z a-z 0-9 _ -`, no policy's name. Every
    /// policy that names it has the same `key` and `limits`, and they all
    /// charge one counter per key, named by the budget.
    #[serde(default)]
    budget: Option<PolicyName>,
}

impl RawPolicy {
    pub(crate) fn limits(&self) -> &[Limit] {
        self.limits.as_deref().unwrap_or_default()
    }
}

/// One level of a hierarchy below a policy's top one: its name, its key,
/// and where its limits start in the policy's `limits`.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    pub name: PolicyName,
    /// Its whole key: the sources of the level above it, then its own.
    pub key: Vec<KeySource>,
    /// The index of its first limit in the policy's `limits`.
    pub from: usize,
}

#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLevel {
    /// 1 to 64 of `A-Z a-z 0-9 _ -`, unique among the policy's levels.
    name: PolicyName,
    /// Its key: the key of the level above it, then the sources that tell
    /// its members apart (`["header:x-org", "header:x-team"]`).
    key: Vec<KeySource>,
    /// At least one; the request must pass all of them.
    pub(crate) limits: Vec<Limit>,
}

/// The policy's levels, checked: each named once, with limits, and keyed
/// within the level above it, so that every level's state shares the top
/// level's hash tag and one script call charges them all or none. Their
/// limits follow `limits` in one list, each level's from its `from`.
fn levels(raw: &RawPolicy) -> Result<(Vec<Limit>, Vec<Level>), Invalid> {
    let mut limits = raw.limits().to_vec();
    let mut out: Vec<Level> = Vec::with_capacity(raw.levels.len());
    let mut above: (&str, &[KeySource]) = ("the policy's `key`", &raw.key);
    for (i, level) in raw.levels.iter().enumerate() {
        if out.iter().any(|l| l.name == level.name) {
            return Err(Invalid::at(
                format!("levels[{i}]"),
                format!("duplicate level name \"{}\"", level.name),
            ));
        }
        if level.limits.is_empty() {
            return Err(Invalid::at(format!("levels[{i}]"), "a level needs at least one limit"));
        }
        if level.key.len() > MAX_KEY_SOURCES {
            return Err(Invalid::at(
                format!("levels[{i}]"),
                format!("{} key sources, more than the {MAX_KEY_SOURCES} a level may have", level.key.len()),
            ));
        }
        if !level.key.starts_with(above.1) {
            let show = |key: &[KeySource]| {
                format!("[{}]", key.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", "))
            };
            return Err(Invalid::new(format!(
                "levels[{i}].key {} does not begin with {} {}: a level is keyed within the level above it, so that every level's state shares the top level's Redis Cluster hash tag and one atomic call charges them all; begin it with those sources, or make it a policy of its own",
                show(&level.key),
                above.0,
                show(above.1)
            )));
        }
        out.push(Level { name: level.name.clone(), key: level.key.clone(), from: limits.len() });
        limits.extend(level.limits.iter().cloned());
        above = ("the key of the level above it", &level.key);
    }
    Ok((limits, out))
}

impl<'de> Deserialize<'de> for Policy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawPolicy::deserialize(d)?;
        let (all_limits, levels) = levels(&raw).map_err(de::Error::custom)?;
        let matcher = raw.matcher.clone().unwrap_or_default();
        let tree = matcher.descriptor_tree.is_some();
        if raw.bypass.iter().any(|b| b.descriptor_tree.is_some()) {
            return Err(de::Error::custom(
                "`descriptor_tree` belongs in `match`: a descriptor reaches one node of its domain's tree",
            ));
        }
        let rls_only = [
            (raw.blocked.is_some(), "`blocked`"),
            (raw.limit_name.is_some(), "`limit_name`"),
            (!raw.replaces.is_empty(), "`replaces`"),
            (raw.quota, "`quota`"),
            (raw.metadata.is_some(), "`metadata`"),
        ];
        if let Some((_, field)) = rls_only.iter().find(|(on, _)| *on && matcher.face() != Face::Rls) {
            return Err(de::Error::custom(format!(
                "{field} is for RLS-face policies (a `match` naming `domain` or `entries`)"
            )));
        }
        if let Some(levels) = &raw.descriptor_metric {
            let depth = matcher.descriptor_tree.as_ref().map(Vec::len);
            if depth != Some(levels.len()) {
                return Err(de::Error::custom(
                    "`descriptor_metric` needs a `descriptor_tree` node, with one level (\"value\" or \"step\") per step of its path",
                ));
            }
        }
        if let Some(name) = &raw.limit_name {
            if name.len() > 256 {
                return Err(de::Error::custom("`limit_name` is longer than 256 bytes"));
            }
        }
        let own = raw.limit_name.as_deref().unwrap_or(raw.name.as_str());
        if let Some(r) = raw.replaces.iter().find(|r| r.is_empty() || r.len() > 256 || r.as_str() == own) {
            return Err(de::Error::custom(format!(
                "`replaces` entry {r:?}: give other limits' names (1 to 256 bytes), not the policy's own"
            )));
        }
        if raw.blocked.is_some() && (raw.unlimited || !raw.limits().is_empty()) {
            return Err(de::Error::custom(
                "a `blocked` policy refuses every request: give it no `limits` and no `unlimited`",
            ));
        }
        if raw.unlimited {
            if !raw.limits().is_empty() {
                return Err(de::Error::custom(
                    "an `unlimited` policy has no `limits`: remove one or the other",
                ));
            }
            if !matcher.is_grpc_face() {
                return Err(de::Error::custom(
                    "`unlimited` is for gRPC-face policies (a `match` naming `domain` or `entries`): an HTTP policy that limits nothing is no policy",
                ));
            }
        } else if raw.blocked.is_none() && (raw.limits.is_none() || (raw.limits().is_empty() && !tree)) {
            return Err(de::Error::custom(if tree {
                "a policy needs at least one limit (a `descriptor_tree` node that limits nothing says `\"limits\": []`)"
            } else {
                "a policy needs at least one limit"
            }));
        }
        match matcher.face() {
            Face::Rls => grpc_face_fits(&raw, RLS_FACE).map_err(de::Error::custom)?,
            Face::Rlqs => {
                grpc_face_fits(&raw, crate::face::RLQS).map_err(de::Error::custom)?;
                let parts = crate::face::Parts {
                    matcher: &matcher,
                    bypass: &raw.bypass,
                    key: &raw.key,
                    limits: raw.limits(),
                    leased: raw.leased,
                    shadow: raw.shadow,
                    unlimited: raw.unlimited,
                };
                crate::face::rlqs_fits(&parts).map_err(de::Error::custom)?
            }
            Face::Http => {
                if let Some(source) = raw.key.iter().find(|s| matches!(s, KeySource::Entry(_))) {
                    return Err(de::Error::custom(format!(
                        "key source \"{source}\" reads a gRPC face's entries: only a policy whose `match` names `domain` or `entries` has them"
                    )));
                }
            }
        }
        if matcher.face() != Face::Rlqs {
            if let Some(source) = raw.key.iter().find(|s| matches!(s, KeySource::Bucket(_))) {
                return Err(de::Error::custom(format!(
                    "key source \"{source}\" reads an RLQS bucket id: only a policy whose `match` names `bucket` has one"
                )));
            }
        }
        if matcher.face() != Face::Http {
            let body = raw
                .key
                .iter()
                .chain(raw.levels.iter().flat_map(|l| &l.key))
                .find(|s| matches!(s, KeySource::Body(_)))
                .map(|s| format!("key source \"{s}\""))
                .or_else(|| {
                    let conditions = matcher.reads_body() || raw.bypass.iter().any(Condition::reads_body);
                    conditions.then(|| "a `body` condition".to_string())
                })
                .or_else(|| raw.llm.is_some().then(|| "`llm`".to_string()));
            if let Some(what) = body {
                return Err(de::Error::custom(format!(
                    "{what} reads an HTTP request's body: a gRPC-face policy (its `match` names `domain`, `entries` or `bucket`) never sees one"
                )));
            }
        }
        if all_limits.len() > MAX_LIMITS {
            return Err(de::Error::custom(format!(
                "{} limits, more than the {MAX_LIMITS} a policy may have",
                all_limits.len()
            )));
        }
        if raw.key.len() > MAX_KEY_SOURCES {
            return Err(de::Error::custom(format!(
                "{} key sources, more than the {MAX_KEY_SOURCES} a policy may have",
                raw.key.len()
            )));
        }
        // Two limits whose state would live under one key would charge it
        // twice (each level's state lives under its own name).
        let suffixes: Vec<String> =
            raw.limits().iter().map(|l| Algorithm::of(&WireLimit::with_cost(l, 0)).state_suffix()).collect();
        for (i, suffix) in suffixes.iter().enumerate() {
            if let Some(j) = suffixes[..i].iter().position(|s| s == suffix) {
                return Err(de::Error::custom(format!(
                    "limits[{i}] would share its state with limits[{j}]: give one a different window, period or lease"
                )));
            }
        }
        for (n, level) in raw.levels.iter().enumerate() {
            let suffixes: Vec<String> = level
                .limits
                .iter()
                .map(|l| Algorithm::of(&WireLimit::with_cost(l, 0)).state_suffix())
                .collect();
            for (i, suffix) in suffixes.iter().enumerate() {
                if let Some(j) = suffixes[..i].iter().position(|s| s == suffix) {
                    return Err(de::Error::custom(format!(
                        "levels[{n}].limits[{i}] would share its state with limits[{j}]: give one a different window, period or lease"
                    )));
                }
            }
        }
        if raw.wait.is_some() {
            if raw.shadow {
                return Err(de::Error::custom(
                    "`wait` cannot be used on a shadow policy: a shadow policy never holds or refuses a request",
                ));
            }
            let approximate =
                all_limits.iter().position(|l| matches!(l, Limit::SlidingWindow { approximate: true, .. }));
            if !crate::wait::can_wait(&all_limits) {
                return Err(de::Error::custom(
                    "`wait` on two concurrency limits is not supported: the shim queues a request for one concurrency limit",
                ));
            }
            if let Some(i) = approximate {
                return Err(de::Error::custom(format!(
                    "`wait` cannot be used with an approximate sliding_window (limits[{i}]): its estimate cannot tell when a slot opens; use an exact one"
                )));
            }
            let first_hit = all_limits.iter().position(|l| {
                matches!(l, Limit::FixedWindow { start: crate::limit::WindowStart::FirstHit, .. })
            });
            if let Some(i) = first_hit {
                return Err(de::Error::custom(format!(
                    "`wait` cannot be used with a `start: first_hit` fixed_window (limits[{i}]): its next window starts with the request that comes, not at a time a slot can name"
                )));
            }
            if let Some(i) = all_limits.iter().position(|l| l.calendar().is_some()) {
                return Err(de::Error::custom(format!(
                    "`wait` cannot be used with a calendar window (limits[{i}]): a full calendar window opens again at its end, hours or days away"
                )));
            }
            let reserved = all_limits.iter().position(|l| l.reserve().is_some());
            if let Some(i) = reserved {
                return Err(de::Error::custom(format!(
                    "`wait` cannot be used with a concurrency `reserve` (limits[{i}]): a freed slot goes to the oldest waiter, whatever its class; a reserve protects a service, refusing at once"
                )));
            }
        }
        if let Some(upstream) = &raw.upstream {
            if raw.shadow {
                return Err(de::Error::custom(
                    "`upstream` cannot be used on a shadow policy: a shadow policy never holds or refuses a request",
                ));
            }
            upstream.validate().map_err(|e| de::Error::custom(format!("upstream.{e}")))?;
        }
        if let Some(shed) = &raw.shed {
            if raw.shadow {
                return Err(de::Error::custom(
                    "`shed` cannot be used on a shadow policy: a shadow policy never refuses a request",
                ));
            }
            shed.controller.validate().map_err(|e| de::Error::custom(format!("shed.{e}")))?;
            let pool = all_limits.iter().any(|l| l.lease().is_some());
            if shed.signal == crate::load::Signal::Pool && !pool {
                return Err(de::Error::custom(
                    "shed.signal \"pool\" needs a concurrency limit in the policy",
                ));
            }
        }
        if raw.leased.is_some() && !levels.is_empty() {
            return Err(de::Error::custom(
                "`leased` cannot be used with `levels`: a lease is taken from one window, and a hierarchy charges every level at once",
            ));
        }
        let leased = raw.leased.map(|l| l.fits(raw.limits())).transpose().map_err(de::Error::custom)?;
        if leased.is_some() {
            let other = [
                (raw.shadow, "`shadow`: a shadow policy never refuses, there is nothing to spend locally"),
                (raw.wait.is_some(), "`wait`: a lease admits or refuses at once"),
                (raw.upstream.is_some(), "`upstream`: the partner's pauses are checked in the shim"),
                (raw.shed.is_some(), "`shed`"),
            ];
            if let Some((_, why)) = other.iter().find(|(on, _)| *on) {
                return Err(de::Error::custom(format!("`leased` cannot be used with {why}")));
            }
        }
        if raw.budget.is_some() {
            let other = [
                (
                    !raw.levels.is_empty(),
                    "`levels`: a hierarchy keeps its levels under the policy's own name",
                ),
                (raw.leased.is_some(), "`leased`: a lease pool belongs to one policy"),
                (raw.upstream.is_some(), "`upstream`: the partner's pauses are recorded per policy"),
                (raw.shed.is_some(), "`shed`: a shedder's load is reported per policy"),
            ];
            if let Some((_, why)) = other.iter().find(|(on, _)| *on) {
                return Err(de::Error::custom(format!("`budget` cannot be used with {why}")));
            }
        }
        let in_tokens = all_limits.iter().position(Limit::costs_llm_tokens);
        match (&raw.llm, in_tokens) {
            (None, Some(i)) => {
                return Err(de::Error::custom(format!(
                    "limits[{i}] costs llm_tokens: give the policy an `llm` that says where they are read"
                )))
            }
            (Some(_), None) => {
                return Err(de::Error::custom(
                    "`llm` needs a points limit with \"cost\": \"llm_tokens\" to charge",
                ))
            }
            _ => {}
        }
        if raw.bypass.len() > MAX_CONDITION_ENTRIES {
            return Err(de::Error::custom(format!(
                "`bypass` has {} entries, more than the {MAX_CONDITION_ENTRIES} a policy may hold",
                raw.bypass.len()
            )));
        }
        let uses_keys = matcher.needs_key() || raw.bypass.iter().any(Condition::needs_key);
        if uses_keys && raw.key.len() != 1 {
            return Err(de::Error::custom("a `keys` condition needs a policy with exactly one key source"));
        }
        Ok(Policy {
            name: raw.name,
            matcher,
            bypass: raw.bypass,
            key: raw.key,
            on_missing_key: raw.on_missing_key,
            limits: all_limits,
            levels,
            shadow: raw.shadow,
            failure_mode: raw.failure_mode,
            failure_status: raw.failure_status,
            response: raw.response,
            wait: raw.wait,
            upstream: raw.upstream,
            shed: raw.shed,
            leased,
            llm: raw.llm,
            budget: raw.budget,
            unlimited: raw.unlimited,
            blocked: raw.blocked,
            limit_name: raw.limit_name,
            replaces: raw.replaces,
            descriptor_metric: raw.descriptor_metric,
            quota: raw.quota,
            metadata: raw.metadata,
        })
    }
}

/// The budgets policies share, checked: no budget has a policy's name (its
/// counters would be that policy's), and every policy that names a budget
/// has the `key` and `limits` of the first that does, so the same request
/// is charged the same counters whichever of them it matches.
fn shared_budgets(policies: &[Policy]) -> Result<(), Invalid> {
    for (i, policy) in policies.iter().enumerate() {
        let Some(budget) = &policy.budget else { continue };
        if policies.iter().any(|p| &p.name == budget) {
            return Err(Invalid::at(
                format!("policies[{i}]"),
                format!("budget \"{budget}\" is the name of a policy: give the budget a name of its own"),
            ));
        }
        let Some(first) = policies[..i].iter().position(|p| p.budget.as_ref() == Some(budget)) else {
            continue;
        };
        let differs = if policies[first].key != policy.key {
            "`key` differs"
        } else if policies[first].limits != policy.limits {
            "`limits` differ"
        } else {
            continue;
        };
        return Err(Invalid::at(format!("policies[{i}]"), format!(
            "budget \"{budget}\" is shared with policies[{first}], whose {differs}: policies that share a budget charge the same counters, so they need the same `key` and `limits`"
        )));
    }
    Ok(())
}

/// How the messages about an RLS-face policy name it.
const RLS_FACE: &str = "a gRPC-face policy (its `match` names `domain` or `entries`)";

/// What a gRPC-face policy cannot use: its face answers each request once
/// and hears nothing after (no stream end, no response). `GRPC` names the
/// policy in the messages. An RLS-face policy cannot be `leased` either;
/// an RLQS-face one is, by nature (see [`crate::rlqs`]).
pub(crate) fn grpc_face_fits(raw: &RawPolicy, face: &str) -> Result<(), Invalid> {
    // Every level's limits too, numbered as the policy's flat list.
    let limits: Vec<&Limit> = raw.limits().iter().chain(raw.levels.iter().flat_map(|l| &l.limits)).collect();
    if let Some(i) = limits.iter().position(|l| l.lease().is_some()) {
        return Err(Invalid::new(format!(
            "{face} cannot have a concurrency limit (limits[{i}]): its face answers once and never hears the request end, so a slot would never be released"
        )));
    }
    if let Some(i) = limits.iter().position(|l| l.actual_cost_header().is_some()) {
        return Err(Invalid::new(format!(
            "{face} cannot read an `actual_cost_header` (limits[{i}]): its face never sees the response"
        )));
    }
    let other = [
        (raw.wait.is_some(), "`wait`: its face answers at once and cannot hold a request"),
        (raw.upstream.is_some(), "`upstream`: its face never sees the partner's answer"),
        (raw.shed.is_some(), "`shed`: its face reads no utilization"),
        (raw.leased.is_some() && face == RLS_FACE, "`leased`: leases are spent inside the Sluice filter"),
        (raw.budget.is_some(), "`budget`: a budget is shared by the Sluice filter's policies"),
    ];
    match other.iter().find(|(on, _)| *on) {
        Some((_, why)) => Err(Invalid::new(format!("{face} cannot use {why}"))),
        None => Ok(()),
    }
}

/// What one policy makes of one request: whether it applies, and on which
/// key. (What the filter did with a request is `sluice_core::verdict`.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keyed {
    /// The policy does not apply: no match, a bypass, or a skipped missing key.
    NotApplied,
    /// The policy applies, on this encoded key.
    Key(String),
    /// A key source is missing and the policy refuses such requests.
    MissingKey,
}

impl Policy {
    /// The name of its limit in an RLS answer: `limit_name`, else its name.
    pub fn answer_name(&self) -> &str {
        self.limit_name.as_deref().unwrap_or(self.name.as_str())
    }

    /// Whether it is a descriptor tree's node that limits nothing
    /// (`"limits": []`): a descriptor that reaches it has no limit.
    pub fn limits_nothing(&self) -> bool {
        self.limits.is_empty() && !self.unlimited && self.blocked.is_none()
    }

    /// The name its checks carry, which names its counters in Redis, the
    /// shim's metrics and the dashboard: its budget's if it shares one,
    /// else its own.
    pub fn state_name(&self) -> &str {
        self.budget.as_ref().unwrap_or(&self.name).as_str()
    }

    /// Every key source the policy reads: its deepest level's key, which
    /// begins with every key above it; the policy's `key` without levels.
    pub fn key_sources(&self) -> &[KeySource] {
        self.levels.last().map_or(&self.key, |l| &l.key)
    }

    /// Each level's key: the encoded values of its sources beyond the top
    /// level's. A missing one is the shared bucket's `!` when the policy
    /// shares; otherwise `None`, and the policy's `on_missing_key` decides.
    fn level_keys(&self, req: &impl Request, ip: ClientIp) -> Option<Vec<String>> {
        let top = self.key.len();
        let share = self.on_missing_key == OnMissingKey::Shared;
        self.levels
            .iter()
            .map(|level| match key::build(&level.key[top..], req, ip) {
                Some(key) => Some(key),
                None => share.then(|| key::MISSING.to_string()),
            })
            .collect()
    }

    /// Whether deciding it reads the request's body: an `llm`, a `body:` key
    /// source, a `body` condition.
    pub fn reads_body(&self) -> bool {
        self.llm.is_some()
            || self.key_sources().iter().any(|s| matches!(s, KeySource::Body(_)))
            || self.matcher.reads_body()
            || self.bypass.iter().any(Condition::reads_body)
    }

    /// Whether it may apply to `req` once its body is read: its `match`
    /// holds but for what reads the body (`bypass` is not consulted: it
    /// can only exclude).
    pub fn may_apply_before_body(&self, req: &impl Request, ip: ClientIp) -> bool {
        if self.matcher.face() != req.face() {
            return false;
        }
        if self.matcher.needs_key() && self.key_sources().iter().any(|s| matches!(s, KeySource::Body(_))) {
            // The `keys` condition reads a key not known yet.
            let mut matcher = self.matcher.clone();
            matcher.keys = None;
            return matcher.holds_but_body(req, None);
        }
        let raw = if self.matcher.needs_key() { raw_key(&self.key, req, ip) } else { None };
        self.matcher.holds_but_body(req, raw.as_deref())
    }

    pub fn evaluate(&self, req: &impl Request, ip: ClientIp) -> Keyed {
        if !self.matches(req, ip) {
            return Keyed::NotApplied;
        }
        match (key::build(&self.key, req, ip), self.on_missing_key) {
            (Some(key), _) => Keyed::Key(key),
            (None, OnMissingKey::Shared) => Keyed::Key(key::MISSING.to_string()),
            (None, OnMissingKey::Skip) => Keyed::NotApplied,
            (None, OnMissingKey::Deny) => Keyed::MissingKey,
        }
    }

    /// Whether `match` holds and no `bypass` does. A request is matched only
    /// by the policies of its face (HTTP, RLS or RLQS).
    fn matches(&self, req: &impl Request, ip: ClientIp) -> bool {
        if self.matcher.face() != req.face() {
            return false;
        }
        let needs_key = self.matcher.needs_key() || self.bypass.iter().any(Condition::needs_key);
        let raw = if needs_key { raw_key(&self.key, req, ip) } else { None };
        let raw = raw.as_deref();
        self.matcher.holds(req, raw) && !self.bypass.iter().any(|b| b.holds(req, raw))
    }
}

/// A policy that applies to a request, and the key it applies on.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied<'d> {
    pub policy: &'d Policy,
    /// The policy's position in the document.
    pub index: usize,
    pub key: String,
    /// The request's class (see [`Evaluation::class`]).
    pub class: usize,
    /// Each level's key, in the policy's `levels` order (`Check::levels`).
    pub levels: Vec<String>,
}

impl Document {
    /// `policy`'s position in the document, if it is one of its own.
    pub fn index_of(&self, policy: &Policy) -> Option<usize> {
        self.policies.iter().position(|p| std::ptr::eq(p, policy))
    }

    /// Whether any policy reads request bodies.
    pub fn reads_body(&self) -> bool {
        self.policies.iter().any(Policy::reads_body)
    }

    /// Whether `req`'s body must be read before it is decided: a policy that
    /// reads bodies may apply to it.
    pub fn needs_body(&self, req: &impl Request) -> bool {
        let ip = self.trusted_hops.client_ip();
        self.policies.iter().any(|p| p.reads_body() && p.may_apply_before_body(req, ip))
    }

    /// What a shim failure means for `policy`: its own failure mode and
    /// status, or the document's.
    pub fn failure_of(&self, policy: &Policy) -> (FailureMode, DenyStatus) {
        (
            policy.failure_mode.unwrap_or(self.failure_mode),
            policy.failure_status.unwrap_or(self.failure_status),
        )
    }

    /// The policies that apply to `req`, in document order; `Err` with the
    /// first enforced policy that refuses the request for a missing key. A
    /// shadow policy never refuses: its missing key is a would-deny, listed
    /// in [`Evaluation::shadow_missing_key`].
    pub fn evaluate<'d>(&'d self, req: &impl Request) -> Result<Evaluation<'d>, &'d Policy> {
        self.evaluate_recorded(req, |_| true)
    }

    /// [`evaluate`](Document::evaluate) for a request known only from a
    /// record of it (a log line) that `holds` some of its attributes and not
    /// others: a matching policy whose key reads an attribute the record
    /// lacks decides nothing, and is listed in
    /// [`Evaluation::unrecorded`] instead, since whether the request had
    /// that key is unknown. (A `keys` condition on such a key sees it
    /// missing.)
    pub fn evaluate_recorded<'d>(
        &'d self,
        req: &impl Request,
        holds: impl Fn(Attribute<'_>) -> bool,
    ) -> Result<Evaluation<'d>, &'d Policy> {
        let ip = self.trusted_hops.client_ip();
        let class = self.classes.classify(req, self.class_header.as_ref());
        let mut out = Evaluation { class, ..Evaluation::default() };
        let reached = self.reached(req);
        for (index, policy) in self.policies.iter().enumerate() {
            if let Some(path) = &policy.matcher.descriptor_tree {
                if !reached.as_deref().is_some_and(|r| crate::tree::is_reached(path, r)) {
                    continue;
                }
            }
            if let Some(source) = policy.key_sources().iter().position(|s| !holds(s.reads(ip))) {
                if policy.matches(req, ip) {
                    out.unrecorded.push((index, source));
                }
                continue;
            }
            match policy.evaluate(req, ip) {
                Keyed::NotApplied => {}
                Keyed::Key(key) => match policy.level_keys(req, ip) {
                    Some(levels) => out.applied.push(Applied { policy, index, key, class, levels }),
                    None if policy.on_missing_key == OnMissingKey::Skip => {}
                    None if policy.shadow => out.shadow_missing_key.push(index),
                    None => return Err(policy),
                },
                Keyed::MissingKey if policy.shadow => out.shadow_missing_key.push(index),
                Keyed::MissingKey => return Err(policy),
            }
        }
        Ok(out)
    }
}

impl Document {
    /// The node of its domain's descriptor tree an RLS request reaches, as
    /// its path; `None` for other requests or when it reaches none.
    fn reached(&self, req: &impl Request) -> Option<Vec<&crate::tree::Step>> {
        if req.face() != Face::Rls {
            return None;
        }
        let domain = req.domain()?;
        let paths: Vec<&[crate::tree::Step]> = self
            .policies
            .iter()
            .filter(|p| p.matcher.domain.as_deref().is_some_and(|d| d.as_bytes() == domain))
            .filter_map(|p| p.matcher.descriptor_tree.as_deref())
            .collect();
        if paths.is_empty() {
            return None;
        }
        crate::tree::reach(&paths, req.entries())
    }
}

/// What a document makes of one request that it does not refuse outright.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Evaluation<'d> {
    /// The policies that apply, in document order.
    pub applied: Vec<Applied<'d>>,
    /// Shadow policies with `on_missing_key: deny` whose key the request
    /// lacks (document indexes): each would have refused it, so each counts
    /// as a shadow denial, and none refuses.
    pub shadow_missing_key: Vec<usize>,
    /// With [`Document::evaluate_recorded`]: policies that match but whose
    /// key reads what the record does not hold, as (document index, index
    /// of the key source).
    pub unrecorded: Vec<(usize, usize)>,
    /// The request's priority class: an index into the document's classes,
    /// 0 the most important.
    pub class: usize,
}

impl<'d> std::ops::Deref for Evaluation<'d> {
    type Target = [Applied<'d>];
    fn deref(&self) -> &[Applied<'d>] {
        &self.applied
    }
}

// The wire messages a policy sends are built here: the wire sits below the
// document and knows no policy.

impl Applied<'_> {
    pub fn check(&self, req: &impl Request) -> Check {
        self.check_reserving(req, self.reserved(req))
    }

    /// [`Applied::check`] with the request's token reservation already
    /// weighed ([`Applied::reserved`]), so a caller that read the limits
    /// first does not read the body twice.
    pub fn check_reserving(&self, req: &impl Request, reserved: Option<u32>) -> Check {
        Check {
            policy: self.policy.state_name().to_string(),
            key: self.key.clone(),
            limits: self.wire_limits(req, reserved).collect(),
            margin_ms: self.policy.wait.map(|w| Millis(w.margin_ms())),
            upstream: self.policy.upstream.is_some(),
            levels: (self.policy.levels.iter().zip(&self.levels))
                .map(|(level, key)| CheckLevel {
                    level: LevelKey { name: level.name.as_str().to_string(), key: key.clone() },
                    from: level.from,
                })
                .collect(),
        }
    }

    /// A token budget's reservation for `req`, weighed: the cost of its
    /// `llm_tokens` limits. `None` for a policy without `llm`.
    pub fn reserved(&self, req: &impl Request) -> Option<u32> {
        self.policy.llm.as_ref().map(|llm| {
            let r = llm.reserve(req.body());
            llm.cost(r.input, r.output)
        })
    }

    /// The limits of [`Applied::check`], as sent (each with its cost for
    /// `req`, `reserved` from [`Applied::reserved`]), without building the
    /// check: the over-limit cache reads them on every request.
    pub fn wire_limits<'r>(
        &'r self,
        req: &'r impl Request,
        reserved: Option<u32>,
    ) -> impl Iterator<Item = WireLimit> + 'r {
        self.policy.limits.iter().map(move |l| self.wire_limit(l, req, reserved))
    }

    /// Its limit `index` as [`Applied::wire_limits`] sends it: a denial
    /// from the over-limit cache shows the limit that denied.
    pub fn wire_limit_at(
        &self,
        index: usize,
        req: &impl Request,
        reserved: Option<u32>,
    ) -> Option<WireLimit> {
        self.policy.limits.get(index).map(|l| self.wire_limit(l, req, reserved))
    }

    fn wire_limit(&self, l: &Limit, req: &impl Request, reserved: Option<u32>) -> WireLimit {
        match (l, reserved) {
            (Limit::Points { capacity, .. } | Limit::CalendarPoints { capacity, .. }, Some(cost))
                if l.costs_llm_tokens() =>
            {
                WireLimit::with_cost(l, cost.min(capacity.get()))
            }
            _ => WireLimit::of(l, req, self.class),
        }
    }

    /// The levels of [`Applied::check`]: each level's name, key and the
    /// index of its first limit, without building the check.
    pub fn level_keys(&self) -> impl Iterator<Item = (&str, &str, usize)> + '_ {
        self.policy.levels.iter().zip(&self.levels).map(|(l, key)| (l.name.as_str(), key.as_str(), l.from))
    }
}

impl ShedRequest {
    /// The report of `utilization` (none: a read) for `policy`.
    pub fn new(
        policy: &crate::Policy,
        shed: &crate::shed::ShedPolicy,
        classes: usize,
        utilization: Option<f64>,
    ) -> Self {
        let c = &shed.controller;
        ShedRequest {
            policy: policy.name.as_str().to_string(),
            classes,
            high: c.high,
            low: c.low,
            delay_ms: c.delay.to_millis(),
            ramp_ms: c.ramp.to_millis(),
            recovery_ms: c.recovery.to_millis(),
            utilization,
            now_ms: None,
        }
    }
}
