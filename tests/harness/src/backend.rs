//! The native side of a decision, without Envoy: a private Redis and the
//! shim in front of it, for tests that play the proxy themselves (the wasm
//! host) or talk to the shim directly.

use crate::{Redis, Shim};

/// Fields in drop order: the shim stops before its Redis.
pub struct Backend {
    pub shim: Shim,
    pub redis: Redis,
}

impl Backend {
    pub fn start() -> anyhow::Result<Backend> {
        let redis = Redis::start()?;
        let shim = Shim::start(&redis.url())?;
        Ok(Backend { shim, redis })
    }

    /// `http://127.0.0.1:PORT` of the shim.
    pub fn shim_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.shim.port)
    }
}
