//! The policy document, v1.
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
//! Every policy whose `match` holds applies to a request, and the request
//! passes only if every limit of every one of them allows it.
//!
//! Validation happens inside deserialization, so that each error carries the
//! parser's position. Unknown fields are refused everywhere.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};

use crate::{Count, Duration, KeySource, PolicyName, Request};

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    /// The JSON Schema of the document, for editors; ignored.
    #[serde(rename = "$schema", default)]
    pub schema: Option<String>,
    #[serde(default)]
    pub shim: Shim,
    #[serde(default)]
    pub failure_mode: FailureMode,
    pub policies: Policies,
}

/// How the filter reaches the shim.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shim {
    /// The Envoy cluster of the shim.
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// How long a request waits for the shim's answer before `failure_mode` decides.
    #[serde(default = "default_timeout")]
    pub timeout_ms: TimeoutMs,
}

fn default_cluster() -> String {
    "sluice_shim".to_string()
}

fn default_timeout() -> TimeoutMs {
    TimeoutMs(100)
}

impl Default for Shim {
    fn default() -> Self {
        Shim { cluster: default_cluster(), timeout_ms: default_timeout() }
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

/// What happens when the shim cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Let the request through (fail open).
    #[default]
    Allow,
    /// Answer 503 (fail closed).
    Deny,
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
                    if !names.insert(policy.name.clone()) {
                        return Err(de::Error::custom(format!(
                            "duplicate policy name \"{}\" at policies[{}]",
                            policy.name,
                            policies.len()
                        )));
                    }
                    policies.push(policy);
                }
                Ok(Policies(policies))
            }
        }
        d.deserialize_seq(UniqueNames)
    }
}

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub name: PolicyName,
    #[serde(rename = "match", default)]
    pub matcher: Match,
    /// Where the key comes from. Empty: one bucket for every matching request.
    #[serde(default)]
    pub key: Vec<KeySource>,
    pub limits: Limits,
}

impl Policy {
    pub fn matches(&self, req: &impl Request) -> bool {
        self.matcher.matches(req)
    }

    /// The encoded key of this request under this policy; see [`crate::key`].
    pub fn key(&self, req: &impl Request) -> String {
        crate::key::build(&self.key, req)
    }
}

/// Which requests a policy applies to. Every condition given must hold; none
/// given matches everything.
#[derive(Debug, Clone, PartialEq, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    pub path_prefix: Option<String>,
    pub methods: Option<Vec<Method>>,
}

impl Match {
    pub fn matches(&self, req: &impl Request) -> bool {
        let path_ok = match &self.path_prefix {
            Some(prefix) => req.path().starts_with(prefix.as_bytes()),
            None => true,
        };
        let method_ok = match &self.methods {
            Some(methods) => methods.iter().any(|m| m.0.as_bytes() == req.method()),
            None => true,
        };
        path_ok && method_ok
    }
}

/// An HTTP method, in upper case as it appears on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Method(String);

impl<'de> Deserialize<'de> for Method {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = String::deserialize(d)?;
        let valid = !m.is_empty() && m.len() <= 32 && m.bytes().all(|b| b.is_ascii_uppercase());
        if valid {
            Ok(Method(m))
        } else {
            Err(de::Error::custom(format!("invalid method {m:?} (expected upper case, e.g. \"GET\")")))
        }
    }
}

/// The limits of one policy: at least one.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits(pub Vec<Limit>);

impl std::ops::Deref for Limits {
    type Target = [Limit];
    fn deref(&self) -> &[Limit] {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Limits {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let limits = Vec::<Limit>::deserialize(d)?;
        if limits.is_empty() {
            return Err(de::Error::custom("a policy needs at least one limit"));
        }
        Ok(Limits(limits))
    }
}

/// One limit of a policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    /// An exact sliding log: over any interval one `window` long, at most
    /// `limit` requests are admitted.
    SlidingWindow { limit: Count, window: Duration },
}

/// Every field any limit type may have. A limit is read into this first, so
/// that a bad field value is reported at its own path and position, and then
/// checked against its type.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    #[serde(rename = "type")]
    kind: LimitType,
    limit: Option<Count>,
    window: Option<Duration>,
}

#[derive(Clone, Copy, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum LimitType {
    SlidingWindow,
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawLimit::deserialize(d)?;
        let missing = |field: &str| de::Error::custom(format!("missing field `{field}`"));
        match raw.kind {
            LimitType::SlidingWindow => Ok(Limit::SlidingWindow {
                limit: raw.limit.ok_or_else(|| missing("limit"))?,
                window: raw.window.ok_or_else(|| missing("window"))?,
            }),
        }
    }
}
