//! What the flow needs from its host while it handles an event: the data
//! every worker of one proxy shares, the upstream's response headers and
//! the bodies. The time comes with the event ([`crate::Now`]); everything
//! the flow wants done comes out as an [`Effect`](crate::Effect) value.
//!
//! These are reads (and one compare-and-swap) whose answer the flow needs
//! before it can go on, so they are a trait, not effects. An adapter reads
//! each lazily: a response header nothing asks for is never fetched. Shared
//! data is read and written in two places only: the over-limit cache
//! ([`crate::cache`]) and the leased pools ([`crate::worker::update_pool`]).
//! Tests implement it with a map ([`crate::testing::FakeHost`]).

/// Why a shared-data write did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetError {
    /// Another worker wrote the key since it was read (compare-and-swap).
    Conflict,
    /// The host refused the write.
    Failed(String),
}

/// The data every worker of one proxy shares (Envoy's shared data: one map
/// per `vm_id`, no delete, no TTL, compare-and-swap by version).
pub trait SharedData {
    /// The value at `key` and its version, `(None, None)` when absent or unreadable.
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>);
    /// Writes `value` at `key`, if its version is still `cas` (`None`: whatever it is).
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError>;
}

/// The host, as one event sees it.
pub trait Host: SharedData {
    /// A header of the upstream's response, by lower-case name; `None` before
    /// the response's headers or when absent.
    fn response_header(&self, name: &str) -> Option<Vec<u8>>;
    /// The request's body as the host has buffered it, `len` bytes from
    /// `start`; read only for a document that reads bodies.
    fn request_body(&self, _start: usize, _len: usize) -> Option<Vec<u8>> {
        None
    }
    /// The response body chunk being handled, `len` bytes from `start`;
    /// read only for a policy with an `llm`.
    fn response_body(&self, _start: usize, _len: usize) -> Option<Vec<u8>> {
        None
    }
}

impl<T: SharedData + ?Sized> SharedData for &T {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        (**self).get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        (**self).set(key, value, cas)
    }
}
