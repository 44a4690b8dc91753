//! The Sluice proxy-wasm filter: a thin adapter between the proxy and the
//! policy model in `sluice_policies`.
//!
//! # Layout
//!
//! - [`decision`]: turns the shim's answer into allow, deny or failure. Plain
//!   Rust, tested natively.
//! - `root`: the root context; parses the policy document once, in
//!   `on_configure`, and shares it with every request.
//! - `filter`: the HTTP context; matches, asks the shim, resumes or answers,
//!   then releases leases and adjusts points.
//! - `callout`: the calls to the shim.
//! - `host`: the request as the policy model reads it, over host calls.
//!
//! The modules that make host calls are built for wasm32 only.

pub mod decision;

#[cfg(target_arch = "wasm32")]
mod callout;
#[cfg(target_arch = "wasm32")]
mod filter;
#[cfg(target_arch = "wasm32")]
mod host;
#[cfg(target_arch = "wasm32")]
mod root;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|context_id| Box::new(root::SluiceRoot::new(context_id)));
}}
