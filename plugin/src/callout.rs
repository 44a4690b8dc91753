//! Calls to the shim: the check that holds a request, and the release and
//! adjust calls that follow an admitted one.
//!
//! A release or adjust call must outlive its stream: a call the stream owns
//! is cancelled when the stream ends, which is exactly when a lease is
//! released. So a stream only queues them (`Vm::outbox`), and the root
//! context, which lives as long as the VM, sends them on its next tick and
//! receives their answers (the SDK routes an answer to the context that was
//! active when the call was made).

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, Status};
use sluice_policies::wire::{CheckRequest, CHECK_PATH};
use sluice_policies::Document;

/// The shortest timeout for a call nobody waits for.
const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(1);

/// POSTs `body` (JSON) to the shim at `path`; the token of the call.
pub fn post_bytes(doc: &Document, path: &str, body: &[u8], timeout: Duration) -> Result<u32, String> {
    let headers = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", "sluice-shim"),
        ("content-type", "application/json"),
    ];
    hostcalls::dispatch_http_call(&doc.shim.cluster, headers, Some(body), vec![], timeout)
        .map_err(|status: Status| format!("cannot call cluster {:?}: {status:?}", doc.shim.cluster))
}

/// Sends a check; the request waits at most `timeout_ms` for it.
pub fn post_check(doc: &Document, req: &CheckRequest<'_>) -> Result<u32, String> {
    let body = serde_json::to_vec(req).map_err(|e| format!("cannot encode the check: {e}"))?;
    post_bytes(doc, CHECK_PATH, &body, Duration::from_millis(doc.shim.timeout_ms.get().into()))
}

/// The timeout of a release or adjust call: nobody waits for it.
pub fn background_timeout(doc: &Document) -> Duration {
    Duration::from_millis(doc.shim.timeout_ms.get().into()).max(BACKGROUND_TIMEOUT)
}

/// The answer to a call: its `:status` (none when the call failed without
/// one) and its body.
pub fn call_answer(num_headers: usize, body_size: usize) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let status = match num_headers {
        0 => None,
        _ => hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status").ok().flatten(),
    };
    let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten();
    (status, body)
}
