//! Keys: where a policy's bucket key comes from, and how a user-supplied value
//! becomes safe to put into a Redis key name.
//!
//! Each source's value is percent-encoded: bytes outside `A-Z a-z 0-9 . _ ~ -`
//! become `%XX`. An encoded value longer than [`MAX_PART_LEN`] is replaced by
//! `=` and the first 128 bits of its SHA-256, in hex. Parts are joined with
//! `:`. Neither `=`, `!` nor `:` can come out of the encoding, so distinct
//! inputs give distinct keys, and `{`, `}` never reach a key name where they
//! could move the Redis Cluster slot.
//!
//! When a source is missing, the policy's [`OnMissingKey`] decides.

use std::borrow::Cow;
use std::fmt::Write;
use std::net::{IpAddr, SocketAddr};

use serde::de::{self, Deserialize, Deserializer};
use sha2::{Digest, Sha256};

use crate::body::Pointer;
use crate::request::{host_only, path_only, query_param, Attribute};
use crate::{HeaderName, Request};

/// The longest encoded value kept as it is; longer ones are hashed.
pub const MAX_PART_LEN: usize = 256;
/// The most key sources one policy may have.
pub const MAX_KEY_SOURCES: usize = 8;
/// The longest encoded key: every source at its longest, joined by `:`.
pub const MAX_KEY_LEN: usize = MAX_KEY_SOURCES * (MAX_PART_LEN + 1);
/// The key of the one bucket shared by requests that lack a key source.
pub const MISSING: &str = "!";

/// Where one part of a key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `header:NAME`: a request header.
    Header(HeaderName),
    /// `ip`: the client address; see [`ClientIp`].
    Ip,
    /// `path`: the path, without the query string.
    Path,
    /// `method`.
    Method,
    /// `host`: the `:authority`, without a port, in lower case.
    Host,
    /// `query:NAME`: the first value of a query parameter, form-decoded.
    Query(String),
    /// `entry:NAME`: an RLS descriptor's entry, by key; only in an
    /// RLS-face policy.
    Entry(String),
    /// `bucket:NAME`: an RLQS bucket id's value, by key; only in an
    /// RLQS-face policy.
    Bucket(String),
    /// `body:POINTER`: a field of the request's JSON body (`body:/model`);
    /// the document then reads request bodies.
    Body(Pointer),
}

/// The longest name of a `query:`, `entry:` or `bucket:` key source.
pub const MAX_SOURCE_NAME_LEN: usize = 128;

impl KeySource {
    pub fn parse(text: &str) -> Option<KeySource> {
        match text {
            "ip" => return Some(KeySource::Ip),
            "path" => return Some(KeySource::Path),
            "method" => return Some(KeySource::Method),
            "host" => return Some(KeySource::Host),
            _ => {}
        }
        if let Some(name) = text.strip_prefix("header:") {
            return HeaderName::new(name).map(KeySource::Header);
        }
        let named = |name: &str| !name.is_empty() && name.len() <= MAX_SOURCE_NAME_LEN;
        if let Some(name) = text.strip_prefix("entry:") {
            return named(name).then(|| KeySource::Entry(name.to_string()));
        }
        if let Some(name) = text.strip_prefix("bucket:") {
            return named(name).then(|| KeySource::Bucket(name.to_string()));
        }
        if let Some(pointer) = text.strip_prefix("body:") {
            return Pointer::new(pointer).filter(|p| !p.as_str().is_empty()).map(KeySource::Body);
        }
        let name = text.strip_prefix("query:")?;
        named(name).then(|| KeySource::Query(name.to_string()))
    }

