//! The Sluice shim: the native side of every decision, and the `sluice`
//! binary (its offline tools are the crate `sluice-cli`).
//!
//! # Layout
//!
//! The modules fall into groups by what they do. Arrows between groups run
//! one way, down this list: a group uses only the groups below it.
//!
//! **Serving**: the request handler and what is around it.
//! - [`server`]: the HTTP endpoints the filter calls, over HTTP/1.1 and
//!   HTTP/2, in cleartext or mutual TLS; connection caps and deadlines.
//! - [`threads`]: `--listeners per-thread`: a listener, a runtime and a Redis
//!   connection per thread.
//! - [`grpc`]: the gRPC faces, Envoy's own rate-limit protocols (RLS), on
//!   `--grpc-listen`: translate to the policy document and the limiter.
//! - [`limiter`]: the request handler: runs a check as one atomic Lua script
//!   call on Redis, and the releases and adjustments that follow; hands
//!   waiting checks to the waiting group.
//! - [`batch`]: `POST /v1/checks`, many requests' checks in one call, each
//!   decided alone (shared callouts).
//! - [`dashboard`]: `GET /`, the live Limits dashboard, and the playground at `/playground/`.
//!
//! **Waiting**: egress waiting, given a [`wait::Waiting`] by the limiter.
//! - [`wait`]: hold a check until its slot: time slots, the FCFS queue for a
//!   concurrency slot, both together, and the wake-ups (its own layout).
//!
//! **Redis**: the store and the scripts run on it.
//! - [`store`]: [`store::RedisClient`], one Redis server or a Redis Cluster.
//! - [`shed`]: the utilization shedder's fleet-wide state (`lua/scripts/shed.lua`).
//! - [`scripts`]: the Lua scripts, assembled from `lua/`.
//! - [`eviction`]: whether Redis's eviction policy can reset limits.
//!
//! **Observing**: what the shim counts.
//! - [`metrics`]: `GET /metrics`: decisions, Redis latency, script errors,
//!   waiters; and per policy, the traffic the dashboard shows.
//!
//! **Vocabulary**: what the others speak; uses no other module.
//! - [`decision`]: a script's reply, its outcomes by check, and [`decision::CheckError`].
//! - [`keys`]: validates a check request and names its Redis keys.
//! - [`drain`]: the drain on SIGTERM as handlers and waiters see it.
//! - [`tls`]: rustls: the shim's mTLS server config, Redis's crypto provider.
//! - [`logs`]: log lines clients can reach: throttled per site, values escaped.

// The gRPC faces' futures (tonic around the limiter's check, which may
// wait) are deeper than the compiler's default layout query depth.
#![recursion_limit = "256"]

pub mod admin;
pub mod batch;
pub mod dashboard;
pub mod decision;
pub mod drain;
pub mod eviction;
pub mod grpc;
pub mod keys;
pub mod limiter;
pub mod logs;
pub mod metrics;
pub mod scripts;
pub mod server;
pub mod shed;
pub mod store;
pub mod threads;
pub mod tls;
pub mod wait;
