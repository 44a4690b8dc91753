//! What matching and key building read from a request. The filter implements
//! this over proxy-wasm host calls; tests and benches over plain values.

use std::borrow::Cow;

use crate::body::Body;

pub trait Request {
    /// The `:path` pseudo-header, query included; empty if absent.
    fn path(&self) -> &[u8];
    /// The `:method` pseudo-header; empty if absent.
    fn method(&self) -> &[u8];
    /// The `:authority` pseudo-header (the host); empty if absent.
    fn authority(&self) -> &[u8];
    /// A request header's value, by lower-case name.
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>>;
    /// The downstream peer address, `ip:port`, as the proxy saw it.
    fn source_address(&self) -> Option<Cow<'_, [u8]>>;
    /// The domain of a request that came through a gRPC face (an RLS
    /// request's `domain`, an RLQS stream's); `None` for the filter's HTTP
    /// requests. A request with a domain is matched only by gRPC-face
    /// policies, and one without only by the others.
    fn domain(&self) -> Option<&[u8]> {
        None
    }
    /// An RLS descriptor's entry by key. Other requests have none.
    fn entry(&self, _key: &str) -> Option<Cow<'_, [u8]>> {
        None
    }
    /// An RLS descriptor's entries in order (the descriptor tree walks
    /// them). Other requests have none.
    fn entries(&self) -> &[(String, Vec<u8>)] {
        &[]
    }
    /// An RLS descriptor's position in its call (0 the first).
    fn descriptor_index(&self) -> Option<usize> {
        None
    }
    /// An RLQS bucket id's value by key. Other requests have none.
    fn bucket(&self, _key: &str) -> Option<Cow<'_, [u8]>> {
        None
    }
    /// The face the request came through: a request with a domain is an
    /// RLS descriptor's unless it says otherwise.
    fn face(&self) -> Face {
        if self.domain().is_some() {
            Face::Rls
        } else {
            Face::Http
        }
    }
    /// The request's body, read whole ([`WithBody`]); `None` while it is
    /// not read (only documents that read bodies read them) or for a face
    /// that has none.
    fn body(&self) -> Option<&Body> {
        None
    }
}

/// Where a request came from, and so which policies can match it: a policy
/// is of one face (see `Condition::face`) and only its requests reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Face {
    /// An HTTP request, through the Sluice filter.
    Http,
    /// One descriptor of an RLS `ShouldRateLimit` call.
    Rls,
    /// One bucket of an RLQS stream (`StreamRateLimitQuotas`).
    Rlqs,
}

impl Face {
    /// Its name in metrics and docs: `filter`, `rls`, `rlqs`.
    pub fn name(self) -> &'static str {
        match self {
            Face::Http => "filter",
            Face::Rls => "rls",
            Face::Rlqs => "rlqs",
        }
    }
}

/// A request with its body, read whole: what a document that reads bodies
/// evaluates once the body has arrived.
pub struct WithBody<'a, R: ?Sized> {
    pub req: &'a R,
    pub body: &'a Body,
}

impl<R: Request + ?Sized> Request for WithBody<'_, R> {
    fn path(&self) -> &[u8] {
        self.req.path()
    }
    fn method(&self) -> &[u8] {
        self.req.method()
    }
    fn authority(&self) -> &[u8] {
        self.req.authority()
    }
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.req.header(name)
    }
    fn source_address(&self) -> Option<Cow<'_, [u8]>> {
        self.req.source_address()
    }
    fn domain(&self) -> Option<&[u8]> {
        self.req.domain()
    }
    fn entry(&self, key: &str) -> Option<Cow<'_, [u8]>> {
        self.req.entry(key)
    }
    fn entries(&self) -> &[(String, Vec<u8>)] {
        self.req.entries()
    }
    fn descriptor_index(&self) -> Option<usize> {
        self.req.descriptor_index()
    }
    fn bucket(&self, key: &str) -> Option<Cow<'_, [u8]>> {
        self.req.bucket(key)
    }
    fn face(&self) -> Face {
        self.req.face()
    }
    fn body(&self) -> Option<&Body> {
        Some(self.body)
    }
}

