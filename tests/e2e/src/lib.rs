//! Sluice end to end: the tests in `tests/` drive the real parts (Envoy
//! running `sluice.wasm`, the `sluice` shim, redis-server, mock upstreams and
//! partners) through the process harness, the crate `sluice-harness`. This
//! library is empty; the crate exists for its tests.
//!
//! # Layout
//!
//! - `envoy_e2e`: the S0 dual window through every real part.
//! - `envoy_gateway`: what a client and an operator see at the gateway.
//! - `envoy_failures`: when the shim cannot decide.
//! - `envoy_leases`: concurrency leases, released exactly once.
//! - `envoy_leased`: leased mode, two Envoys sharing one shim and Redis.
//! - `envoy_secure`: mutual TLS to the shim, with the rendered template.
//! - `envoy_waiting`: egress waiting held before the router.
//! - `egress_wait`: the egress `wait` policy against a strict partner.
//! - `upstream_feedback`: the partner's "slow down" pausing a key on every gateway.
//! - `shedding`: load shedding.
//! - `faults`: steady traffic while one part fails.
//! - `torture`: 64 concurrent clients against one key through the shim.
