//! Conditions on a request: a policy's `match`, and each entry of its
//! `bypass` list. Every condition given must hold; none given holds always.
//!
//! Paths are compared without the query string. `path_regex` is unanchored
//! (use `^` and `$`). `host` is compared case-insensitively with the
//! `:authority`, without its port. Header and query conditions are
//! `{"present": true}` (or `false` for absent), `{"equals": "v"}` or
//! `{"prefix": "v"}`; query values are form-decoded first. `keys` holds when
//! the policy's key (of a single source) is one of the listed raw values.
//!
//! `domain` (exact), `entries` and `bucket` (each `{"present"}`,
//! `{"equals"}` or `{"prefix"}`, like headers) are read from a gRPC face's
//! request: `entries` from an RLS descriptor, `bucket` from an RLQS bucket
//! id. A policy's `match` says its face ([`Condition::face`]): `bucket`
//! makes it an RLQS-face policy, `domain` or `entries` without it an
//! RLS-face one, neither an HTTP one.
//!
//! `body` conditions (like headers, keyed by JSON pointer: `{"/model":
//! {"prefix": "gpt-4"}}`) read fields of an HTTP request's JSON body; a
//! document with one reads request bodies.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::de::{self, Deserialize, Deserializer};

use crate::body::Pointer;
use crate::key::MAX_SOURCE_NAME_LEN;
use crate::request::{host_only, path_only, query_param, Face};
use crate::{HeaderName, Request};

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Condition {
    pub path: Option<PathCondition>,
    pub methods: Option<Vec<String>>,
    pub host: Option<String>,
    pub headers: BTreeMap<HeaderName, ValueCondition>,
    pub query: BTreeMap<String, ValueCondition>,
    pub keys: Option<Vec<String>>,
    /// A gRPC face's domain, exact.
    pub domain: Option<String>,
    /// An RLS descriptor's entries, by key.
    pub entries: BTreeMap<String, ValueCondition>,
    /// An RLQS bucket id's values, by key.
    pub bucket: BTreeMap<String, ValueCondition>,
    /// The policy's node in its domain's RLS descriptor tree (see
    /// [`crate::tree`]): holds only for the descriptors that reach it, which
    /// the document decides, not this condition alone.
    pub descriptor_tree: Option<Vec<crate::tree::Step>>,
    /// An RLS descriptor's position in its call (0 the first).
    pub descriptor_index: Option<usize>,
    /// Fields of the JSON body, by pointer.
    pub body: BTreeMap<Pointer, ValueCondition>,
}

#[derive(Debug, Clone)]
pub enum PathCondition {
    Prefix(String),
    Exact(String),
    Regex(regex_lite::Regex),
}

