//! The JSON Schema of the policy document, generated from the Rust types.
//! `sluice schema` prints it; `policies/schema.json` is its committed copy,
//! and a test fails when the two differ.
//!
//! Types that check themselves while they parse describe their accepted form
//! here; the rest derive their schema next to their definition.

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};

use crate::condition::{Condition, PathRegex, RawCondition, RawValueCondition, ValueCondition};
use crate::document::{BodyLimit, Policies, RawPolicy, TimeoutMs, TrustedHops};
use crate::limit::RawCost;
use crate::response::{CacheSlots, CooldownMs, DenyStatus, ExtraHeaders, FailureThreshold, SharedCalls};
use crate::wait::{Margin, RawWait, Wait};
use crate::{Count, Document, Duration, HeaderName, KeySource, Policy, PolicyName};

/// The schema of the whole document, as pretty JSON with a trailing newline.
pub fn document_schema() -> String {
    let schema = schemars::generate::SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<Document>();
    let mut text = serde_json::to_string_pretty(&schema).unwrap_or_default();
    text.push('\n');
    text
}

/// A type whose schema is a fixed JSON object.
macro_rules! fixed_schema {
    ($ty:ty, $name:literal, $schema:tt) => {
        impl JsonSchema for $ty {
            fn schema_name() -> Cow<'static, str> {
                $name.into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!($schema)
            }
        }
    };
}

/// A type that parses through another type's form.
macro_rules! schema_of {
    ($ty:ty, $name:literal, $raw:ty) => {
        impl JsonSchema for $ty {
            fn schema_name() -> Cow<'static, str> {
                $name.into()
            }
            fn json_schema(generator: &mut SchemaGenerator) -> Schema {
                <$raw>::json_schema(generator)
            }
        }
    };
}

fixed_schema!(Duration, "Duration", {
    "type": "string",
    "pattern": "^[0-9]+(ms|s|m|h|d)$",
    "description": "An integer and a unit: ms, s, m, h, d; from 1ms to 365d.",
    "examples": ["250ms", "5s", "1m", "1h", "1d"]
});
fixed_schema!(Count, "Count", {"type": "integer", "minimum": 1, "maximum": 1_000_000_000});
fixed_schema!(PolicyName, "PolicyName", {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"});
fixed_schema!(HeaderName, "HeaderName", {"type": "string", "pattern": "^:?[A-Za-z0-9._-]{1,128}$"});
fixed_schema!(TimeoutMs, "TimeoutMs", {"type": "integer", "minimum": 1, "maximum": 60000});
fixed_schema!(TrustedHops, "TrustedHops", {"type": "integer", "minimum": 0, "maximum": 16});
fixed_schema!(DenyStatus, "DenyStatus", {"type": "integer", "minimum": 400, "maximum": 599});
fixed_schema!(FailureThreshold, "FailureThreshold", {"type": "integer", "minimum": 0, "maximum": 1000});
fixed_schema!(SharedCalls, "SharedCalls", {"type": "integer", "minimum": 0, "maximum": 64});
fixed_schema!(CooldownMs, "CooldownMs", {"type": "integer", "minimum": 1, "maximum": 600000});
fixed_schema!(CacheSlots, "CacheSlots", {"type": "integer", "minimum": 0, "maximum": 65536});
fixed_schema!(ExtraHeaders, "ExtraHeaders", {
    "type": "object",
    "propertyNames": {"pattern": "^[A-Za-z0-9._-]{1,128}$"},
    "additionalProperties": {"type": "string"}
});
fixed_schema!(PathRegex, "PathRegex", {"type": "string", "maxLength": 1024, "format": "regex"});
fixed_schema!(crate::condition::Method, "Method", {"type": "string", "pattern": "^[A-Z]{1,32}$"});
fixed_schema!(KeySource, "KeySource", {
    "type": "string",
    "pattern": "^(ip|path|method|host|header::?[A-Za-z0-9._-]{1,128}|(query|entry|bucket):.{1,128}|body:/.{0,255})$",
    "examples": ["header:x-api-key", "ip", "path", "method", "host", "query:tenant", "body:/model"]
});
fixed_schema!(crate::body::Pointer, "Pointer", {
    "type": "string",
    "pattern": "^(/([^~]|~[01])*)?$",
    "maxLength": 256,
    "description": "A JSON pointer (RFC 6901) into a JSON body.",
    "examples": ["/model", "/usage/total_tokens"]
});
fixed_schema!(BodyLimit, "BodyLimit", {"type": "integer", "minimum": 1, "maximum": 16777216});

fixed_schema!(Margin, "Margin", {
    "type": "string",
    "pattern": "^[0-9]+(ms|s|m|h|d)$",
    "description": "An integer and a unit, 0ms to 10s.",
    "examples": ["0ms", "1ms", "20ms"]
});

schema_of!(Wait, "Wait", RawWait);
schema_of!(crate::leased::Leased, "Leased", crate::leased::RawLeased);
schema_of!(Condition, "Condition", RawCondition);
schema_of!(ValueCondition, "ValueCondition", RawValueCondition);
schema_of!(Policy, "Policy", RawPolicy);
schema_of!(crate::limit::PoolReserve, "PoolReserve", crate::limit::RawReserve);
schema_of!(crate::limit::Cost, "Cost", RawCost);
schema_of!(crate::llm::Llm, "Llm", crate::llm::RawLlm);

impl JsonSchema for Policies {
    fn schema_name() -> Cow<'static, str> {
        "Policies".into()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        <Vec<Policy>>::json_schema(generator)
    }
}
