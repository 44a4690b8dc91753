//! Field mappings: which field of a JSON log line holds which part of the
//! request. Istio's and Envoy Gateway's default JSON access logs are two
//! built-in mappings ([`Mapping::istio`], [`Mapping::envoy_gateway`]); any
//! other JSON log is read through one given with `--field TARGET=FIELD`:
//!
//! | target | what the field holds |
//! | --- | --- |
//! | `time` | the start time, RFC 3339 (`%START_TIME%`) |
//! | `time_ms` | the start time, milliseconds since the epoch |
//! | `method`, `path`, `authority` | the request's (path with its query) |
//! | `source` | the downstream peer address (`%DOWNSTREAM_REMOTE_ADDRESS%`) |
//! | `duration_ms` | how long the request took, in milliseconds |
//! | `header:NAME` | a request header |
//! | `tokens` | the request's LLM token count, as its policy's `llm` charges it (its usage) |
//!
//! Fields not mapped are ignored. A mapped field absent from a line is not
//! recorded there (a key that reads it is counted apart); one present as
//! `null` or `"-"` (what Envoy writes for a value it lacked) was absent from
//! the request itself. Values may be strings or numbers.

use std::borrow::Cow;

use serde_json::{Map, Value};
use sluice_policies::replay::{Recorded, RecordedHeaders, Replayed};
use sluice_policies::request::SimpleRequest;
use sluice_policies::HeaderName;

use super::time::rfc3339_us;
use super::unreadable::Unreadable;

/// A `--field` that does not say `TARGET=FIELD`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FieldSpecError {
    #[error("--field {0:?}: expected TARGET=FIELD")]
    NoEquals(String),
    #[error("--field {0:?}: no field name after =")]
    NoField(String),
    #[error("--field {spec:?}: unknown target {target:?} (expected time, time_ms, method, path, authority, source, duration_ms, tokens or header:NAME)")]
    UnknownTarget { spec: String, target: String },
}

/// What one mapped field is read as.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Time,
    TimeMs,
    Method,
    Path,
    Authority,
    Source,
    DurationMs,
    Tokens,
    Header(String),
}

impl Target {
    fn parse(text: &str) -> Option<Target> {
        Some(match text {
            "time" => Target::Time,
            "time_ms" => Target::TimeMs,
            "method" => Target::Method,
            "path" => Target::Path,
            "authority" => Target::Authority,
            "source" => Target::Source,
            "duration_ms" => Target::DurationMs,
            "tokens" => Target::Tokens,
            _ => match text.strip_prefix("header:").map(HeaderName::new) {
                Some(Some(name)) => Target::Header(name.as_str().to_string()),
                _ => return None,
            },
        })
    }
}

/// Which field holds what; later entries for the same target win.
#[derive(Debug, Clone, Default)]
pub(crate) struct Mapping {
    fields: Vec<(Target, String)>,
}

/// One field's value in a line.
enum Field<'a> {
    /// Not in the line: not recorded.
    Absent,
    /// `null` or `"-"`: the request had none.
    Lacked,
    Text(Cow<'a, str>),
}