    /// What this source reads from a request (`ip` as `ip` finds the client).
    pub fn reads(&self, ip: ClientIp) -> Attribute<'_> {
        match self {
            KeySource::Header(name) => Attribute::Header(name.as_str()),
            KeySource::Ip => ip.reads(),
            KeySource::Path | KeySource::Query(_) => Attribute::Path,
            KeySource::Method => Attribute::Method,
            KeySource::Host => Attribute::Authority,
            KeySource::Entry(name) => Attribute::Entry(name),
            KeySource::Bucket(name) => Attribute::Bucket(name),
            KeySource::Body(pointer) => Attribute::Body(pointer.as_str()),
        }
    }

    /// This source's raw value in `req`, if it has one.
    pub fn value<'r>(&self, req: &'r impl Request, ip: ClientIp) -> Option<Cow<'r, [u8]>> {
        match self {
            KeySource::Header(name) => req.header(name.as_str()),
            KeySource::Ip => ip.of(req).map(|ip| Cow::Owned(ip.to_string().into_bytes())),
            KeySource::Path => Some(Cow::Borrowed(path_only(req.path()))).filter(|p| !p.is_empty()),
            KeySource::Method => Some(Cow::Borrowed(req.method())).filter(|m| !m.is_empty()),
            KeySource::Host => {
                let host = host_only(req.authority());
                (!host.is_empty()).then(|| Cow::Owned(host.to_ascii_lowercase()))
            }
            KeySource::Query(name) => query_param(req.path(), name).map(|v| match v {
                Cow::Borrowed(v) => Cow::Borrowed(v.as_bytes()),
                Cow::Owned(v) => Cow::Owned(v.into_bytes()),
            }),
            KeySource::Entry(name) => req.entry(name),
            KeySource::Bucket(name) => req.bucket(name),
            KeySource::Body(pointer) => req.body()?.field(pointer),
        }
    }
}

/// The source as a document writes it: `ip`, `header:x-api-key`.
impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::Header(name) => write!(f, "header:{}", name.as_str()),
            KeySource::Ip => f.write_str("ip"),
            KeySource::Path => f.write_str("path"),
            KeySource::Method => f.write_str("method"),
            KeySource::Host => f.write_str("host"),
            KeySource::Query(name) => write!(f, "query:{name}"),
            KeySource::Entry(name) => write!(f, "entry:{name}"),
            KeySource::Bucket(name) => write!(f, "bucket:{name}"),
            KeySource::Body(pointer) => write!(f, "body:{pointer}"),
        }
    }
}

impl<'de> Deserialize<'de> for KeySource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        KeySource::parse(&text).ok_or_else(|| {
            de::Error::custom(format!(
                "invalid key source {text:?} (expected \"header:NAME\", \"ip\", \"path\", \"method\", \"host\", \"query:NAME\", \"entry:NAME\", \"bucket:NAME\" or \"body:/POINTER\")"
            ))
        })
    }
}

/// What a policy does with a request that lacks one of its key sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnMissingKey {
    /// Count it in one bucket shared by all such requests, so leaving a header
    /// out cannot escape the limit, and nobody is refused for it.
    #[default]
    Shared,
    /// Refuse it: 400, without asking the shim.
    Deny,
    /// The policy does not apply to it.
    Skip,
}

/// How the client address is found: `trusted_hops` 0 takes the proxy's
/// downstream peer address (`source.address`); N > 0 takes the Nth address
/// from the right of `x-forwarded-for`, the one your N trusted proxies saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientIp {
    pub trusted_hops: u8,
}

impl ClientIp {
    /// Where the address is read: the peer address, or `x-forwarded-for`.
    pub fn reads(self) -> Attribute<'static> {
        match self.trusted_hops {
            0 => Attribute::SourceAddress,
            _ => Attribute::Header("x-forwarded-for"),
        }
    }

    pub fn of(self, req: &impl Request) -> Option<IpAddr> {
        if self.trusted_hops == 0 {
            let addr = req.source_address()?;
            let addr = std::str::from_utf8(&addr).ok()?;
            return addr.parse::<SocketAddr>().map(|a| a.ip()).or_else(|_| addr.parse::<IpAddr>()).ok();
        }
        let xff = req.header("x-forwarded-for")?;
        let xff = std::str::from_utf8(&xff).ok()?;
        let entry = xff.rsplit(',').nth(usize::from(self.trusted_hops) - 1)?.trim();
        entry.parse::<IpAddr>().or_else(|_| entry.parse::<SocketAddr>().map(|a| a.ip())).ok()
    }
}

/// Builds the encoded key of `req` from `sources`; `None` when a source is missing.
pub fn build(sources: &[KeySource], req: &impl Request, ip: ClientIp) -> Option<String> {
    // Most keys fit, so building one allocates once.
    let mut key = String::with_capacity(64);
    for (i, source) in sources.iter().enumerate() {
        if i > 0 {
            key.push(':');
        }
        encode_into(&mut key, &source.value(req, ip)?);
    }
    Some(key)
}

/// Encodes one user-supplied value.
pub fn encode(value: &[u8]) -> String {
    let mut out = String::new();
    encode_into(&mut out, value);
    out
}

