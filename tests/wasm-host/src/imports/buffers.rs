//! Buffers: the plugin configuration (during `on_configure` only, as Envoy
//! hands it out), the http call response body (during
//! `on_http_call_response` only), and the stream's request and response
//! bodies as the host holds them (the chunk being handled, with what
//! earlier paused callbacks buffered). A buffer the host does not have is
//! NotFound, as in Envoy.
//!
//! Setting a stream body follows Envoy's rules: from 0 over at least the
//! whole buffer replaces it, at 0 with nothing prepends, at or past its end
//! appends; anything else is BadArgument.
//!
//! Envoy clips a read to the end of the buffer, and a read of nothing returns
//! Ok without a pointer, which the SDK reads as "no data".

use wasmtime::{Caller, Linker, Result};

use super::called;
use super::status::{BAD_ARGUMENT, NOT_FOUND, OK};
use crate::memory::{give, read};
use crate::state::HostState;

const HTTP_REQUEST_BODY: i32 = 0;
const HTTP_RESPONSE_BODY: i32 = 1;
const HTTP_CALL_RESPONSE_BODY: i32 = 4;
const VM_CONFIGURATION: i32 = 6;
const PLUGIN_CONFIGURATION: i32 = 7;

fn buffer(state: &HostState, kind: i32) -> Option<&[u8]> {
    let stream = state.streams.get(&state.effective);
    match kind {
        HTTP_REQUEST_BODY => stream.map(|s| s.request_body.as_slice()),
        HTTP_RESPONSE_BODY => stream.map(|s| s.response_body.as_slice()),
        HTTP_CALL_RESPONSE_BODY => state.call_response.as_ref().map(|r| r.body.as_slice()),
        PLUGIN_CONFIGURATION if state.configuring => Some(&state.plugin_configuration),
        VM_CONFIGURATION => Some(&[]),
        _ => None,
    }
}

pub(super) fn link(linker: &mut Linker<HostState>) -> Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut caller: Caller<'_, HostState>,
         kind: i32,
         start: i32,
         max: i32,
         ptr_out: i32,
         len_out: i32|
         -> Result<i32> {
            called(&mut caller, "proxy_get_buffer_bytes");
            let Some(buffer) = buffer(caller.data(), kind) else { return Ok(NOT_FOUND) };
            let (start, max) = (start as u32 as usize, max as u32 as usize);
            if start > buffer.len() {
                return Ok(BAD_ARGUMENT);
            }
            let end = start.saturating_add(max).min(buffer.len());
            let bytes = buffer[start..end].to_vec();
            if !bytes.is_empty() {
                give(&mut caller, &bytes, ptr_out, len_out)?;
            }
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut caller: Caller<'_, HostState>,
         kind: i32,
         start: i32,
         len: i32,
         ptr: i32,
         size: i32|
         -> Result<i32> {
            if called(&mut caller, "proxy_set_buffer_bytes") {
                return Ok(BAD_ARGUMENT);
            }
            let data = read(&mut caller, ptr, size)?;
            let state = caller.data_mut();
            let Some(stream) = state.streams.get_mut(&state.effective) else { return Ok(NOT_FOUND) };
            let buffer = match kind {
                HTTP_REQUEST_BODY => &mut stream.request_body,
                HTTP_RESPONSE_BODY => &mut stream.response_body,
                _ => return Ok(NOT_FOUND),
            };
            let (start, len) = (start as u32 as usize, len as u32 as usize);
            if start == 0 && len >= buffer.len() {
                *buffer = data;
            } else if start == 0 && len == 0 {
                buffer.splice(0..0, data);
            } else if start >= buffer.len() {
                buffer.extend_from_slice(&data);
            } else {
                return Ok(BAD_ARGUMENT);
            }
            Ok(OK)
        },
    )?;
    Ok(())
}
