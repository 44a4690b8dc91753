//! The host as the rest of the filter sees it, over proxy-wasm host calls:
//! the request as the policy model reads it, Envoy's shared data as the
//! over-limit cache's store, and the clock. A host call that fails reads as
//! an absent value; nothing here panics.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls::{
    get_current_time, get_map_value_bytes, get_property, get_shared_data, set_shared_data,
};
use proxy_wasm::types::{MapType, Status};
use sluice_policies::Request;

use crate::cache::Store;
use crate::leased::Pool;

/// How often a lease pool's compare-and-swap is tried again after another
/// worker wrote first, before the request is checked by the shim instead.
const CAS_TRIES: usize = 8;

/// Distinct headers one request remembers; a document that reads more asks
/// the host again for the rest (correct, only slower).
const REMEMBERED: usize = 8;

/// A header read once: its name, and its value (`None`: absent).
type Remembered = OnceCell<(Box<str>, Option<Vec<u8>>)>;

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
                Some((seen, _)) if **seen != *name => continue,
                Some(remembered) => remembered,
                None => slot.get_or_init(|| (name.into(), header(name))),
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

fn header(name: &str) -> Option<Vec<u8>> {
    get_map_value_bytes(MapType::HttpRequestHeaders, name).ok().flatten()
}

/// Envoy's shared data: one map per `vm_id`, seen by every worker.
pub struct SharedData;

impl Store for SharedData {
    fn get(&self, key: &str) -> Option<Vec<u8>> {
        get_shared_data(key).ok().and_then(|(value, _cas)| value)
    }

    fn set(&self, key: &str, value: &[u8]) {
        if let Err(status) = set_shared_data(key, Some(value), None) {
            log::debug!("cannot write shared data {key}: {status:?}");
        }
    }
}

/// Applies `rule` to the lease pool at `key` in shared data, read and
/// written with compare-and-swap: on a conflict the pool is read again and
/// the rule applied again. `None` when it could not be stored, so nothing
/// the rule did happened. A pool that is absent or unreadable starts empty
/// (its tokens, if any, are lost: under-admission, never over).
pub fn update_pool<R>(key: &str, mut rule: impl FnMut(&mut Pool) -> R) -> Option<R> {
    for _ in 0..CAS_TRIES {
        let (bytes, cas) = get_shared_data(key).unwrap_or((None, None));
        let mut pool = bytes.as_deref().and_then(Pool::decode).unwrap_or_default();
        let out = rule(&mut pool);
        match set_shared_data(key, Some(&pool.encode()), cas) {
            Ok(()) => return Some(out),
            Err(Status::CasMismatch) => continue,
            Err(status) => {
                log::debug!("cannot write the lease pool {key}: {status:?}");
                return None;
            }
        }
    }
    None
}

/// The proxy's wall clock in milliseconds since the epoch; 0 if unreadable.
pub fn now_ms() -> u64 {
    get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
