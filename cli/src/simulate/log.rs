//! Reading one access log line, whatever its shape (see [`shapes`](super::shapes)).
//!
//! Envoy's default format (`[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%
//! %PROTOCOL%" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% ...
//! "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" ...`)
//! carries the method, path, duration, `x-forwarded-for`, `user-agent`,
//! `x-request-id` and authority, and no peer address: a key on anything
//! else is not recorded. Sluice's own JSON line carries whatever the
//! operator logged:
//!
//! ```json
//! {"time": "2026-11-23T10:00:00.250Z", "method": "GET", "path": "/v42/x",
//!  "authority": "api", "headers": {"x-account": "acme"}, "source": "10.0.0.7:5521",
//!  "duration_ms": 120, "tokens": 1250}
//! ```
//!
//! `tokens`, if given, is the request's LLM token count (its usage, weighed
//! as its policy's `llm` charges it): what a token budget charges it.
//!
//! `time` may also be `time_ms`, milliseconds since the epoch. A field it
//! leaves out is not recorded (no `headers`: no header is); a header
//! missing from `headers` was missing from the request. A request that came
//! through a gRPC face has a `domain` and its RLS descriptor's `entries` or
//! its RLQS `bucket` id (each an object of strings): only that face's
//! policies see it. Istio's, Envoy
//! Gateway's and mapped JSON lines are read by [`Mapping`].

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};
use sluice_policies::replay::{Recorded, RecordedHeaders, Replayed as Logged};
use sluice_policies::request::SimpleRequest;

use super::fields::Mapping;
use super::shapes::Shape;
use super::time::rfc3339_us;
use super::unreadable::{BadLine, Unreadable};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonLine {
    time: Option<String>,
    time_ms: Option<u64>,
    #[serde(default = "get")]
    method: String,
    path: String,
    authority: Option<String>,
    headers: Option<BTreeMap<String, String>>,
    source: Option<String>,
    #[serde(default)]
    duration_ms: u64,
    /// A gRPC face's request: its domain, and an RLS descriptor's `entries`
    /// or an RLQS `bucket` id.
    domain: Option<String>,
    entries: Option<BTreeMap<String, String>>,
    bucket: Option<BTreeMap<String, String>>,
    /// The request's LLM token count, as its policy's `llm` charges it.
    tokens: Option<u64>,
}

fn get() -> String {
    "GET".into()
}

/// Reads lines of every shape; one per run, with the run's `--field` mapping.
pub(crate) struct Reader {
    istio: Mapping,
    envoy_gateway: Mapping,
    /// `--field`, if given.
    mapped: Option<Mapping>,
}

impl Reader {
    pub(crate) fn new(fields: Mapping) -> Reader {
        Reader {
            istio: Mapping::istio().with(&fields),
            envoy_gateway: Mapping::envoy_gateway().with(&fields),
            mapped: (!fields.is_empty()).then_some(fields),
        }
    }

    /// Reads one line; `line` numbers from 1 for the message.
    pub(crate) fn read(&self, text: &str, line: usize) -> Result<(Shape, Logged), BadLine> {
        let text = text.trim();
        let read = if text.starts_with('{') {
            self.json(text)
        } else {
            envoy(text).map(|logged| (Shape::EnvoyText, logged))
        };
        read.map_err(|reason| BadLine { line, reason })
    }

    fn json(&self, text: &str) -> Result<(Shape, Logged), Unreadable> {
        let object: Map<String, Value> = serde_json::from_str(text)?;
        let shape = Shape::of_json(&object, self.mapped.is_some());
        let read = match (shape, &self.mapped) {
            (Shape::Istio, _) => self.istio.read(&object),
            (Shape::EnvoyGateway, _) => self.envoy_gateway.read(&object),
            (Shape::Mapped, Some(mapping)) => mapping.read(&object),
            _ => sluice(object),
        };
        read.map(|logged| (shape, logged))
            .map_err(|e| Unreadable::new(format!("{e} (read as {})", shape.name())))
    }
}

fn sluice(object: Map<String, Value>) -> Result<Logged, Unreadable> {
    let l = JsonLine::deserialize(Value::Object(object))?;
    let at_us = match (l.time, l.time_ms) {
        (Some(time), _) => rfc3339_us(&time)?,
        (None, Some(ms)) => ms.saturating_mul(1000),
        (None, None) => return Err("no time or time_ms".into()),
    };
    let recorded = Recorded {
        source_address: l.source.is_some(),
        authority: l.authority.is_some(),
        headers: match l.headers {
            Some(_) => RecordedHeaders::All,
            None => RecordedHeaders::Only(Vec::new()),
        },
        grpc: l.domain.is_some(),
    };
    let mut request = SimpleRequest::new(&l.method, &l.path).authority(l.authority.as_deref().unwrap_or(""));
    match (&l.domain, &l.entries, &l.bucket) {
        (_, Some(_), Some(_)) => return Err("give `entries` (RLS) or `bucket` (RLQS), not both".into()),
        (None, Some(_), _) | (None, _, Some(_)) => {
            return Err("`entries` and `bucket` need a `domain`".into())
        }
        (Some(domain), entries, bucket) => {
            request = request.domain(domain);
            for (key, value) in entries.iter().flatten() {
                request = request.entry(key, value);
            }
            for (key, value) in bucket.iter().flatten() {
                request = request.bucket(key, value);
            }
        }
        (None, None, None) => {}
    }
    for (name, value) in l.headers.iter().flatten() {
        request = request.header(name, value);
    }
    if let Some(source) = &l.source {
        request = request.source(source);
    }
    Ok(Logged { at_us, request, duration_ms: l.duration_ms, tokens: l.tokens, recorded })
}