impl Mapping {
    /// `--field TARGET=FIELD`, each given once or more.
    pub(crate) fn parse(specs: &[String]) -> Result<Mapping, FieldSpecError> {
        let mut mapping = Mapping::default();
        for spec in specs {
            let (target, field) =
                spec.split_once('=').ok_or_else(|| FieldSpecError::NoEquals(spec.clone()))?;
            if field.is_empty() {
                return Err(FieldSpecError::NoField(spec.clone()));
            }
            let target = Target::parse(target).ok_or_else(|| FieldSpecError::UnknownTarget {
                spec: spec.clone(),
                target: target.to_string(),
            })?;
            mapping.fields.push((target, field.to_string()));
        }
        Ok(mapping)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Istio's default JSON access log (`meshConfig.accessLogEncoding: JSON`).
    pub(crate) fn istio() -> Mapping {
        Mapping::of(&[
            ("time", "start_time"),
            ("method", "method"),
            ("path", "path"),
            ("authority", "authority"),
            ("source", "downstream_remote_address"),
            ("duration_ms", "duration"),
            ("header:x-forwarded-for", "x_forwarded_for"),
            ("header:user-agent", "user_agent"),
            ("header:x-request-id", "request_id"),
        ])
    }

    /// Envoy Gateway's default JSON access log.
    pub(crate) fn envoy_gateway() -> Mapping {
        Mapping::of(&[
            ("time", "start_time"),
            ("method", "method"),
            ("path", "x-envoy-origin-path"),
            ("authority", ":authority"),
            ("source", "downstream_remote_address"),
            ("duration_ms", "duration"),
            ("header:x-forwarded-for", "x-forwarded-for"),
            ("header:user-agent", "user-agent"),
            ("header:x-request-id", "x-request-id"),
        ])
    }

    fn of(pairs: &[(&str, &str)]) -> Mapping {
        let fields = pairs
            .iter()
            .filter_map(|(target, field)| Some((Target::parse(target)?, field.to_string())))
            .collect();
        Mapping { fields }
    }

    /// This mapping with `more` on top: a target both map is read from `more`'s field.
    pub(crate) fn with(mut self, more: &Mapping) -> Mapping {
        self.fields.retain(|(target, _)| !more.fields.iter().any(|(t, _)| t == target));
        self.fields.extend(more.fields.iter().cloned());
        self
    }

    /// Reads one line's object; the error says which field is wrong.
    pub(crate) fn read(&self, line: &Map<String, Value>) -> Result<Replayed, Unreadable> {
        let mut at_us = None;
        let mut method = Cow::Borrowed("GET");
        let mut path = None;
        let mut duration_ms = 0;
        let mut tokens = None;
        let mut request = SimpleRequest::default();
        let mut recorded = Recorded {
            source_address: false,
            authority: false,
            headers: RecordedHeaders::Only(Vec::new()),
            grpc: false,
        };
        for (target, name) in &self.fields {
            let value = match field(line, name)? {
                Field::Absent => continue,
                value => value,
            };
            let text = match &value {
                Field::Text(text) => Some(text.as_ref()),
                _ => None,
            };
            match target {
                Target::Time => at_us = text.map(rfc3339_us).transpose()?,
                Target::TimeMs => {
                    at_us = text.map(|t| number(name, t)).transpose()?.map(|ms| ms.saturating_mul(1000))
                }
                Target::Method => method = Cow::Owned(text.unwrap_or("GET").to_string()),
                Target::Path => path = text.map(str::to_string),
                Target::DurationMs => duration_ms = text.map(|t| number(name, t)).transpose()?.unwrap_or(0),
                Target::Tokens => tokens = text.map(|t| count(name, t)).transpose()?,
                Target::Authority => {
                    recorded.authority = true;
                    request.authority = text.unwrap_or_default().into();
                }
                // Every request has a peer: one not logged is not recorded.
                Target::Source => {
                    recorded.source_address = text.is_some();
                    request.source_address = text.map(Into::into);
                }
                Target::Header(header) => {
                    if let RecordedHeaders::Only(names) = &mut recorded.headers {
                        names.push(header.clone());
                    }
                    if let Some(text) = text {
                        request.headers.push((header.clone(), text.into()));
                    }
                }
            }
        }
        let at_us = at_us.ok_or_else(|| self.no("time", "time=FIELD (RFC 3339) or time_ms=FIELD"))?;
        request.path = path.ok_or_else(|| self.no("path", "path=FIELD"))?.into_bytes();
        request.method = method.into_owned().into_bytes();
        Ok(Replayed { at_us, request, duration_ms, tokens, recorded })
    }

    /// The error for a line without a required part.
    fn no(&self, what: &str, flag: &str) -> Unreadable {
        let fields: Vec<&str> = self
            .fields
            .iter()
            .filter(|(t, _)| {
                matches!((t, what), (Target::Time | Target::TimeMs, "time") | (Target::Path, "path"))
            })
            .map(|(_, f)| f.as_str())
            .collect();
        Unreadable::new(match fields.as_slice() {
            [] => format!("no {what}: map the field that holds it with --field {flag}"),
            _ => format!("no {what}: the line has no {}", fields.join(" or ")),
        })
    }
}

fn field<'a>(line: &'a Map<String, Value>, name: &str) -> Result<Field<'a>, Unreadable> {
    Ok(match line.get(name) {
        None => Field::Absent,
        Some(Value::Null) => Field::Lacked,
        Some(Value::String(s)) if s == "-" => Field::Lacked,
        Some(Value::String(s)) => Field::Text(Cow::Borrowed(s)),
        Some(Value::Number(n)) => Field::Text(Cow::Owned(n.to_string())),
        Some(Value::Bool(b)) => Field::Text(Cow::Owned(b.to_string())),
        Some(_) => return Err(Unreadable::new(format!("field {name:?} is not a string or a number"))),
    })
}

