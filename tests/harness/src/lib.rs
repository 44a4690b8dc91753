//! The process harness for Sluice: starts the real parts (redis-server, the
//! `sluice` shim, an upstream, Envoy with `sluice.wasm`) as guarded child
//! processes, and sends traffic through them. The end-to-end tests
//! (`sluice-e2e`), the shim's tests, the wasm host, the bench and `cargo
//! xtask demo` all build on it. It runs the shim as a process (`dist/sluice`)
//! and renders Envoy's config with `sluice-envoy-config`, so it depends on
//! neither the shim crate nor wasmtime.
//!
//! # Layout
//!
//! - [`paths`]: where things are: the workspace, `dist/`, the envoy and
//!   redis-server binaries, free loopback ports.
//! - `process`: a child process with its own log file and scratch dir, waited
//!   on with deadlines and killed on drop (SIGTERM, then SIGKILL).
//! - `probe`: tiny blocking readiness probes (HTTP GET, Redis PING).
//! - [`redis`]: [`Redis`], a private `redis-server` on a free port; it can
//!   crash and come back on the same port, for fault tests.
//! - [`cluster`]: [`RedisCluster`], three private cluster masters, joined;
//!   or three masters with a replica each, for failover.
//! - [`sentinel`]: [`sentinel::RedisSentinel`], a master, a replica and
//!   three sentinels, for failover through Sentinel.
//! - [`shim`]: [`Shim`], `dist/sluice serve` pointed at a Redis or a Redis
//!   Cluster; it can crash and come back on the same port.
//! - [`upstream`]: [`Upstream`], an in-process HTTP server answering `ok`.
//! - [`loaded`]: [`loaded::LoadedUpstream`], an upstream reporting the load the test sets (ORCA).
//! - [`llm`]: [`llm::LlmUpstream`], a mock LLM provider in three API shapes,
//!   streamed in chunks of random sizes, with known true token counts; and a
//!   client that reads a stream to its end or its cut.
//! - [`envoy`]: [`Envoy`], `envoy/demo.yaml` rendered and run with a policy;
//!   it can crash (SIGKILL), for fault tests.
//! - [`partner`]: [`Partner`], a mock third-party API enforcing its own
//!   limits exactly (windows, interval, concurrency) and logging each call.
//! - [`backend`]: [`Backend`], Redis and the shim, without Envoy.
//! - [`stack`]: [`Stack`], all four started together, in a safe drop order.
//! - [`service`]: [`Service`], any other server binary on a free port.
//! - [`egress`]: [`Egress`], gateways sharing one Redis in front of a
//!   [`Partner`]; workers and single calls that say who answered and how
//!   long the gateway held them; what is left in Redis.
//! - [`client`]: [`burst`], N concurrent requests, collecting status,
//!   `retry-after` and `x-sluice-verdict`.
//! - [`demo`]: the demo's warm-up, traffic and table, by the gateway's verdicts.
//! - [`llm_demo`]: the token-budget demo's teams and table, judged by the
//!   mock provider's own count.
//! - [`faults`]: steady traffic under an injected fault, and its judges
//!   (admitted, refused, failed, longest wait, the busiest window).
//! - [`recorder`]: [`recorder::RecordingUpstream`], an upstream that records
//!   each request's arrival and end, to judge a limit from the far side.
//! - [`gateway`]: for the gateway-behaviour tests: whole responses, Envoy's
//!   Prometheus stats, a route timeout, and fault injectors (a blackhole
//!   shim, a fake shim, an upstream that fails or hangs).
//! - [`tls`]: [`tls::Pki`], a throwaway CA with server and client certificates.
//!
//! The proxy-wasm host on wasmtime that runs the real `sluice.wasm` in
//! process, and its tests, are the crate `sluice-wasm-host` (`tests/wasm-host/`):
//! `cargo xtask` depends on this crate, the process harness, and so compiles
//! no wasmtime.
//!
//! Every wait has a deadline, and every startup failure carries the tail of the
//! failing process's log. Nothing is left running when a guard is dropped, even
//! while a test panics.

pub mod backend;
pub mod client;
pub mod cluster;
pub mod demo;
pub mod egress;
pub mod envoy;
pub mod faults;
pub mod gateway;
pub mod llm;
pub mod llm_demo;
pub mod loaded;
pub mod partner;
pub mod paths;
mod probe;
mod process;
pub mod recorder;
pub mod redis;
pub mod sentinel;
pub mod service;
pub mod shim;
pub mod stack;
pub mod tls;
pub mod upstream;

pub use backend::Backend;
pub use client::{burst, HttpReply};
pub use cluster::RedisCluster;
pub use egress::Egress;
pub use envoy::Envoy;
pub use partner::Partner;
pub use paths::{dist, free_port, workspace_root};
pub use process::scratch_dir;
pub use redis::Redis;
pub use service::Service;
pub use shim::Shim;
pub use stack::Stack;
pub use upstream::Upstream;
