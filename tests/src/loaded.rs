//! An upstream that reports its load: it answers `200 ok` to anything with
//! an ORCA load report, `endpoint-load-metrics: TEXT cpu_utilization=U`,
//! where the test sets `U` at will. The mock of a service under load, for
//! the shedding tests. Its own thread and Tokio runtime keep callers
//! synchronous; dropping it stops it.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context;
use axum::response::IntoResponse;
use tokio::sync::oneshot;

pub struct LoadedUpstream {
    pub port: u16,
    load: Arc<AtomicU64>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl LoadedUpstream {
    /// Binds 127.0.0.1:0 and serves, reporting `load` until told otherwise.
    pub fn start(load: f64) -> anyhow::Result<LoadedUpstream> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the loaded upstream")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(AtomicU64::new(load.to_bits()));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (stop, stopped) = oneshot::channel();
        let reported = shared.clone();
        let thread = std::thread::Builder::new().name("loaded-upstream".into()).spawn(move || {
            runtime.block_on(serve(listener, reported, stopped));
        })?;
        Ok(LoadedUpstream { port, load: shared, stop: Some(stop), thread: Some(thread) })
    }

    /// From now on, every answer reports `load`.
    pub fn set_load(&self, load: f64) {
        self.load.store(load.to_bits(), Ordering::SeqCst);
    }
}

async fn serve(listener: TcpListener, load: Arc<AtomicU64>, stopped: oneshot::Receiver<()>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let app = axum::Router::new().fallback(move || {
        let load = f64::from_bits(load.load(Ordering::SeqCst));
        async move {
            let report = format!("TEXT cpu_utilization={load}, mem_utilization=0.1");
            ([("endpoint-load-metrics", report)], "ok\n").into_response()
        }
    });
    tokio::select! {
        result = axum::serve(listener, app) => {
            if let Err(err) = result {
                eprintln!("loaded upstream stopped: {err}");
            }
        }
        _ = stopped => {}
    }
}

impl Drop for LoadedUpstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