/// One thing a [`Request`] is read for, by name: what a key source or a
/// record of the request (a log line) may or may not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Attribute<'a> {
    /// The path, query included.
    Path,
    Method,
    Authority,
    /// A header, by lower-case name.
    Header(&'a str),
    /// The downstream peer address.
    SourceAddress,
    /// A gRPC face's domain.
    Domain,
    /// An RLS descriptor's entry, by key.
    Entry(&'a str),
    /// An RLQS bucket id's value, by key.
    Bucket(&'a str),
    /// A field of the JSON body, by pointer.
    Body(&'a str),
}

/// A request held in plain values, for tests, benches and tools.
#[derive(Debug, Clone, Default)]
pub struct SimpleRequest {
    pub path: Vec<u8>,
    pub method: Vec<u8>,
    pub authority: Vec<u8>,
    /// Lower-case names; the first of a repeated name wins.
    pub headers: Vec<(String, Vec<u8>)>,
    pub source_address: Option<Vec<u8>>,
    /// A gRPC face's domain; `None` for an HTTP request.
    pub domain: Option<Vec<u8>>,
    /// An RLS descriptor's entries; the first of a repeated key wins.
    pub entries: Vec<(String, Vec<u8>)>,
    /// An RLS descriptor's position in its call.
    pub index: Option<usize>,
    /// An RLS descriptor's own `limit` (Envoy's override).
    pub limit: Option<DescriptorLimit>,
    /// An RLQS bucket id; non-empty makes this an RLQS request.
    pub bucket: Vec<(String, Vec<u8>)>,
    /// The body, read whole.
    pub body: Option<Body>,
}

/// A descriptor's own limit, as Envoy sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorLimit {
    pub requests_per_unit: u32,
    /// The unit's window (month 30 days, year 365); `None`: an unknown unit.
    pub window: Option<crate::units::Duration>,
}

/// The windows of the RLS units, in ms: second to year (month 30 days,
/// year 365, as envoyproxy/ratelimit divides time).
pub(crate) const UNITS_MS: [u64; 7] =
    [1_000, 60_000, 3_600_000, 86_400_000, 7 * 86_400_000, 30 * 86_400_000, 365 * 86_400_000];

impl DescriptorLimit {
    /// The limit of `requests_per_unit` per the window of `unit_ms`.
    pub fn new(requests_per_unit: u32, unit_ms: Option<u64>) -> DescriptorLimit {
        let window = unit_ms.filter(|ms| UNITS_MS.contains(ms)).and_then(crate::units::Duration::from_millis);
        DescriptorLimit { requests_per_unit, window }
    }
}

impl SimpleRequest {
    pub fn new(method: &str, path: &str) -> SimpleRequest {
        SimpleRequest { method: method.into(), path: path.into(), ..SimpleRequest::default() }
    }

    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> SimpleRequest {
        self.headers.push((name.to_ascii_lowercase(), value.as_ref().to_vec()));
        self
    }

    pub fn authority(mut self, authority: &str) -> SimpleRequest {
        self.authority = authority.into();
        self
    }

    pub fn source(mut self, address: &str) -> SimpleRequest {
        self.source_address = Some(address.into());
        self
    }

    /// Makes this a gRPC face's request, in `domain`.
    pub fn domain(mut self, domain: impl AsRef<[u8]>) -> SimpleRequest {
        self.domain = Some(domain.as_ref().to_vec());
        self
    }

    pub fn entry(mut self, key: &str, value: impl AsRef<[u8]>) -> SimpleRequest {
        self.entries.push((key.to_string(), value.as_ref().to_vec()));
        self
    }

    /// Drops each entry whose key comes again later: the last value of a
    /// repeated key is the one read (an RLS document's `repeated_entry: last`).
    pub fn last_entries_win(mut self) -> SimpleRequest {
        let keys: Vec<String> = self.entries.iter().map(|(k, _)| k.clone()).collect();
        let mut i = 0;
        self.entries.retain(|_| {
            i += 1;
            !keys[i..].contains(&keys[i - 1])
        });
        self
    }

    /// Its position among the descriptors of an RLS call.
    pub fn index(mut self, index: usize) -> SimpleRequest {
        self.index = Some(index);
        self
    }

    /// Its own limit, as an RLS descriptor may carry (Envoy's override).
    pub fn limit(mut self, limit: DescriptorLimit) -> SimpleRequest {
        self.limit = Some(limit);
        self
    }

    /// One value of an RLQS bucket id (with [`SimpleRequest::domain`]).
    pub fn bucket(mut self, key: &str, value: impl AsRef<[u8]>) -> SimpleRequest {
        self.bucket.push((key.to_string(), value.as_ref().to_vec()));
        self
    }

    /// Gives it this body, read whole.
    pub fn body(mut self, bytes: impl AsRef<[u8]>) -> SimpleRequest {
        self.body = Some(Body::parse(bytes.as_ref()));
        self
    }
}

impl Request for SimpleRequest {
    fn path(&self) -> &[u8] {
        &self.path
    }
    fn method(&self) -> &[u8] {
        &self.method
    }
    fn authority(&self) -> &[u8] {
        &self.authority
    }
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| Cow::Borrowed(v.as_slice()))
    }
    fn source_address(&self) -> Option<Cow<'_, [u8]>> {
        self.source_address.as_deref().map(Cow::Borrowed)
    }
    fn domain(&self) -> Option<&[u8]> {
        self.domain.as_deref()
    }
    fn entry(&self, key: &str) -> Option<Cow<'_, [u8]>> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| Cow::Borrowed(v.as_slice()))
    }
    fn entries(&self) -> &[(String, Vec<u8>)] {
        &self.entries
    }
    fn descriptor_index(&self) -> Option<usize> {
        self.index
    }
    fn bucket(&self, key: &str) -> Option<Cow<'_, [u8]>> {
        self.bucket.iter().find(|(k, _)| k == key).map(|(_, v)| Cow::Borrowed(v.as_slice()))
    }
    fn face(&self) -> Face {
        match (&self.domain, self.bucket.is_empty()) {
            (None, _) => Face::Http,
            (Some(_), true) => Face::Rls,
            (Some(_), false) => Face::Rlqs,
        }
    }
    fn body(&self) -> Option<&Body> {
        self.body.as_ref()
    }
}

