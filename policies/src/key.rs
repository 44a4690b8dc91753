//! Keys: where a policy's bucket key comes from, and how a user-supplied value
//! becomes safe to put into a Redis key name.
//!
//! Each source's value is percent-encoded: bytes outside `A-Z a-z 0-9 . _ ~ -`
//! become `%XX`. An encoded value longer than [`MAX_PART_LEN`] is replaced by
//! `=` and the first 128 bits of its SHA-256, in hex. A missing source is
//! [`MISSING`]. Parts are joined with `:`. Neither `=`, `!` nor `:` can come
//! out of the encoding, so distinct inputs give distinct keys, and `{`, `}`
//! never reach a key name where they could move the Redis Cluster slot.
//!
//! A request that lacks a key source is counted in one shared bucket (the
//! [`MISSING`] marker), so leaving a header out cannot escape a limit.

use std::fmt::Write;

use serde::de::{self, Deserialize, Deserializer};
use sha2::{Digest, Sha256};

use crate::Request;

/// The longest encoded value kept as it is; longer ones are hashed.
pub const MAX_PART_LEN: usize = 256;
/// The encoded part of a key source the request does not have.
pub const MISSING: &str = "!";

/// Where one part of a key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `header:NAME`: a request header, by lower-case name.
    Header(String),
}

impl KeySource {
    pub fn parse(text: &str) -> Option<KeySource> {
        let name = text.strip_prefix("header:")?;
        let valid_char = |b: u8| b.is_ascii_alphanumeric() || b"-_.".contains(&b);
        let body = name.strip_prefix(':').unwrap_or(name);
        let valid = !body.is_empty() && body.len() <= 128 && body.bytes().all(valid_char);
        valid.then(|| KeySource::Header(name.to_ascii_lowercase()))
    }
}

impl<'de> Deserialize<'de> for KeySource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        KeySource::parse(&text).ok_or_else(|| {
            de::Error::custom(format!("invalid key source {text:?} (expected \"header:NAME\")"))
        })
    }
}

/// Builds the encoded key of `req` from `sources`.
pub fn build(sources: &[KeySource], req: &impl Request) -> String {
    let mut key = String::new();
    for (i, source) in sources.iter().enumerate() {
        if i > 0 {
            key.push(':');
        }
        let value = match source {
            KeySource::Header(name) => req.header(name),
        };
        match value {
            Some(value) => encode_into(&mut key, &value),
            None => key.push_str(MISSING),
        }
    }
    key
}

/// Encodes one user-supplied value.
pub fn encode(value: &[u8]) -> String {
    let mut out = String::new();
    encode_into(&mut out, value);
    out
}

fn encode_into(out: &mut String, value: &[u8]) {
    let start = out.len();
    for &b in value {
        if b.is_ascii_alphanumeric() || b"._~-".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
        if out.len() - start > MAX_PART_LEN {
            out.truncate(start);
            out.push('=');
            for byte in &Sha256::digest(value)[..16] {
                let _ = write!(out, "{byte:02x}");
            }
            return;
        }
    }
}

/// Whether `key` could have come out of [`build`]: the shim refuses any other.
pub fn is_encoded(key: &str) -> bool {
    key.len() <= 8 * 1024 && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"._~-%=!:".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Headers(HashMap<&'static str, Vec<u8>>);

    impl Request for Headers {
        fn path(&self) -> &[u8] {
            b"/"
        }
        fn method(&self) -> &[u8] {
            b"GET"
        }
        fn header(&self, name: &str) -> Option<Vec<u8>> {
            self.0.get(name).cloned()
        }
    }

    #[test]
    fn plain_values_are_kept_readable() {
        assert_eq!(encode(b"alice-01_x.y~z"), "alice-01_x.y~z");
    }

    #[test]
    fn key_syntax_is_escaped() {
        assert_eq!(encode(b"a{b}:c d%"), "a%7Bb%7D%3Ac%20d%25");
        assert_eq!(encode(&[0xff, 0x00]), "%FF%00");
        assert!(!encode(b"{}:!=").contains(['{', '}', ':', '!', '=']));
    }

    #[test]
    fn long_values_are_hashed_and_stay_distinct() {
        let long_a = encode(&[b'a'; 300]);
        let long_b = encode(&[b'b'; 300]);
        assert!(long_a.starts_with('=') && long_a.len() == 33, "{long_a}");
        assert_ne!(long_a, long_b);
        assert_eq!(encode(&[b'a'; MAX_PART_LEN]).len(), MAX_PART_LEN);
        // 100 bytes that each need escaping are 300 encoded bytes: hashed.
        assert!(encode(&[b'{'; 100]).starts_with('='));
    }

    #[test]
    fn missing_sources_share_one_marker_distinct_from_any_value() {
        let sources = [KeySource::Header("x-a".into()), KeySource::Header("x-b".into())];
        let req = Headers(HashMap::from([("x-a", b"k".to_vec())]));
        assert_eq!(build(&sources, &req), "k:!");
        let empty = Headers(HashMap::from([("x-a", b"k".to_vec()), ("x-b", b"".to_vec())]));
        assert_eq!(build(&sources, &empty), "k:");
        assert_eq!(build(&[], &req), "");
    }

    #[test]
    fn separators_inside_values_cannot_forge_another_key() {
        let sources = [KeySource::Header("x-a".into()), KeySource::Header("x-b".into())];
        let one = Headers(HashMap::from([("x-a", b"a:b".to_vec()), ("x-b", b"c".to_vec())]));
        let two = Headers(HashMap::from([("x-a", b"a".to_vec()), ("x-b", b"b:c".to_vec())]));
        assert_ne!(build(&sources, &one), build(&sources, &two));
    }

    #[test]
    fn encoded_keys_pass_the_shim_check_and_raw_syntax_does_not() {
        assert!(is_encoded(&encode(b"{evil}:key")));
        assert!(is_encoded("k:!"));
        assert!(!is_encoded("a{b}"));
        assert!(!is_encoded("a b"));
    }

    #[test]
    fn key_sources_parse() {
        assert_eq!(KeySource::parse("header:X-Api-Key"), Some(KeySource::Header("x-api-key".into())));
        assert_eq!(KeySource::parse("header::authority"), Some(KeySource::Header(":authority".into())));
        for bad in ["header:", "header:a b", "cookie:x", "x-api-key"] {
            assert_eq!(KeySource::parse(bad), None, "{bad:?} should be refused");
        }
    }
}
