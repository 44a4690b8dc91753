//! The request's body as policies read it: fields of a JSON body by JSON
//! pointer (RFC 6901), for `body:POINTER` key sources, `body` conditions and
//! a token budget's reservation (`max_tokens`, the prompt's size).
//!
//! A body is read only for a document that asks for one (a policy with an
//! `llm`, a `body:` key or a `body` condition), buffered up to the
//! document's `max_request_body_bytes`, and parsed once. A body that is not JSON has
//! no fields; its length still counts.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer};
use serde_json::Value;

/// The longest JSON pointer a document may name.
pub const MAX_POINTER_LEN: usize = 256;

/// A JSON pointer into a body: `""` (the whole body) or `/a/b/0`, with `~0`
/// for `~` and `~1` for `/` inside a segment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pointer(String);

impl Pointer {
    /// `text` if it is a pointer of at most [`MAX_POINTER_LEN`] bytes with
    /// well-formed escapes.
    pub fn new(text: &str) -> Option<Pointer> {
        let valid = text.len() <= MAX_POINTER_LEN
            && (text.is_empty() || text.starts_with('/'))
            && text.split('~').skip(1).all(|rest| rest.starts_with(['0', '1']));
        valid.then(|| Pointer(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its segments, unescaped: `/a~1b/0` is `["a/b", "0"]`.
    pub fn segments(&self) -> impl Iterator<Item = String> + '_ {
        self.0.split('/').skip(1).map(|s| s.replace("~1", "/").replace("~0", "~"))
    }
}

impl fmt::Display for Pointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Pointer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Pointer::new(&text).ok_or_else(|| {
            de::Error::custom(format!(
                "invalid JSON pointer {text:?} (expected e.g. \"/usage/total_tokens\", at most {MAX_POINTER_LEN} bytes)"
            ))
        })
    }
}

/// A request body, read whole: its length and, if it is JSON, its value.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Body {
    /// Its length in bytes.
    pub len: u64,
    /// Its value; `None` when it is not JSON (or empty).
    pub json: Option<Value>,
}

impl Body {
    /// The body of these bytes.
    pub fn parse(bytes: &[u8]) -> Body {
        Body { len: bytes.len() as u64, json: serde_json::from_slice(bytes).ok() }
    }

    /// The field at `pointer` as a key or a condition reads it: a string's
    /// text, a number's or a boolean's JSON text; `None` for a missing
    /// field, `null`, an object or an array.
    pub fn field(&self, pointer: &Pointer) -> Option<Cow<'_, [u8]>> {
        match self.json.as_ref()?.pointer(pointer.as_str())? {
            Value::String(s) => Some(Cow::Borrowed(s.as_bytes())),
            Value::Number(n) => Some(Cow::Owned(n.to_string().into_bytes())),
            Value::Bool(b) => Some(Cow::Borrowed(if *b { b"true" } else { b"false" })),
            Value::Null | Value::Array(_) | Value::Object(_) => None,
        }
    }

    /// The field at `pointer` as a whole number of 0 or more; `None` for
    /// anything else (missing, negative, fractional, not a number).
    pub fn count(&self, pointer: &str) -> Option<u64> {
        self.json.as_ref()?.pointer(pointer)?.as_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointer(text: &str) -> Pointer {
        Pointer::new(text).expect("a valid pointer")
    }

    #[test]
    fn pointers_are_checked_and_unescaped() {
        assert_eq!(pointer("/a~1b/~0c/0").segments().collect::<Vec<_>>(), ["a/b", "~c", "0"]);
        assert_eq!(pointer("").segments().count(), 0);
        for bad in ["model", "/a~2", "/a~", &format!("/{}", "a".repeat(MAX_POINTER_LEN))] {
            assert_eq!(Pointer::new(bad), None, "{bad:?} should be refused");
        }
    }

    #[test]
    fn fields_read_as_keys_read_them() {
        let body = Body::parse(br#"{"model": "gpt-4o", "n": 2, "stream": true, "x": null, "m": [1]}"#);
        assert_eq!(body.field(&pointer("/model")).as_deref(), Some(&b"gpt-4o"[..]));
        assert_eq!(body.field(&pointer("/n")).as_deref(), Some(&b"2"[..]));
        assert_eq!(body.field(&pointer("/stream")).as_deref(), Some(&b"true"[..]));
        assert_eq!(body.field(&pointer("/x")), None);
        assert_eq!(body.field(&pointer("/m")), None);
        assert_eq!(body.field(&pointer("/missing")), None);
        assert_eq!(body.count("/n"), Some(2));
        assert_eq!(body.count("/model"), None);
    }

    #[test]
    fn a_body_that_is_not_json_has_a_length_and_no_fields() {
        let body = Body::parse(b"not json");
        assert_eq!(body.len, 8);
        assert_eq!(body.field(&pointer("/model")), None);
        assert_eq!(Body::parse(br#"{"max_tokens": -5}"#).count("/max_tokens"), None);
        assert_eq!(Body::parse(br#"{"max_tokens": 1.5}"#).count("/max_tokens"), None);
    }
}
