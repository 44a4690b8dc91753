//! Header maps: get, pairs, set, add, replace, remove, for the request, the
//! response and the http call response.
//!
//! Envoy makes a map available only while it exists for the filter: the
//! request headers from `on_request_headers` until the request continues, the
//! response headers from `on_response_headers` on, the call response headers
//! during `on_http_call_response` (and not at all when the call failed). A map
//! that is not available is BadArgument, which the SDK turns into a panic;
//! during `on_log` both stream maps can be read, and a missing one is NotFound.
//! Trailers are not modelled: BadArgument.

use wasmtime::{Caller, Linker, Result};

use super::called;
use super::status::{BAD_ARGUMENT, NOT_FOUND, OK};
use crate::memory::{give, read, read_str};
use crate::pairs::HeaderMap;
use crate::state::HostState;

const REQUEST: i32 = 0;
const RESPONSE: i32 = 2;
const CALL_RESPONSE: i32 = 6;

/// The map of `kind`, or the status Envoy answers when it is not available.
fn map(state: &mut HostState, kind: i32, write: bool) -> std::result::Result<&mut HeaderMap, i32> {
    let in_log = state.in_log;
    let missing = if in_log && !write { NOT_FOUND } else { BAD_ARGUMENT };
    if kind == CALL_RESPONSE {
        return state.call_response.as_mut().map(|r| &mut r.headers).ok_or(BAD_ARGUMENT);
    }
    let Some(stream) = state.stream() else { return Err(BAD_ARGUMENT) };
    let readable_in_log = in_log && !write;
    match kind {
        REQUEST if stream.request_open || readable_in_log => Ok(&mut stream.request_headers),
        RESPONSE if stream.response_open || readable_in_log => Ok(&mut stream.response_headers),
        _ => Err(missing),
    }
}

pub(super) fn link(linker: &mut Linker<HostState>) -> Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut caller: Caller<'_, HostState>,
         kind: i32,
         key: i32,
         key_len: i32,
         ptr_out: i32,
         len_out: i32|
         -> Result<i32> {
            called(&mut caller, "proxy_get_header_map_value");
            let key = read_str(&mut caller, key, key_len)?;
            let value = match map(caller.data_mut(), kind, false) {
                Ok(map) => map.get(&key).map(<[u8]>::to_vec),
                Err(status) => return Ok(status),
            };
            match value {
                Some(value) => give(&mut caller, &value, ptr_out, len_out).map(|()| OK),
                None => Ok(NOT_FOUND),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut caller: Caller<'_, HostState>, kind: i32, ptr_out: i32, len_out: i32| -> Result<i32> {
            called(&mut caller, "proxy_get_header_map_pairs");
            let encoded = match map(caller.data_mut(), kind, false) {
                Ok(map) => map.encode(),
                Err(status) => return Ok(status),
            };
            give(&mut caller, &encoded, ptr_out, len_out).map(|()| OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut caller: Caller<'_, HostState>, kind: i32, ptr: i32, len: i32| -> Result<i32> {
            called(&mut caller, "proxy_set_header_map_pairs");
            let Some(pairs) = HeaderMap::decode(&read(&mut caller, ptr, len)?) else {
                return Ok(BAD_ARGUMENT);
            };
            Ok(match map(caller.data_mut(), kind, true) {
                Ok(map) => {
                    *map = pairs.pairs().iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
                    OK
                }
                Err(status) => status,
            })
        },
    )?;
    edit(linker, "proxy_add_header_map_value", |map, key, value| map.add(key, value))?;
    edit(linker, "proxy_replace_header_map_value", |map, key, value| map.replace(key, value))?;
    linker.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut caller: Caller<'_, HostState>, kind: i32, key: i32, key_len: i32| -> Result<i32> {
            called(&mut caller, "proxy_remove_header_map_value");
            let key = read_str(&mut caller, key, key_len)?;
            Ok(match map(caller.data_mut(), kind, true) {
                Ok(map) => {
                    map.remove(&key);
                    OK
                }
                Err(status) => status,
            })
        },
    )?;
    Ok(())
}

/// Links a `(kind, key, key_len, value, value_len)` host call that edits a map.
fn edit(
    linker: &mut Linker<HostState>,
    name: &'static str,
    apply: fn(&mut HeaderMap, &str, Vec<u8>),
) -> Result<()> {
    linker.func_wrap(
        "env",
        name,
        move |mut caller: Caller<'_, HostState>,
              kind: i32,
              key: i32,
              key_len: i32,
              value: i32,
              value_len: i32|
              -> Result<i32> {
            if called(&mut caller, name) {
                return Ok(BAD_ARGUMENT);
            }
            let key = read_str(&mut caller, key, key_len)?;
            let value = read(&mut caller, value, value_len)?;
            Ok(match map(caller.data_mut(), kind, true) {
                Ok(map) => {
                    apply(map, &key, value);
                    OK
                }
                Err(status) => status,
            })
        },
    )?;
    Ok(())
}
