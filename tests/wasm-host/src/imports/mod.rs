//! The `env` host calls of proxy-wasm ABI 0.2.1, linked into one
//! [`wasmtime::Linker`] with the WASI preview1 imports from wasmtime-wasi.
//!
//! Each submodule links one group; each host call follows Envoy's behaviour,
//! statuses included, since the SDK panics on a status it does not expect.
//! Calls Sluice has no use for (gRPC, resolving another VM's shared queue,
//! foreign functions) trap
//! with a message naming them, so a filter that starts using one fails loudly
//! here instead of silently getting a wrong answer.

mod buffers;
mod headers;
mod misc;
mod queues;
mod stream;

use wasmtime::{Caller, Linker, Result};

use super::state::HostState;

/// proxy-wasm statuses (`proxy_wasm::types::Status`).
pub(crate) mod status {
    pub const OK: i32 = 0;
    pub const NOT_FOUND: i32 = 1;
    pub const BAD_ARGUMENT: i32 = 2;
    pub const EMPTY: i32 = 7;
    pub const CAS_MISMATCH: i32 = 8;
    pub const INTERNAL_FAILURE: i32 = 10;
}

/// Every host call sluice.wasm may import.
pub(crate) fn link(linker: &mut Linker<HostState>) -> Result<()> {
    wasmtime_wasi::p1::add_to_linker_sync(linker, |state: &mut HostState| &mut state.wasi)?;
    buffers::link(linker)?;
    headers::link(linker)?;
    stream::link(linker)?;
    misc::link(linker)?;
    queues::link(linker)?;
    unimplemented(linker)
}

/// Counts one call of `name` in the host's [`crate::Costs`]; every `env`
/// host call starts with it.
/// Counts a host call; true when the test's host refuses it
/// ([`crate::HostConfig::refusing`]): the import then answers BadArgument
/// and does nothing.
pub(crate) fn called(caller: &mut Caller<'_, HostState>, name: &'static str) -> bool {
    let fuel = caller.get_fuel().unwrap_or(0);
    let state = caller.data_mut();
    state.costs.call(&mut state.tracer, name, fuel);
    state.refused.contains(&name)
}

macro_rules! trap {
    ($linker:ident, $name:literal, ($($arg:ident),*)) => {
        $linker.func_wrap("env", $name, |_: Caller<'_, HostState>, $($arg: i32),*| -> Result<i32> {
            $(let _ = $arg;)*
            wasmtime::bail!(concat!("sluice.wasm called ", $name, ", which this host does not implement"))
        })?;
    };
}

fn unimplemented(linker: &mut Linker<HostState>) -> Result<()> {
    trap!(linker, "proxy_grpc_call", (a, b, c, d, e, f, g, h, i, j, k, l));
    trap!(linker, "proxy_grpc_stream", (a, b, c, d, e, f, g, h, i));
    trap!(linker, "proxy_grpc_send", (a, b, c, d));
    trap!(linker, "proxy_grpc_cancel", (a));
    trap!(linker, "proxy_grpc_close", (a));
    trap!(linker, "proxy_get_status", (a, b, c));
    trap!(linker, "proxy_resolve_shared_queue", (a, b, c, d, e));
    trap!(linker, "proxy_call_foreign_function", (a, b, c, d, e, f));
    Ok(())
}
