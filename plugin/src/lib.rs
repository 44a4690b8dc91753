//! The Sluice proxy-wasm filter: a thin adapter between the proxy and the
//! policy model in `sluice_policies`.
//!
//! # Layout
//!
//! Plain Rust, tested natively:
//!
//! - [`decision`]: reads the shim's answer, or why it is none.
//! - [`feedback`]: which policies a response's upstream answer pauses.
//! - [`reply`]: the local responses: a policy's denial, a failure, a missing key.
//! - [`ratelimit_headers`]: the IETF `RateLimit` and `RateLimit-Policy` headers.
//! - [`cache`]: the over-limit cache over a small store trait (Envoy shared data).
//! - [`breaker`]: the outage breaker, over an injected clock.
//! - [`throttle`]: a log line an outage cannot turn into a flood.
//! - [`leased`]: leased mode: the pool of a leased policy's tokens the workers spend.
//! - [`leases`]: the leases of live streams, and when each is due for renewal.
//! - [`shedding`]: load shedding in one worker: its reports, the fleet's level.
//! - [`wait`]: egress waiting: the request's wait, the held call's timeout,
//!   `server-timing`, lease overages.
//!
//! Over host calls, built for wasm32 only:
//!
//! - `root`: the root context; parses the policy document once, in
//!   `on_configure`; sends queued release and adjust calls, lease
//!   renewals, and leased mode's lease calls, on its tick.
//! - `vm`: what one VM (one worker) shares between requests.
//! - `filter`: the HTTP context; matches, decides locally or asks the shim,
//!   resumes or answers, adds headers, queues releases and adjustments.
//! - `call`: one check call of a request and what it leaves to do.
//! - `callout`: the calls to the shim.
//! - `stats`: the Envoy stats.
//! - `host`: the request, shared data and the clock, over host calls.

pub mod breaker;
pub mod cache;
pub mod decision;
pub mod feedback;
pub mod leased;
pub mod leases;
pub mod ratelimit_headers;
pub mod reply;
pub mod shedding;
pub mod throttle;
pub mod wait;

#[cfg(target_arch = "wasm32")]
mod call;
#[cfg(target_arch = "wasm32")]
mod callout;
#[cfg(target_arch = "wasm32")]
mod filter;
#[cfg(target_arch = "wasm32")]
mod host;
#[cfg(target_arch = "wasm32")]
mod root;
#[cfg(target_arch = "wasm32")]
mod stats;
#[cfg(target_arch = "wasm32")]
mod vm;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_context_id| Box::new(root::SluiceRoot::new()));
}}
