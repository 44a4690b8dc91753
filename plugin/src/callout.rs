//! Calls to the shim: the check that holds a request, and the release and
//! adjust calls that follow an admitted one.
//!
//! A release or adjust call is made on behalf of the root context, which
//! lives as long as the VM: a call owned by the stream would be cancelled when
//! the stream ends, which is exactly when a lease is released.

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;
use serde::Serialize;
use sluice_policies::Document;

/// The shortest timeout for a call nobody waits for.
const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(1);

/// POSTs `body` as JSON to the shim at `path`; the token of the call.
pub fn post(doc: &Document, path: &str, body: &impl Serialize, timeout: Duration) -> Result<u32, String> {
    let body = serde_json::to_vec(body).map_err(|e| format!("cannot encode the call: {e}"))?;
    let headers = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", "sluice-shim"),
        ("content-type", "application/json"),
    ];
    hostcalls::dispatch_http_call(&doc.shim.cluster, headers, Some(&body), vec![], timeout)
        .map_err(|status: Status| format!("cannot call cluster {:?}: {status:?}", doc.shim.cluster))
}

/// The timeout of a check: the request waits for it.
pub fn check_timeout(doc: &Document) -> Duration {
    Duration::from_millis(doc.shim.timeout_ms.get().into())
}

/// Posts on behalf of the root context `root`, then returns to `stream`.
pub fn post_in_background(doc: &Document, root: u32, stream: u32, path: &str, body: &impl Serialize) {
    let timeout = check_timeout(doc).max(BACKGROUND_TIMEOUT);
    if hostcalls::set_effective_context(root).is_err() {
        log::warn!("cannot switch to the root context; {path} is skipped");
        return;
    }
    if let Err(reason) = post(doc, path, body, timeout) {
        log::warn!("{path}: {reason}");
    }
    let _ = hostcalls::set_effective_context(stream);
}
