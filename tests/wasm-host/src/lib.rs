//! A proxy-wasm ABI 0.2.1 host on wasmtime that runs the real
//! `dist/sluice.wasm` through Envoy's request lifecycle: fast and
//! deterministic where Envoy is neither. Sluice must behave the same in both.
//!
//! # Layout
//!
//! - [`story`]: [`Plugin`], [`Stream`] and [`Step`]: tests as stories. Each
//!   step plays one callback and says what the filter should do; an
//!   expectation left unmet, or an effect left unexpected, fails the test.
//! - [`proxy`]: [`Proxy`], Envoy's side of the lifecycle (root context, streams,
//!   call delivery, stream end) returning each step's [`Outcome`]; property
//!   tests drive it directly.
//! - [`calls`]: `http_call` routing: the real shim over HTTP/2, or a scripted
//!   [`Answer`] modelling a broken shim ([`Fault`]).
//! - `vm`: one instance in a `Store<HostState>`; a trap becomes a [`Crash`].
//! - `module`: the Engine, Module and Linker, compiled once per test binary.
//! - `imports`: the `env` host calls, with Envoy's statuses; WASI preview1
//!   from wasmtime-wasi.
//! - `state`: [`HostState`], what the host knows, and the [`Effect`]s.
//! - `memory`: reading and writing guest memory, allocating in the guest.
//! - [`pairs`]: [`HeaderMap`] and the proxy-wasm map wire format.
//! - `properties`, [`shared_data`], [`metrics`]: the stores behind those calls.
//! - [`costs`]: [`Costs`], what the filter costs its host: host calls by
//!   name, bytes copied, wasm operators run, time in callbacks.
//! - [`shapes`]: requests of a few shapes played end to end, one at a time,
//!   for measuring the filter's cost per request (`benches/filter.rs`).

pub mod calls;
pub mod costs;
mod imports;
mod memory;
pub mod metrics;
mod module;
pub mod pairs;
mod properties;
pub mod proxy;
pub mod shapes;
pub mod shared_data;
mod state;
pub mod story;
mod vm;

pub use calls::HttpCall;
pub use calls::{Answer, Fault, Route};
pub use costs::{Costs, PerRequest};
pub use pairs::HeaderMap;
pub use proxy::{End, HostConfig, Outcome, Proxy, Returned};
pub use state::{Effect, HostState, LocalResponse, LogLevel, LogLine, MetricChange};
pub use story::{Plugin, Step, Stream};
pub use vm::Crash;
