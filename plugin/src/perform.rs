//! Performs the core's effects with host calls, in order. A call the host
//! cannot send is handed back to its owner at once, whose new effects are
//! performed next.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, Status};
use sluice_core::local_reply::Header;
use sluice_core::{CallId, CallResult, Deferred, Effect, Outgoing};
use sluice_policies::wire::{PROTOCOL_HEADER, PROTOCOL_VERSION};

use crate::abi;
use crate::stats::Stats;

/// The owner of the calls an effect list sends: a stream or the worker.
pub trait Calls {
    /// A call about to go out: `None` when it waits to share a callout
    /// (`sluice_core::sharing`); else the call to send now.
    fn offer(&mut self, call: Outgoing) -> Option<Outgoing> {
        Some(call)
    }
    /// `id` went out as the host's call `token`.
    fn sent(&mut self, id: CallId, token: u32);
    /// `id` could not be sent: the owner's effects for that.
    fn not_sent(&mut self, id: CallId, reason: String) -> Vec<Effect>;
    /// A call for the worker to send on its next tick.
    fn defer(&mut self, call: Deferred);
    /// The stream's response is to end once this callback's bytes have gone.
    fn end_response(&mut self) {}
}

/// Performs `effects` in order; the list, emptied, comes back for the
/// worker to reuse (`Worker::recycle`).
pub fn perform(effects: Vec<Effect>, cluster: &str, stats: &Stats, calls: &mut impl Calls) -> Vec<Effect> {
    if effects.is_empty() {
        // Most events have none: no queue made for them.
        return effects;
    }
    let mut queue = VecDeque::from(effects);
    while let Some(effect) = queue.pop_front() {
        match effect {
            Effect::Send(call) => {
                let Some(call) = calls.offer(call) else { continue };
                let id = call.id;
                match send(cluster, &call) {
                    Ok(token) => calls.sent(id, token),
                    Err(reason) => {
                        for (i, e) in calls.not_sent(id, reason.to_string()).into_iter().enumerate() {
                            queue.insert(i, e);
                        }
                    }
                }
            }
            Effect::Defer(call) => calls.defer(call),
            Effect::Reply(reply) => {
                let headers: Vec<(&str, &str)> =
                    reply.headers.iter().map(|(n, v)| (text(n), text(v))).collect();
                if let Err(status) = abi::send_http_response(reply.status, &headers, &reply.body) {
                    log::warn!("cannot send the local response: {status:?}");
                }
            }
            Effect::ResumeRequest => {
                if let Err(status) = abi::resume_http_request() {
                    log::warn!("cannot resume the request: {status:?}");
                }
            }
            Effect::ResumeResponse => {
                if let Err(status) = abi::resume_http_response() {
                    log::warn!("cannot resume the response: {status:?}");
                }
            }
            Effect::AddResponseHeader { name, value } => {
                if let Err(status) = abi::add_response_header(name, &value) {
                    log::debug!("cannot add {name}: {status:?}");
                }
            }
            Effect::SetResponseHeader { name, value } => {
                if let Err(status) = abi::set_response_header(name, &value) {
                    log::debug!("cannot set {name}: {status:?}");
                }
            }
            Effect::ReplaceResponseBody(body) => {
                if let Err(status) = abi::replace_response_body(&body) {
                    log::warn!("cannot replace the response body: {status:?}");
                }
            }
            Effect::EndResponse => calls.end_response(),
            Effect::Policy { policy, stat, n } => stats.policy(policy, stat, n),
            Effect::Class { class, stat, n } => stats.class(class, stat, n),
            Effect::Filter { stat, n } => stats.filter(stat, n),
        }
    }
    Vec::from(queue)
}

/// A header of a local reply as text: a plain match, inlined, where
/// `Cow::as_ref` is a call per name and value (wasm32, opt-level "s").
fn text(header: &Header) -> &str {
    match header {
        Cow::Borrowed(text) => text,
        Cow::Owned(text) => text,
    }
}

/// The host refused to dispatch a call; the core is told in these words.
#[derive(Debug, thiserror::Error)]
#[error("cannot call cluster {cluster:?}: {status:?}")]
pub struct NotDispatched {
    cluster: String,
    status: Status,
}

/// POSTs the call's body to the shim, with its encoding and the wire's
/// version; the host's token for it.
pub fn send(cluster: &str, call: &Outgoing) -> Result<u32, NotDispatched> {
    let headers = vec![
        (":method", "POST"),
        (":path", call.path),
        (":authority", "sluice-shim"),
        ("content-type", call.encoding.content_type()),
        (PROTOCOL_HEADER, PROTOCOL_VERSION),
    ];
    let timeout = Duration::from_millis(call.timeout_ms);
    hostcalls::dispatch_http_call(cluster, headers, Some(&call.body), vec![], timeout)
        .map_err(|status| NotDispatched { cluster: cluster.to_string(), status })
}

/// The answer to a call: its `:status` (none when the call failed without
/// one) and its body.
pub fn answer(num_headers: usize, body_size: usize) -> CallResult {
    let status = match num_headers {
        0 => None,
        _ => hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status").ok().flatten(),
    };
    let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten();
    CallResult::Answered { status, body }
}
