//! The Sluice shim: the native side of every decision, and the `sluice` CLI.
//!
//! # Layout
//!
//! - [`limiter`]: runs a check as one atomic Lua script call on Redis, and
//!   the releases and adjustments that follow.
//! - [`scripts`]: the Lua scripts, assembled from `lua/`.
//! - [`store`]: one Redis server or a Redis Cluster.
//! - [`keys`]: validates a check request and names its Redis keys.
//! - [`server`]: the HTTP endpoints the filter calls, over HTTP/1.1 and
//!   HTTP/2, in cleartext or mutual TLS; connection caps and deadlines.
//! - [`dashboard`]: `GET /`, the live Limits dashboard, and the playground at `/playground/`.
//! - [`metrics`]: `GET /metrics`: decisions, Redis latency, script errors, waiters.
//! - [`tls`]: rustls: the shim's mTLS server config, Redis's crypto provider.
//! - [`shed`]: the utilization shedder's fleet-wide state (`lua/shed.lua`).
//! - [`wait`]: egress waiting: reserve a slot, hold the answer until it, cancel.
//! - [`mixed`]: egress waiting on a concurrency slot and time slots together.
//! - [`queue`]: egress waiting on a concurrency slot: the FCFS queue, hand-over, timers.
//! - [`wakeups`]: the shim's one pub/sub subscriber that wakes queued requests.
//! - [`validate`]: `sluice validate FILE...`.
//! - [`simulate`]: `sluice simulate`, an access log replayed through a policy.
//! - [`envoy_config`]: `sluice envoy-config`, a complete envoy.yaml for a policy
//!   (rendered by the crate `sluice-envoy-config`).

pub mod dashboard;
pub mod envoy_config;
pub mod keys;
pub mod limiter;
pub mod metrics;
pub mod mixed;
pub mod queue;
pub mod scripts;
pub mod server;
pub mod shed;
pub mod simulate;
pub mod store;
pub mod tls;
pub mod validate;
pub mod wait;
pub mod wakeups;