/// Envoy's default format, read field by field: `[time] "METHOD PATH PROTO"
/// code flags rx tx duration upstream_time "xff" "ua" "id" "authority" "host"`.
fn envoy(text: &str) -> Result<Logged, Unreadable> {
    let rest = text.strip_prefix('[').ok_or("expected [START_TIME] or a JSON object")?;
    let (time, rest) = rest.split_once(']').ok_or("no ] after the start time")?;
    let at_us = rfc3339_us(time)?;
    let (request_line, rest) = quoted(rest.trim_start())?;
    let mut parts = request_line.split(' ');
    let (method, path) = match (parts.next(), parts.next()) {
        (Some(method), Some(path)) => (method, path),
        _ => {
            return Err(Unreadable::new(format!("request {request_line:?} is not \"METHOD PATH PROTOCOL\"")))
        }
    };
    let mut fields = rest.split_whitespace();
    let duration_ms = fields.nth(4).and_then(|d| d.parse().ok()).unwrap_or(0);
    // The quoted fields follow the upstream service time.
    let mut quoted_fields = Vec::new();
    let mut rest = rest;
    while let Some(start) = rest.find('"') {
        let (value, after) = quoted(&rest[start..])?;
        quoted_fields.push(value);
        rest = after;
    }
    let field = |i: usize| quoted_fields.get(i).copied().filter(|v| *v != "-");
    let mut request = SimpleRequest::new(method, path);
    if let Some(authority) = field(3) {
        request = request.authority(authority);
    }
    for (i, name) in [(0, "x-forwarded-for"), (1, "user-agent"), (2, "x-request-id")] {
        if let Some(value) = field(i) {
            request = request.header(name, value);
        }
    }
    Ok(Logged { at_us, request, duration_ms, tokens: None, recorded: envoy_text_records() })
}

/// What Envoy's default format records: no peer address, three headers.
fn envoy_text_records() -> Recorded {
    let headers = ["x-forwarded-for", "user-agent", "x-request-id"].map(String::from).to_vec();
    Recorded { source_address: false, authority: true, headers: RecordedHeaders::Only(headers), grpc: false }
}

/// `"value"rest` → (value, rest).
fn quoted(text: &str) -> Result<(&str, &str), Unreadable> {
    let inner = text
        .strip_prefix('"')
        .ok_or_else(|| Unreadable::new(format!("expected a quoted field at {text:?}")))?;
    let end = inner.find('"').ok_or("an unclosed quote")?;
    Ok((&inner[..end], &inner[end + 1..]))
}

#[cfg(test)]
mod tests {
    use sluice_policies::Request;

    use super::*;

    fn parse_line(text: &str, line: usize) -> Result<Logged, BadLine> {
        Reader::new(Mapping::default()).read(text, line).map(|(_, logged)| logged)
    }

    #[test]
    fn envoy_default_format() {
        let line = r#"[2016-04-15T20:17:00.310Z] "POST /api/v1/locations HTTP/2" 204 - 154 0 226 100 "10.0.35.28" "nsq2http" "cc21d9b0-cf5c-432b-8c7e-98aeb7988cd2" "locations" "tcp://10.0.2.1:80""#;
        let l = parse_line(line, 1).expect("parses");
        assert_eq!(l.at_us, 1_460_751_420_310_000);
        assert_eq!(l.request.method(), b"POST");
        assert_eq!(l.request.path(), b"/api/v1/locations");
        assert_eq!(Request::authority(&l.request), b"locations");
        assert_eq!(Request::header(&l.request, "x-forwarded-for").as_deref(), Some(&b"10.0.35.28"[..]));
        assert_eq!(l.duration_ms, 226);
    }

    #[test]
    fn json_lines() {
        let line = r#"{"time_ms": 1000, "method": "PUT", "path": "/v42/x", "headers": {"X-Account": "acme"}, "duration_ms": 5}"#;
        let l = parse_line(line, 1).expect("parses");
        assert_eq!(l.at_us, 1_000_000);
        assert_eq!(Request::header(&l.request, "x-account").as_deref(), Some(&b"acme"[..]));
        assert_eq!(l.duration_ms, 5);
    }

    #[test]
    fn bad_lines_say_which_and_why() {
        let bad = |text: &str, line| parse_line(text, line).unwrap_err().to_string();
        assert_eq!(bad("hello", 7), "line 7: expected [START_TIME] or a JSON object");
        assert!(bad(r#"{"path": "/"}"#, 2).starts_with("line 2: no time"));
        assert!(bad(r#"[yesterday] "GET / HTTP/1.1""#, 3).starts_with("line 3: time"));
    }
}
