//! The offline tools of the `sluice` binary: they read files and print,
//! and use nothing of the shim (no Redis, no server). The binary in
//! `host-shim/` parses the arguments and calls them.
//!
//! # Layout
//!
//! - [`validate`]: `sluice validate FILE...`, and the document `sluice
//!   serve --policy` reads.
//! - [`import`]: `sluice import`, an envoyproxy/ratelimit configuration or a
//!   Limitador limits file as a policy document for the RLS face.
//! - [`simulate`]: `sluice simulate`, an access log replayed through a policy.
//! - [`envoy_config`]: `sluice envoy-config`, a complete envoy.yaml for a
//!   policy (rendered by the crate `sluice-envoy-config`).

pub mod envoy_config;
pub mod import;
pub mod simulate;
pub mod validate;