impl PartialEq for PathCondition {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (PathCondition::Prefix(a), PathCondition::Prefix(b)) => a == b,
            (PathCondition::Exact(a), PathCondition::Exact(b)) => a == b,
            (PathCondition::Regex(a), PathCondition::Regex(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueCondition {
    Present(bool),
    Equals(String),
    Prefix(String),
}

impl ValueCondition {
    fn holds(&self, value: Option<&[u8]>) -> bool {
        match (self, value) {
            (ValueCondition::Present(want), v) => *want == v.is_some(),
            (ValueCondition::Equals(want), Some(v)) => want.as_bytes() == v,
            (ValueCondition::Prefix(want), Some(v)) => v.starts_with(want.as_bytes()),
            (_, None) => false,
        }
    }
}

impl Condition {
    /// Whether a `keys` condition needs the request's raw key value.
    pub fn needs_key(&self) -> bool {
        self.keys.is_some()
    }

    /// Whether this names `domain`, `entries` or `bucket`: as a policy's
    /// `match`, it makes the policy a gRPC-face policy, which only requests
    /// of a gRPC face (with a domain) reach, and no HTTP request from the filter.
    pub fn is_grpc_face(&self) -> bool {
        self.face() != Face::Http
    }

    /// As a policy's `match`, the face of the requests it can match:
    /// `bucket` names an RLQS bucket, `domain` or `entries` alone an RLS
    /// descriptor, none of them an HTTP request.
    pub fn face(&self) -> Face {
        if !self.bucket.is_empty() {
            Face::Rlqs
        } else if self.domain.is_some()
            || !self.entries.is_empty()
            || self.descriptor_tree.is_some()
            || self.descriptor_index.is_some()
        {
            Face::Rls
        } else {
            Face::Http
        }
    }

    /// The first condition named that an RLQS bucket never has (only
    /// `domain`, `bucket` and `keys` read one), by its field's name.
    pub fn http_field(&self) -> Option<&'static str> {
        let path = match self.path {
            Some(PathCondition::Prefix(_)) => Some("path_prefix"),
            Some(PathCondition::Exact(_)) => Some("path_exact"),
            Some(PathCondition::Regex(_)) => Some("path_regex"),
            None => None,
        };
        path.or_else(|| {
            [
                (self.methods.is_some(), "methods"),
                (self.host.is_some(), "host"),
                (!self.headers.is_empty(), "headers"),
                (!self.query.is_empty(), "query"),
                (!self.entries.is_empty(), "entries"),
                (self.descriptor_tree.is_some(), "descriptor_tree"),
                (self.descriptor_index.is_some(), "descriptor_index"),
            ]
            .into_iter()
            .find_map(|(named, field)| named.then_some(field))
        })
    }

    /// Whether it has `body` conditions.
    pub fn reads_body(&self) -> bool {
        !self.body.is_empty()
    }

    /// Whether every condition holds. `raw_key` is the policy's raw key value,
    /// asked for only when [`Condition::needs_key`].
    pub fn holds(&self, req: &impl Request, raw_key: Option<&[u8]>) -> bool {
        self.holds_but_body(req, raw_key)
            && self
                .body
                .iter()
                .all(|(pointer, cond)| cond.holds(req.body().and_then(|b| b.field(pointer)).as_deref()))
    }

    /// Whether every condition but the `body` ones holds: whether it may
    /// hold once the body is read.
    pub fn holds_but_body(&self, req: &impl Request, raw_key: Option<&[u8]>) -> bool {
        self.path_holds(req.path())
            && self.methods.as_ref().is_none_or(|ms| ms.iter().any(|m| m.as_bytes() == req.method()))
            && self
                .host
                .as_ref()
                .is_none_or(|h| host_only(req.authority()).eq_ignore_ascii_case(h.as_bytes()))
            && self.headers.iter().all(|(name, cond)| cond.holds(req.header(name.as_str()).as_deref()))
            && self
                .query
                .iter()
                .all(|(name, cond)| cond.holds(query_param(req.path(), name).as_deref().map(str::as_bytes)))
            && self
                .keys
                .as_ref()
                .is_none_or(|keys| raw_key.is_some_and(|k| keys.iter().any(|v| v.as_bytes() == k)))
            && self.domain.as_ref().is_none_or(|d| req.domain() == Some(d.as_bytes()))
            && self.entries.iter().all(|(key, cond)| cond.holds(req.entry(key).as_deref()))
            && self.descriptor_index.is_none_or(|i| req.descriptor_index() == Some(i))
            && self.bucket.iter().all(|(key, cond)| cond.holds(req.bucket(key).as_deref()))
    }

    fn path_holds(&self, path: &[u8]) -> bool {
        let path = path_only(path);
        match &self.path {
            None => true,
            Some(PathCondition::Prefix(p)) => path.starts_with(p.as_bytes()),
            Some(PathCondition::Exact(p)) => path == p.as_bytes(),
            Some(PathCondition::Regex(re)) => std::str::from_utf8(path).is_ok_and(|p| re.is_match(p)),
        }
    }
}

/// Conditions on a request; every condition given must hold.
#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCondition {
    path_prefix: Option<String>,
    path_exact: Option<String>,
    /// A regular expression, unanchored, matched against the path without the query.
    path_regex: Option<PathRegex>,
    /// Upper-case HTTP methods, e.g. `["GET", "POST"]`.
    methods: Option<Vec<Method>>,
    /// The host, without a port; compared case-insensitively.
    host: Option<String>,
    #[serde(default)]
    headers: BTreeMap<HeaderName, ValueCondition>,
    #[serde(default)]
    query: BTreeMap<String, ValueCondition>,
    /// Raw values of the policy's (single) key source.
    keys: Option<Vec<String>>,
    /// gRPC faces: the request's domain (an RLS request's `domain`), exact.
    domain: Option<String>,
    /// RLS face: an RLS descriptor's entries by key.
    #[serde(default)]
    entries: BTreeMap<String, ValueCondition>,
    /// RLQS face: an RLQS bucket id's values by key (the map Envoy's
    /// `bucket_id_builder` builds).
    #[serde(default)]
    bucket: BTreeMap<String, ValueCondition>,
    /// RLS face: the policy's node in its domain's descriptor tree, as the
    /// path of entries from the root (`[{"key": "plan", "value": "pro"},
    /// {"key": "user"}]`; a value with `*` is a wildcard, none any value). A
    /// descriptor reaches one node, the most specific at every level, as
    /// envoyproxy/ratelimit finds its limit; only that node's policies apply.
    #[cfg_attr(feature = "schema", schemars(with = "Option<Vec<crate::tree::RawStep>>"))]
    descriptor_tree: Option<Vec<crate::tree::Step>>,
    /// RLS face: only the descriptor at this position of the call (0 the
    /// first), as Limitador's `descriptors[0]`.
    descriptor_index: Option<usize>,
    /// Fields of the request's JSON body by JSON pointer, e.g. `{"/model": {"prefix": "gpt-4"}}`.
    #[serde(default)]
    body: BTreeMap<Pointer, ValueCondition>,
}

/// The most entries of one list or map in a condition (`methods`, `keys`,
/// `headers`, `query`) or of a policy's `bypass`.
pub const MAX_CONDITION_ENTRIES: usize = 256;

/// The longest `path_regex` accepted.
const MAX_REGEX_LEN: usize = 1024;

impl<'de> Deserialize<'de> for Condition {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawCondition::deserialize(d)?;
        let lists = [
            ("methods", raw.methods.as_ref().map_or(0, Vec::len)),
            ("headers", raw.headers.len()),
            ("query", raw.query.len()),
            ("keys", raw.keys.as_ref().map_or(0, Vec::len)),
            ("entries", raw.entries.len()),
            ("bucket", raw.bucket.len()),
            ("body", raw.body.len()),
        ];
        if let Some((name, len)) = lists.iter().find(|(_, len)| *len > MAX_CONDITION_ENTRIES) {
            return Err(de::Error::custom(format!(
                "`{name}` has {len} entries, more than the {MAX_CONDITION_ENTRIES} a condition may hold"
            )));
        }
        let paths = [raw.path_prefix.is_some(), raw.path_exact.is_some(), raw.path_regex.is_some()];
        if paths.iter().filter(|given| **given).count() > 1 {
            return Err(de::Error::custom("give at most one of `path_prefix`, `path_exact`, `path_regex`"));
        }
        if let Some(key) = raw.entries.keys().find(|k| k.is_empty() || k.len() > MAX_SOURCE_NAME_LEN) {
            return Err(de::Error::custom(format!(
                "invalid entry key {key:?} (expected 1 to {MAX_SOURCE_NAME_LEN} bytes)"
            )));
        }
        if let Some(key) = raw.bucket.keys().find(|k| k.is_empty() || k.len() > MAX_SOURCE_NAME_LEN) {
            return Err(de::Error::custom(format!(
                "invalid bucket key {key:?} (expected 1 to {MAX_SOURCE_NAME_LEN} bytes)"
            )));
        }
        if let Some(path) = &raw.descriptor_tree {
            if path.is_empty() || path.len() > crate::tree::MAX_DEPTH {
                return Err(de::Error::custom(format!(
                    "`descriptor_tree` has {} steps: expected 1 to {}",
                    path.len(),
                    crate::tree::MAX_DEPTH
                )));
            }
            if raw.domain.is_none() {
                return Err(de::Error::custom(
                    "`descriptor_tree` needs a `domain`: each domain has its own tree",
                ));
            }
        }
        if let Some(i) = raw.descriptor_index {
            if i >= crate::tree::MAX_CALL_DESCRIPTORS {
                return Err(de::Error::custom(format!(
                    "`descriptor_index` {i}: a call has at most {} descriptors",
                    crate::tree::MAX_CALL_DESCRIPTORS
                )));
            }
        }
        if !raw.bucket.is_empty() && (raw.descriptor_tree.is_some() || raw.descriptor_index.is_some()) {
            return Err(de::Error::custom(
                "`descriptor_tree` and `descriptor_index` read an RLS descriptor, not an RLQS bucket",
            ));
        }
        if !raw.entries.is_empty() && !raw.bucket.is_empty() {
            return Err(de::Error::custom(
                "give `entries` (an RLS descriptor's) or `bucket` (an RLQS bucket id's), not both: a request comes through one face",
            ));
        }
        let path = if let Some(p) = raw.path_prefix {
            Some(PathCondition::Prefix(p))
        } else if let Some(p) = raw.path_exact {
            Some(PathCondition::Exact(p))
        } else if let Some(PathRegex(re)) = raw.path_regex {
            Some(PathCondition::Regex(re))
        } else {
            None
        };
        Ok(Condition {
            path,
            methods: raw.methods.map(|ms| ms.into_iter().map(|m| m.0).collect()),
            host: raw.host.map(|h| h.to_ascii_lowercase()),
            headers: raw.headers,
            query: raw.query,
            keys: raw.keys,
            domain: raw.domain,
            entries: raw.entries,
            bucket: raw.bucket,
            descriptor_tree: raw.descriptor_tree,
            descriptor_index: raw.descriptor_index,
            body: raw.body,
        })
    }
}

