//! The host calls the filter makes after its configuration, with every
//! status the host may answer handed back.
//!
//! The SDK's wrappers (`proxy_wasm::hostcalls`) panic on a status they do
//! not expect, and a panic traps the worker's VM: every request it holds
//! stalls and every lease it holds leaks until its TTL. Hosts do answer
//! such statuses: Envoy answers BadArgument to a second local reply in a
//! stream, and to a header edit or a body write whose map or buffer the
//! stream no longer has. These call the same ABI functions as the SDK does
//! (proxy-wasm ABI 0.2.1) and return the status as `Err` instead; the
//! caller logs it and goes on. Statuses come back as raw `u32`, so a value
//! the `Status` enum does not name is never read as one.

use std::ptr::{null, null_mut};

use proxy_wasm::types::{BufferType, MapType, Status, StreamType};

/// A status other than Ok, as the host gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused(pub u32);

/// A status the SDK's wrapper handed back.
impl From<Status> for Refused {
    fn from(status: Status) -> Refused {
        Refused(status as u32)
    }
}

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
const EMPTY: u32 = 7;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_send_local_response(
        status_code: u32,
        details_data: *const u8,
        details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_continue_stream(stream_type: StreamType) -> u32;
    fn proxy_close_stream(stream_type: StreamType) -> u32;
    fn proxy_add_header_map_value(
        map_type: MapType,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map_type: MapType,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        buffer_type: BufferType,
        start: usize,
        size: usize,
        data: *const u8,
        data_size: usize,
    ) -> u32;
    fn proxy_register_shared_queue(name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32;
    fn proxy_enqueue_shared_queue(queue_id: u32, value_data: *const u8, value_size: usize) -> u32;
    fn proxy_dequeue_shared_queue(queue_id: u32, return_data: *mut *mut u8, return_size: *mut usize) -> u32;
}

fn ok(status: u32) -> Result<(), Refused> {
    match status {
        OK => Ok(()),
        other => Err(Refused(other)),
    }
}

/// Answers the request locally (no gRPC status).
pub fn send_http_response(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Result<(), Refused> {
    let headers = serialize_map(headers);
    // SAFETY: every pointer is to a live slice, with its length, for the
    // call's duration; the host only reads them.
    ok(unsafe {
        proxy_send_local_response(
            u32::from(status),
            null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    })
}

/// Lets the request go on to the upstream.
pub fn resume_http_request() -> Result<(), Refused> {
    // SAFETY: no pointers.
    ok(unsafe { proxy_continue_stream(StreamType::HttpRequest) })
}

/// Lets the response go on to the client.
pub fn resume_http_response() -> Result<(), Refused> {
    // SAFETY: no pointers.
    ok(unsafe { proxy_continue_stream(StreamType::HttpResponse) })
}

/// Ends the response early: proxy-wasm's only way to end a stream whose
/// last event has gone.
pub fn reset_http_response() -> Result<(), Refused> {
    // SAFETY: no pointers.
    ok(unsafe { proxy_close_stream(StreamType::HttpResponse) })
}

/// Adds a response header beside any of the same name.
pub fn add_response_header(name: &str, value: &str) -> Result<(), Refused> {
    // SAFETY: live slices with their lengths, read by the host during the call.
    ok(unsafe {
        proxy_add_header_map_value(
            MapType::HttpResponseHeaders,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Sets a response header, replacing any of the same name.
pub fn set_response_header(name: &str, value: &str) -> Result<(), Refused> {
    // SAFETY: as above.
    ok(unsafe {
        proxy_replace_header_map_value(
            MapType::HttpResponseHeaders,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Replaces the response body the host holds with `body`.
pub fn replace_response_body(body: &[u8]) -> Result<(), Refused> {
    // SAFETY: as above.
    ok(unsafe {
        proxy_set_buffer_bytes(BufferType::HttpResponseBody, 0, usize::MAX, body.as_ptr(), body.len())
    })
}

/// Registers the shared queue `name` (from the root context): its id.
pub fn register_shared_queue(name: &str) -> Result<u32, Refused> {
    let mut id = 0;
    // SAFETY: a live slice with its length, and a live `u32` the host writes.
    ok(unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) }).map(|()| id)
}

/// Enqueues `value` on queue `id`.
pub fn enqueue_shared_queue(id: u32, value: &[u8]) -> Result<(), Refused> {
    // SAFETY: a live slice with its length, read by the host during the call.
    ok(unsafe { proxy_enqueue_shared_queue(id, value.as_ptr(), value.len()) })
}

/// Takes the oldest item off queue `id`: `Ok(false)` when it is empty.
pub fn dequeue_shared_queue(id: u32) -> Result<bool, Refused> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    // SAFETY: two live out-parameters. On Ok, a non-null `data` is a buffer
    // of `size` bytes the host allocated through the guest's
    // `proxy_on_memory_allocate` (the SDK's allocator, a `Vec` of that
    // capacity), now owned here and freed as one.
    match unsafe { proxy_dequeue_shared_queue(id, &mut data, &mut size) } {
        OK => {
            if !data.is_null() {
                drop(unsafe { Vec::from_raw_parts(data, size, size) });
            }
            Ok(true)
        }
        EMPTY | NOT_FOUND => Ok(false),
        other => Err(Refused(other)),
    }
}

/// A header map in the ABI's form: the count, each pair's two lengths,
/// then each name and value ended by a NUL.
fn serialize_map(map: &[(&str, &str)]) -> Vec<u8> {
    let size = 4 + map.iter().map(|(n, v)| 10 + n.len() + v.len()).sum::<usize>();
    let mut bytes = Vec::with_capacity(size);
    bytes.extend_from_slice(&(map.len() as u32).to_le_bytes());
    for (name, value) in map {
        bytes.extend_from_slice(&(name.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&(value.len() as u32).to_le_bytes());
    }
    for (name, value) in map {
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
    }
    bytes
}