fn encode_into(out: &mut String, value: &[u8]) {
    // Most values need no escape and are short: copied whole, as the loop
    // below would copy them byte by byte (a tenth of its wasm operators).
    if value.len() <= MAX_PART_LEN && value.iter().all(|&b| unreserved(b)) {
        if let Ok(text) = std::str::from_utf8(value) {
            out.push_str(text);
            return;
        }
    }
    let start = out.len();
    for &b in value {
        if unreserved(b) {
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

/// A byte a key keeps as it is: `A-Z a-z 0-9 . _ ~ -`.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._~-".contains(&b)
}

/// An encoded key as people wrote its parts, for reports: each `:`-joined
/// part percent-decoded (a hashed part stays `=<hex>`), control characters
/// escaped; [`MISSING`] is `(shared: missing key)` and the key of
/// `"key": []` is `(one bucket)`. Not an identity: two keys may show alike.
pub fn display(key: &str) -> String {
    match key {
        MISSING => return "(shared: missing key)".to_string(),
        "" => return "(one bucket)".to_string(),
        _ => {}
    }
    let mut bytes = Vec::with_capacity(key.len());
    let mut rest = key.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        let hex = |i: usize| tail.get(i).and_then(|c| (*c as char).to_digit(16));
        match (b, hex(0), hex(1)) {
            (b'%', Some(hi), Some(lo)) => {
                bytes.push((hi * 16 + lo) as u8);
                rest = &tail[2..];
            }
            _ => {
                bytes.push(b);
                rest = tail;
            }
        }
    }
    let mut shown = String::with_capacity(bytes.len());
    for c in String::from_utf8_lossy(&bytes).chars() {
        // A key never moves the cursor of the terminal it is printed on.
        if c.is_control() {
            shown.extend(c.escape_debug());
        } else {
            shown.push(c);
        }
    }
    shown
}

/// Whether `key` could have come out of [`build`] or be [`MISSING`]: the shim
/// refuses any other.
pub fn is_encoded(key: &str) -> bool {
    key.len() <= MAX_KEY_LEN && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"._~-%=!:".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::SimpleRequest;

    fn header(name: &str) -> KeySource {
        KeySource::Header(HeaderName::new(name).expect("valid name"))
    }

    fn headers(pairs: &[(&str, &[u8])]) -> SimpleRequest {
        pairs.iter().fold(SimpleRequest::new("GET", "/"), |req, (k, v)| req.header(k, v))
    }

    const DIRECT: ClientIp = ClientIp { trusted_hops: 0 };

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
    fn a_missing_source_gives_no_key_and_an_empty_value_does() {
        let sources = [header("x-a"), header("x-b")];
        assert_eq!(build(&sources, &headers(&[("x-a", b"k")]), DIRECT), None);
        assert_eq!(build(&sources, &headers(&[("x-a", b"k"), ("x-b", b"")]), DIRECT).as_deref(), Some("k:"));
        assert_eq!(build(&[], &headers(&[]), DIRECT).as_deref(), Some(""));
    }

    #[test]
    fn separators_inside_values_cannot_forge_another_key() {
        let sources = [header("x-a"), header("x-b")];
        let one = build(&sources, &headers(&[("x-a", b"a:b"), ("x-b", b"c")]), DIRECT);
        let two = build(&sources, &headers(&[("x-a", b"a"), ("x-b", b"b:c")]), DIRECT);
        assert_ne!(one, two);
    }

    #[test]
    fn encoded_keys_pass_the_shim_check_and_raw_syntax_does_not() {
        assert!(is_encoded(&encode(b"{evil}:key")));
        assert!(is_encoded(MISSING));
        assert!(!is_encoded("a{b}"));
        assert!(!is_encoded("a b"));
    }

    #[test]
    fn every_source_reads_its_part_of_the_request() {
        let req = SimpleRequest::new("GET", "/v1/orders?page=2&user=bob%20s")
            .authority("API.example.com:443")
            .source("10.1.2.3:5555");
        let key = |src: &str| build(&[KeySource::parse(src).expect("valid source")], &req, DIRECT);
        assert_eq!(key("path").as_deref(), Some("%2Fv1%2Forders"));
        assert_eq!(key("method").as_deref(), Some("GET"));
        assert_eq!(key("host").as_deref(), Some("api.example.com"));
        assert_eq!(key("query:user").as_deref(), Some("bob%20s"));
        assert_eq!(key("query:none"), None);
        assert_eq!(key("ip").as_deref(), Some("10.1.2.3"));
        assert_eq!(key("body:/model"), None, "no body read");
        let req = req.body(r#"{"model": "gpt-4o mini", "n": 2}"#);
        let key = |src: &str| build(&[KeySource::parse(src).expect("valid source")], &req, DIRECT);
        assert_eq!(key("body:/model").as_deref(), Some("gpt-4o%20mini"));
        assert_eq!(key("body:/n").as_deref(), Some("2"));
        assert_eq!(key("body:/none"), None);
    }

    #[test]
    fn client_ip_comes_from_the_peer_or_trusted_forwarded_for() {
        let req =
            headers(&[("x-forwarded-for", b"203.0.113.9, 198.51.100.7 , 10.0.0.1")]).source("[::1]:4000");
        let ip = |hops| ClientIp { trusted_hops: hops }.of(&req).map(|ip| ip.to_string());
        assert_eq!(ip(0).as_deref(), Some("::1"));
        assert_eq!(ip(1).as_deref(), Some("10.0.0.1"));
        assert_eq!(ip(2).as_deref(), Some("198.51.100.7"));
        assert_eq!(ip(3).as_deref(), Some("203.0.113.9"));
        assert_eq!(ip(4), None, "fewer entries than trusted hops");
        let spoofed = headers(&[("x-forwarded-for", b"not-an-ip")]);
        assert_eq!(ClientIp { trusted_hops: 1 }.of(&spoofed), None);
    }

    #[test]
    fn keys_display_as_written_part_by_part() {
        let sources = [header("x-a"), header("x-b")];
        let key = build(&sources, &headers(&[("x-a", b"ann smith"), ("x-b", b"a:b/c\n")]), DIRECT);
        assert_eq!(key.as_deref(), Some("ann%20smith:a%3Ab%2Fc%0A"));
        assert_eq!(display(&key.unwrap_or_default()), "ann smith:a:b/c\\n");
        assert_eq!(display("caf%C3%A9"), "café");
        assert_eq!(display(MISSING), "(shared: missing key)");
        assert_eq!(display(""), "(one bucket)");
        let hashed = encode(&[b'a'; 300]);
        assert_eq!(display(&hashed), hashed, "a hashed part stays as it is");
    }

    #[test]
    fn sources_name_what_they_read_and_show_as_written() {
        let ip = |hops| KeySource::Ip.reads(ClientIp { trusted_hops: hops });
        assert_eq!(ip(0), Attribute::SourceAddress);
        assert_eq!(ip(2), Attribute::Header("x-forwarded-for"));
        assert_eq!(header("X-Api-Key").reads(DIRECT), Attribute::Header("x-api-key"));
        assert_eq!(KeySource::Query("p".into()).reads(DIRECT), Attribute::Path);
        for text in ["ip", "header:x-api-key", "path", "method", "host", "query:page", "body:/model"] {
            assert_eq!(KeySource::parse(text).map(|s| s.to_string()).as_deref(), Some(text));
        }
    }

    #[test]
    fn key_sources_parse() {
        assert_eq!(KeySource::parse("header:X-Api-Key"), Some(header("x-api-key")));
        assert_eq!(KeySource::parse("query:page"), Some(KeySource::Query("page".into())));
        assert_eq!(KeySource::parse("ip"), Some(KeySource::Ip));
        for bad in ["header:", "header:a b", "cookie:x", "x-api-key", "query:", "IP", "body:", "body:model"] {
            assert_eq!(KeySource::parse(bad), None, "{bad:?} should be refused");
        }
    }

    /// The encoding byte by byte, as it was before values needing no
    /// escape were copied whole.
    fn encode_bytewise(value: &[u8]) -> String {
        let mut out = String::new();
        for &b in value {
            if unreserved(b) {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
            if out.len() > MAX_PART_LEN {
                out.clear();
                out.push('=');
                for byte in &Sha256::digest(value)[..16] {
                    out.push_str(&format!("{byte:02x}"));
                }
                break;
            }
        }
        out
    }

    use proptest::prelude::*;

    proptest! {
        /// A value copied whole encodes as the byte-by-byte loop does: short
        /// or long (hashed), escaped or not.
        #[test]
        fn encoding_is_the_bytewise_one(
            value in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..300),
                "[A-Za-z0-9._~-]{0,300}".prop_map(String::into_bytes),
                "[a-z]{250,260}".prop_map(String::into_bytes),
                "[A-Za-z0-9._~{}: -]{0,300}".prop_map(String::into_bytes),
            ]
        ) {
            prop_assert_eq!(encode(&value), encode_bytewise(&value));
        }
    }
}
