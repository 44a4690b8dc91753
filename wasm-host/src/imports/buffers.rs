//! Buffers: the plugin configuration (during `on_configure` only, as Envoy
//! hands it out) and the http call response body (during
//! `on_http_call_response` only). Bodies of the stream itself are not
//! modelled: NotFound, as Envoy answers for a buffer it does not have.
//!
//! Envoy clips a read to the end of the buffer, and a read of nothing returns
//! Ok without a pointer, which the SDK reads as "no data".

use wasmtime::{Caller, Linker, Result};

use super::called;
use super::status::{BAD_ARGUMENT, NOT_FOUND, OK};
use crate::memory::give;
use crate::state::HostState;

const HTTP_CALL_RESPONSE_BODY: i32 = 4;
const VM_CONFIGURATION: i32 = 6;
const PLUGIN_CONFIGURATION: i32 = 7;

fn buffer(state: &HostState, kind: i32) -> Option<&[u8]> {
    match kind {
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
         _kind: i32,
         _start: i32,
         _len: i32,
         _ptr: i32,
         _size: i32|
         -> Result<i32> {
            called(&mut caller, "proxy_set_buffer_bytes");
            Ok(NOT_FOUND)
        },
    )?;
    Ok(())
}
