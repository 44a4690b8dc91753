//! The whole Sluice path started together: Redis, the shim, the upstream and
//! Envoy running `sluice.wasm` with a given policy document.
//!
//! Fields drop in declaration order, so Envoy stops first and Redis last.

use crate::{Envoy, Redis, Shim, Upstream};

pub struct Stack {
    pub envoy: Envoy,
    pub shim: Shim,
    pub upstream: Upstream,
    pub redis: Redis,
}

impl Stack {
    pub fn start(policy_json: &str) -> anyhow::Result<Stack> {
        let redis = Redis::start()?;
        let shim = Shim::start(&redis.url())?;
        let upstream = Upstream::start()?;
        let envoy = Envoy::start(policy_json, shim.port, upstream.port)?;
        Ok(Stack { envoy, shim, upstream, redis })
    }
}
