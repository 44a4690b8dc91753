//! The shapes of access log a line may have, how a JSON line's shape is
//! told from its fields, and what to do when a shape does not record what a
//! policy's key reads.
//!
//! - Envoy's default text format: a line that starts with `[`.
//! - Envoy Gateway's default JSON access log: `start_time` with
//!   `x-envoy-origin-path` or `:authority`.
//! - Istio's default JSON access log: `start_time` otherwise.
//! - With `--field`, any other JSON line is read through the mapping alone
//!   (and the mapping also applies on top of Istio's and Envoy Gateway's).
//! - Sluice's own JSON lines otherwise: `time` or `time_ms`, `method`,
//!   `path`, `authority`, `headers`, `source`, `duration_ms`, nothing else.

use serde_json::{Map, Value};
use sluice_policies::request::Attribute;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Shape {
    EnvoyText,
    Sluice,
    Istio,
    EnvoyGateway,
    Mapped,
}

impl Shape {
    pub(crate) const ALL: [Shape; 5] =
        [Shape::EnvoyText, Shape::Sluice, Shape::Istio, Shape::EnvoyGateway, Shape::Mapped];

    /// The shape of a JSON line, by its fields; `mapped` when `--field` was given.
    pub(crate) fn of_json(line: &Map<String, Value>, mapped: bool) -> Shape {
        if line.contains_key("start_time") {
            if line.contains_key("x-envoy-origin-path") || line.contains_key(":authority") {
                return Shape::EnvoyGateway;
            }
            return Shape::Istio;
        }
        if mapped {
            Shape::Mapped
        } else {
            Shape::Sluice
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Shape::EnvoyText => "Envoy text",
            Shape::Sluice => "Sluice JSON",
            Shape::Istio => "Istio JSON",
            Shape::EnvoyGateway => "Envoy Gateway JSON",
            Shape::Mapped => "JSON read with --field",
        }
    }

    /// What to do when lines of this shape do not record `attribute`, which
    /// a policy's key reads; `None` when this shape always records it.
    pub(crate) fn hint(self, attribute: Attribute<'_>) -> Option<String> {
        let ip = "pass --trusted-hops N to read the client from x-forwarded-for";
        Some(match (self, attribute) {
            (_, Attribute::Path | Attribute::Method) => return None,
            (_, Attribute::Domain | Attribute::Entry(_) | Attribute::Bucket(_)) => {
                "access logs hold no gRPC face's domain or entries: a gRPC-face policy is not replayed".to_string()
            }
            (_, Attribute::Body(pointer)) => {
                format!("access logs hold no request body: a policy keyed by body:{pointer} is not replayed")
            }
            (Shape::EnvoyText, Attribute::SourceAddress) => format!(
                "Envoy's text format logs no client address; {ip}, or log %DOWNSTREAM_REMOTE_ADDRESS% in a JSON access log"
            ),
            (Shape::EnvoyText, Attribute::Header(name)) => format!(
                "Envoy's text format logs only the x-forwarded-for, user-agent and x-request-id headers; log {name} in a JSON access log (\"{name}\": \"%REQ({name})%\") and map it with --field header:{name}={name}"
            ),
            (Shape::EnvoyText, Attribute::Authority) => return None,
            (Shape::Sluice, Attribute::SourceAddress) => format!("these lines have no \"source\"; add it, or {ip}"),
            (Shape::Sluice, Attribute::Header(_)) => "these lines have no \"headers\" object".to_string(),
            (Shape::Sluice, Attribute::Authority) => "these lines have no \"authority\"".to_string(),
            (Shape::Istio | Shape::EnvoyGateway, Attribute::SourceAddress) => {
                format!("these lines have no downstream_remote_address; {ip}")
            }
            (Shape::Istio | Shape::EnvoyGateway, Attribute::Header(name)) => format!(
                "{}'s default JSON access log holds only the x-forwarded-for, user-agent and x-request-id headers; add \"{name}\": \"%REQ({name})%\" to its format and map it with --field header:{name}={name}",
                if self == Shape::Istio { "Istio" } else { "Envoy Gateway" }
            ),
            (Shape::Istio | Shape::EnvoyGateway, Attribute::Authority) => {
                "these lines have no authority field".to_string()
            }
            (Shape::Mapped, Attribute::SourceAddress) => {
                format!("these lines have no mapped source; map it with --field source=FIELD, or {ip}")
            }
            (Shape::Mapped, Attribute::Header(name)) => {
                format!("these lines have no mapped {name}; map it with --field header:{name}=FIELD")
            }
            (Shape::Mapped, Attribute::Authority) => {
                "these lines have no mapped authority; map it with --field authority=FIELD".to_string()
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(text: &str) -> Map<String, Value> {
        match serde_json::from_str(text) {
            Ok(Value::Object(map)) => map,
            other => panic!("not an object: {other:?}"),
        }
    }

    #[test]
    fn json_shapes_are_told_by_their_fields() {
        let eg = object(r#"{"start_time": "x", ":authority": "a", "x-envoy-origin-path": "/"}"#);
        assert_eq!(Shape::of_json(&eg, false), Shape::EnvoyGateway);
        let istio = object(r#"{"start_time": "x", "path": "/", "authority": "a"}"#);
        assert_eq!(Shape::of_json(&istio, true), Shape::Istio);
        let own = object(r#"{"time_ms": 1, "path": "/"}"#);
        assert_eq!(Shape::of_json(&own, false), Shape::Sluice);
        assert_eq!(Shape::of_json(&own, true), Shape::Mapped);
    }
}