/// A whole number of tokens.
fn count(name: &str, text: &str) -> Result<u64, Unreadable> {
    (text.trim().parse())
        .map_err(|_| Unreadable::new(format!("field {name:?}: {text:?} is not a whole number of tokens")))
}

/// A whole number of milliseconds; a fraction is cut.
fn number(name: &str, text: &str) -> Result<u64, Unreadable> {
    let whole = text.split_once('.').map_or(text, |(whole, _)| whole);
    (whole.parse())
        .map_err(|_| Unreadable::new(format!("field {name:?}: {text:?} is not a number of milliseconds")))
}

#[cfg(test)]
mod tests {
    use sluice_policies::replay::RecordedHeaders;
    use sluice_policies::request::Attribute;
    use sluice_policies::Request;

    use super::*;

    fn object(text: &str) -> Map<String, Value> {
        match serde_json::from_str(text) {
            Ok(Value::Object(map)) => map,
            other => panic!("not an object: {other:?}"),
        }
    }

    #[test]
    fn a_mapping_reads_its_fields_and_ignores_the_rest() {
        let mapping = Mapping::parse(&[
            "time_ms=ts".into(),
            "path=uri".into(),
            "header:X-Api-Key=api_key".into(),
            "duration_ms=took".into(),
        ])
        .expect("valid");
        let l = mapping
            .read(&object(r#"{"ts": 1500, "uri": "/v1", "api_key": "k1", "took": "12.7", "other": [1]}"#))
            .expect("reads");
        assert_eq!((l.at_us, l.duration_ms), (1_500_000, 12));
        assert_eq!(l.request.method(), b"GET");
        assert_eq!(Request::header(&l.request, "x-api-key").as_deref(), Some(&b"k1"[..]));
        assert_eq!(l.recorded.headers, RecordedHeaders::Only(vec!["x-api-key".into()]));
        assert!(!l.recorded.holds(Attribute::SourceAddress));
    }

    /// `null` and `"-"` say the request lacked it; an absent field says
    /// nothing.
    #[test]
    fn null_is_lacked_and_absent_is_unrecorded() {
        let mapping = Mapping::istio();
        let line = r#"{"start_time": "2026-11-23T10:00:00.000Z", "method": "GET", "path": "/", "x_forwarded_for": "-", "authority": null}"#;
        let l = mapping.read(&object(line)).expect("reads");
        assert!(l.recorded.holds(Attribute::Header("x-forwarded-for")));
        assert_eq!(Request::header(&l.request, "x-forwarded-for"), None);
        assert!(l.recorded.holds(Attribute::Authority));
        assert!(!l.recorded.holds(Attribute::Header("user-agent")));
        assert!(!l.recorded.holds(Attribute::SourceAddress));
    }

    #[test]
    fn bad_mappings_and_lines_say_what_is_wrong() {
        assert_eq!(
            Mapping::parse(&["when=ts".into()]).unwrap_err().to_string(),
            "--field \"when=ts\": unknown target \"when\" (expected time, time_ms, method, path, authority, source, duration_ms, tokens or header:NAME)"
        );
        assert_eq!(
            Mapping::parse(&["path".into()]).unwrap_err().to_string(),
            "--field \"path\": expected TARGET=FIELD"
        );
        let mapping = Mapping::parse(&["path=uri".into()]).expect("valid");
        assert_eq!(
            mapping.read(&object(r#"{"uri": "/"}"#)).unwrap_err().to_string(),
            "no time: map the field that holds it with --field time=FIELD (RFC 3339) or time_ms=FIELD"
        );
        assert_eq!(
            Mapping::istio()
                .read(&object(r#"{"start_time": "2026-11-23T10:00:00Z"}"#))
                .unwrap_err()
                .to_string(),
            "no path: the line has no path"
        );
        assert_eq!(
            Mapping::istio().read(&object(r#"{"start_time": 5, "path": "/"}"#)).unwrap_err().to_string(),
            "time \"5\": timestamp format is invalid"
        );
        let with_key = Mapping::istio().with(&Mapping::parse(&["path=uri".into()]).expect("valid"));
        assert!(with_key.read(&object(r#"{"start_time": "2026-11-23T10:00:00Z", "uri": "/"}"#)).is_ok());
    }
}
