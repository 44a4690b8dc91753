//! A fake host for driving the flow in tests: shared data in a map with
//! versions, and the response headers the test sets; with it, a clock the
//! test moves and hands to each event as its [`Now`](crate::Now).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use crate::host::{Host, SetError, SharedData};

mod zipf;
pub use zipf::Zipf;

#[derive(Default)]
pub struct FakeHost {
    /// The test's clock, in milliseconds since the epoch (no part of [`Host`]:
    /// the test gives each event its time).
    pub now: Cell<u64>,
    /// Shared data: each key's value and version.
    pub shared: RefCell<HashMap<String, (Vec<u8>, u32)>>,
    /// The upstream's response headers, by lower-case name.
    pub response: RefCell<Vec<(String, Vec<u8>)>>,
    /// Shared-data writes that fail, for the next this many writes.
    pub failing_writes: Cell<u32>,
    /// The request's body as buffered so far.
    pub request_body: RefCell<Vec<u8>>,
    /// The response body chunk being handled.
    pub response_chunk: RefCell<Vec<u8>>,
}

impl FakeHost {
    pub fn at(now_ms: u64) -> FakeHost {
        FakeHost { now: Cell::new(now_ms), ..FakeHost::default() }
    }

    /// The time of the next event, as the test's clock says.
    pub fn now(&self) -> crate::Now<'static> {
        crate::Now::at(self.now.get())
    }

    pub fn advance(&self, ms: u64) {
        self.now.set(self.now.get() + ms);
    }

    /// Buffers more of the request's body; its size so far.
    pub fn request_bytes(&self, bytes: &[u8]) -> usize {
        let mut body = self.request_body.borrow_mut();
        body.extend_from_slice(bytes);
        body.len()
    }

    /// Makes `bytes` the response body chunk being handled; its size.
    pub fn response_chunk(&self, bytes: &[u8]) -> usize {
        *self.response_chunk.borrow_mut() = bytes.to_vec();
        bytes.len()
    }

    /// Sets the response's headers (`:status` among them).
    pub fn respond(&self, headers: &[(&str, &str)]) {
        *self.response.borrow_mut() =
            headers.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect();
    }
}

impl SharedData for FakeHost {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        match self.shared.borrow().get(key) {
            Some((value, version)) => (Some(value.clone()), Some(*version)),
            None => (None, None),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        if self.failing_writes.get() > 0 {
            self.failing_writes.set(self.failing_writes.get() - 1);
            return Err(SetError::Failed("refused by the test".into()));
        }
        let mut shared = self.shared.borrow_mut();
        let version = shared.get(key).map_or(0, |(_, v)| *v);
        if cas.is_some_and(|cas| cas != version) {
            return Err(SetError::Conflict);
        }
        shared.insert(key.to_string(), (value.to_vec(), version + 1));
        Ok(())
    }
}

impl Host for FakeHost {
    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        self.response.borrow().iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
    }

    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        slice(&self.request_body.borrow(), start, len)
    }

    fn response_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        slice(&self.response_chunk.borrow(), start, len)
    }
}

/// `len` bytes of `bytes` from `start`, clipped to its end, as a host reads a buffer.
fn slice(bytes: &[u8], start: usize, len: usize) -> Option<Vec<u8>> {
    let end = start.saturating_add(len).min(bytes.len());
    bytes.get(start..end).map(<[u8]>::to_vec)
}