/// The path without its query string.
pub fn path_only(path: &[u8]) -> &[u8] {
    match path.iter().position(|&b| b == b'?') {
        Some(i) => &path[..i],
        None => path,
    }
}

/// The query string, without the `?`; empty if none.
pub fn query_string(path: &[u8]) -> &[u8] {
    match path.iter().position(|&b| b == b'?') {
        Some(i) => &path[i + 1..],
        None => b"",
    }
}

/// The first value of query parameter `name`, form-decoded.
pub fn query_param<'a>(path: &'a [u8], name: &str) -> Option<Cow<'a, str>> {
    form_urlencoded::parse(query_string(path)).find(|(k, _)| k == name).map(|(_, v)| v)
}

/// The host of an authority, without a port, in lower case when it needs no
/// allocation to compare: callers compare case-insensitively.
pub fn host_only(authority: &[u8]) -> &[u8] {
    if authority.first() == Some(&b'[') {
        // [v6]:port
        return match authority.iter().position(|&b| b == b']') {
            Some(end) => &authority[..=end],
            None => authority,
        };
    }
    match authority.iter().rposition(|&b| b == b':') {
        Some(i) if authority[i + 1..].iter().all(u8::is_ascii_digit) => &authority[..i],
        _ => authority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_and_query_split_at_the_first_question_mark() {
        assert_eq!(path_only(b"/a/b?x=1?y"), b"/a/b");
        assert_eq!(query_string(b"/a/b?x=1?y"), b"x=1?y");
        assert_eq!(query_string(b"/a"), b"");
    }

    #[test]
    fn query_params_are_form_decoded_first_wins() {
        assert_eq!(query_param(b"/?a=1&b=x%20y+z&a=2", "a").as_deref(), Some("1"));
        assert_eq!(query_param(b"/?a=1&b=x%20y+z", "b").as_deref(), Some("x y z"));
        assert_eq!(query_param(b"/?a=1", "c"), None);
        assert_eq!(query_param(b"/?flag", "flag").as_deref(), Some(""));
    }

    #[test]
    fn hosts_lose_their_port() {
        assert_eq!(host_only(b"api.example.com:8443"), b"api.example.com");
        assert_eq!(host_only(b"api.example.com"), b"api.example.com");
        assert_eq!(host_only(b"[::1]:80"), b"[::1]");
    }
}
