//! What the filter does to its stream: `http_call`, `send_local_response`,
//! `continue_stream` (resume) and `close_stream` (reset). Each is recorded as
//! an [`Effect`] for the story to expect.
//!
//! As in Envoy, a second local response on one stream is BadArgument (the SDK
//! panics on it), and a local response or a resume releases the request
//! headers.

use wasmtime::{Caller, Linker, Result};

use super::called;
use super::status::{BAD_ARGUMENT, INTERNAL_FAILURE, OK};
use crate::calls::HttpCall;
use crate::calls::Refusal;
use crate::memory::{read, read_str, write_u32};
use crate::pairs::HeaderMap;
use crate::state::{Effect, HostState, LocalResponse};

const REQUEST: i32 = 0;
const RESPONSE: i32 = 1;

fn headers(caller: &mut Caller<'_, HostState>, ptr: i32, len: i32) -> Result<Option<HeaderMap>> {
    Ok(HeaderMap::decode(&read(caller, ptr, len)?))
}

pub(super) fn link(linker: &mut Linker<HostState>) -> Result<()> {
    linker.func_wrap(
        "env",
        "proxy_http_call",
        |mut caller: Caller<'_, HostState>,
         cluster: i32,
         cluster_len: i32,
         headers_ptr: i32,
         headers_len: i32,
         body: i32,
         body_len: i32,
         trailers: i32,
         trailers_len: i32,
         timeout_ms: i32,
         token_out: i32|
         -> Result<i32> {
            called(&mut caller, "proxy_http_call");
            let cluster = read_str(&mut caller, cluster, cluster_len)?;
            let Some(headers) = headers(&mut caller, headers_ptr, headers_len)? else {
                return Ok(BAD_ARGUMENT);
            };
            let body = read(&mut caller, body, body_len)?;
            let _ = read(&mut caller, trailers, trailers_len)?;
            let context = caller.data().effective;
            let call = HttpCall { token: 0, context, cluster, headers, body, timeout_ms: timeout_ms as u32 };
            let state = caller.data_mut();
            match state.calls.dispatch(call) {
                Ok(token) => {
                    if let Some(pending) = state.calls.pending.get(&token) {
                        let call = pending.call.clone();
                        state.effect(Effect::HttpCall(call));
                    }
                    write_u32(&mut caller, token_out, token)?;
                    Ok(OK)
                }
                Err(Refusal::BadArgument) => Ok(BAD_ARGUMENT),
                Err(Refusal::InternalFailure) => Ok(INTERNAL_FAILURE),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut caller: Caller<'_, HostState>,
         status: i32,
         details: i32,
         details_len: i32,
         body: i32,
         body_len: i32,
         headers_ptr: i32,
         headers_len: i32,
         _grpc_status: i32|
         -> Result<i32> {
            if called(&mut caller, "proxy_send_local_response") {
                return Ok(BAD_ARGUMENT);
            }
            let details = read_str(&mut caller, details, details_len)?;
            let body = read(&mut caller, body, body_len)?;
            let Some(headers) = headers(&mut caller, headers_ptr, headers_len)? else {
                return Ok(BAD_ARGUMENT);
            };
            let status = status as u32;
            let state = caller.data_mut();
            let Some(stream) = state.stream() else { return Ok(BAD_ARGUMENT) };
            if stream.answered.is_some() {
                return Ok(BAD_ARGUMENT);
            }
            stream.answered = Some(status);
            stream.paused = false;
            stream.request_open = false;
            state.effect(Effect::LocalResponse(LocalResponse { status, headers, body, details }));
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_continue_stream",
        |mut caller: Caller<'_, HostState>, kind: i32| -> Result<i32> {
            if called(&mut caller, "proxy_continue_stream") {
                return Ok(BAD_ARGUMENT);
            }
            let state = caller.data_mut();
            if let (REQUEST, Some(stream)) = (kind, state.stream()) {
                stream.paused = false;
                stream.request_open = false;
            }
            if let (RESPONSE, Some(stream)) = (kind, state.stream()) {
                // What the paused response held goes on.
                let held = std::mem::take(&mut stream.response_body);
                stream.forwarded.extend_from_slice(&held);
            }
            state.effect(Effect::Continue(kind));
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_close_stream",
        |mut caller: Caller<'_, HostState>, kind: i32| -> Result<i32> {
            if called(&mut caller, "proxy_close_stream") {
                return Ok(BAD_ARGUMENT);
            }
            caller.data_mut().effect(Effect::Close(kind));
            Ok(OK)
        },
    )?;
    Ok(())
}