/// A compiled `path_regex`.
pub(crate) struct PathRegex(regex_lite::Regex);

impl<'de> Deserialize<'de> for PathRegex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let re = String::deserialize(d)?;
        if re.len() > MAX_REGEX_LEN {
            return Err(de::Error::custom(format!("invalid regex: longer than {MAX_REGEX_LEN} bytes")));
        }
        regex_lite::Regex::new(&re)
            .map(PathRegex)
            .map_err(|e| de::Error::custom(format!("invalid regex {re:?}: {e}")))
    }
}

impl<'de> Deserialize<'de> for ValueCondition {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RawValueCondition::deserialize(d)?.check().map_err(de::Error::custom)
    }
}

/// Exactly one of `present`, `equals`, `prefix`.
#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawValueCondition {
    present: Option<bool>,
    equals: Option<String>,
    prefix: Option<String>,
}

impl RawValueCondition {
    fn check(self) -> Result<ValueCondition, &'static str> {
        match (self.present, self.equals, self.prefix) {
            (Some(p), None, None) => Ok(ValueCondition::Present(p)),
            (None, Some(v), None) => Ok(ValueCondition::Equals(v)),
            (None, None, Some(v)) => Ok(ValueCondition::Prefix(v)),
            _ => Err("give exactly one of `present`, `equals`, `prefix`"),
        }
    }
}

/// An HTTP method, in upper case as it appears on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Method(String);

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

/// The raw value a `keys` condition compares with.
pub(crate) fn raw_key<'r>(
    sources: &[crate::KeySource],
    req: &'r impl Request,
    ip: crate::key::ClientIp,
) -> Option<Cow<'r, [u8]>> {
    match sources {
        [source] => source.value(req, ip),
        _ => None,
    }
}
