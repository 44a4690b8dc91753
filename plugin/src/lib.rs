//! The Sluice proxy-wasm filter: an adapter between the proxy and the
//! decision core in `sluice_core`. It turns host callbacks into flow and
//! worker events, and their effects into host calls; it decides nothing.
//!
//! # Layout
//!
//! Built for wasm32 only (the host calls exist nowhere else), but for
//! `ticker` and `name`, plain arithmetic and bytes tested natively:
//!
//! - `root`: the root context: parses the policy document once, in
//!   `on_configure`, and drives the [`sluice_core::Worker`] on its tick.
//! - `filter`: the HTTP context: drives one request's [`sluice_core::Flow`].
//! - `abi`: the host calls made after the configuration, over the ABI
//!   itself, so that a status the host refuses with is an error, not a
//!   panic (the SDK's wrappers panic on one they do not expect).
//! - `perform`: performs effects: calls to the shim, local replies,
//!   resumptions, response headers, stats.
//! - `host`: the request, shared data, the clock, the response headers and bodies,
//!   over host calls.
//! - `name`: a header's name as the request remembers it, in place.
//! - `vm`: what one VM shares between its requests: the worker, the stats.
//! - `ticker`: the root's timer, armed for when the next tick is needed.
//! - `wake`: the root woken at once from a stream's callback, through the
//!   VM's own shared queue.
//! - `stats`: the Envoy stats, one per name `sluice_core::stats` gives.

#[cfg(target_arch = "wasm32")]
mod abi;
#[cfg(target_arch = "wasm32")]
mod filter;
#[cfg(target_arch = "wasm32")]
mod host;
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
mod name;
#[cfg(target_arch = "wasm32")]
mod perform;
#[cfg(target_arch = "wasm32")]
mod root;
#[cfg(target_arch = "wasm32")]
mod stats;
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
mod ticker;
#[cfg(target_arch = "wasm32")]
mod vm;
#[cfg(target_arch = "wasm32")]
mod wake;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|context_id| Box::new(root::SluiceRoot::new(context_id)));
}}
