//! The host as the decision core sees it, over proxy-wasm host calls: the
//! request as the policy model reads it, [`sluice_core::Host`] (Envoy's
//! shared data, the response headers, the bodies) and the clock each event's
//! [`sluice_core::Now`] reads on first use. A host call that fails reads as
//! an absent value; nothing here panics.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls::{
    get_buffer, get_current_time, get_map_bytes, get_map_value_bytes, get_property, get_shared_data,
    set_shared_data,
};
use proxy_wasm::types::{BufferType, MapType, Status};
use sluice_core::{Host, SetError, SharedData};
use sluice_policies::request::SimpleRequest;
use sluice_policies::Request;

use crate::name::Name;

/// Distinct headers one request remembers; a document that reads more asks
/// the host again for the rest (correct, only slower).
const REMEMBERED: usize = 8;

/// A header read once: its name, and its value (`None`: absent).
type Remembered = OnceCell<(Name, Option<Vec<u8>>)>;

/// The request of the current `on_http_request_headers`, read from the host
/// lazily and once: each header is one host call (and one copy into the
/// guest) per request, however many policies, conditions and keys read it,
/// and a header nothing reads is never fetched.
#[derive(Default)]
pub struct HostRequest {
    path: OnceCell<Vec<u8>>,
    method: OnceCell<Vec<u8>>,
    authority: OnceCell<Vec<u8>>,
    /// Each header read so far, in the order first read.
    headers: [Remembered; REMEMBERED],
    source_address: OnceCell<Option<Vec<u8>>>,
}

impl HostRequest {
    /// The request; nothing is read until asked for.
    pub fn read() -> HostRequest {
        HostRequest::default()
    }
}

impl Request for HostRequest {
    fn path(&self) -> &[u8] {
        self.path.get_or_init(|| header(":path").unwrap_or_default())
    }

    fn method(&self) -> &[u8] {
        self.method.get_or_init(|| header(":method").unwrap_or_default())
    }

    fn authority(&self) -> &[u8] {
        self.authority.get_or_init(|| header(":authority").unwrap_or_default())
    }

    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        for slot in &self.headers {
            let (_, value) = match slot.get() {
                Some((seen, _)) if !seen.is(name) => continue,
                Some(remembered) => remembered,
                None => match Name::new(name) {
                    Some(kept) => slot.get_or_init(|| (kept, header(name))),
                    None => break,
                },
            };
            return value.as_deref().map(Cow::Borrowed);
        }
        header(name).map(Cow::Owned)
    }

    fn source_address(&self) -> Option<Cow<'_, [u8]>> {
        let address =
            self.source_address.get_or_init(|| get_property(vec!["source", "address"]).ok().flatten());
        address.as_deref().map(Cow::Borrowed)
    }
}

impl HostRequest {
    /// The request as a whole, copied from the host: what a flow that reads
    /// the body evaluates once the body is whole, when the host no longer
    /// lends the headers (they went on when the body began).
    pub fn capture() -> SimpleRequest {
        let headers = get_map_bytes(MapType::HttpRequestHeaders).unwrap_or_default();
        let pseudo =
            |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap_or_default();
        SimpleRequest {
            path: pseudo(":path"),
            method: pseudo(":method"),
            authority: pseudo(":authority"),
            headers: headers.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.clone())).collect(),
            source_address: get_property(vec!["source", "address"]).ok().flatten(),
            ..SimpleRequest::default()
        }
    }
}

fn header(name: &str) -> Option<Vec<u8>> {
    get_map_value_bytes(MapType::HttpRequestHeaders, name).ok().flatten()
}

/// The host as one callback sees it: Envoy's shared data, the upstream's
/// response headers and the bodies.
#[derive(Default)]
pub struct ProxyHost;

impl ProxyHost {
    /// The host for one callback.
    pub fn new() -> ProxyHost {
        ProxyHost
    }
}

/// The proxy's wall clock in milliseconds since the epoch; 0 if unreadable.
/// An event's [`sluice_core::Now`] calls it on first use, once.
pub fn clock() -> u64 {
    get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl SharedData for ProxyHost {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        get_shared_data(key).unwrap_or((None, None))
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        match set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(SetError::Conflict),
            Err(status) => Err(SetError::Failed(format!("{status:?}"))),
        }
    }
}

impl Host for ProxyHost {
    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        get_map_value_bytes(MapType::HttpResponseHeaders, name).ok().flatten()
    }

    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        get_buffer(BufferType::HttpRequestBody, start, len).ok().flatten()
    }

    fn response_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        get_buffer(BufferType::HttpResponseBody, start, len).ok().flatten()
    }
}
