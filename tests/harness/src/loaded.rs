//! An upstream that reports its load: it answers `200 ok` to anything with
//! an ORCA load report, `endpoint-load-metrics: TEXT cpu_utilization=U`,
//! where the test sets `U` at will. The mock of a service under load, for
//! the shedding tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::response::IntoResponse;

use crate::Upstream;

pub struct LoadedUpstream {
    pub port: u16,
    load: Arc<AtomicU64>,
    _server: Upstream,
}

impl LoadedUpstream {
    /// Serves on a loopback port, reporting `load` until told otherwise.
    pub fn start(load: f64) -> anyhow::Result<LoadedUpstream> {
        let shared = Arc::new(AtomicU64::new(load.to_bits()));
        let reported = shared.clone();
        let app = axum::Router::new().fallback(move || {
            let load = f64::from_bits(reported.load(Ordering::SeqCst));
            async move {
                let report = format!("TEXT cpu_utilization={load}, mem_utilization=0.1");
                ([("endpoint-load-metrics", report)], "ok\n").into_response()
            }
        });
        let server = Upstream::serving(app)?;
        Ok(LoadedUpstream { port: server.port, load: shared, _server: server })
    }

    /// From now on, every answer reports `load`.
    pub fn set_load(&self, load: f64) {
        self.load.store(load.to_bits(), Ordering::SeqCst);
    }
}
