//! The upstream behind Envoy: an in-process HTTP/1.1 server answering
//! `200 ok\n` to anything, on its own thread and Tokio runtime so callers stay
//! synchronous. Dropping it stops the runtime, closing every connection.

use std::net::TcpListener;
use std::thread::JoinHandle;

use anyhow::Context;
use tokio::sync::oneshot;

pub struct Upstream {
    pub port: u16,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Upstream {
    /// Binds 127.0.0.1:0 (so the port is ours before this returns) and serves.
    pub fn start() -> anyhow::Result<Upstream> {
        Upstream::serving(axum::Router::new().fallback(|| async { "ok\n" }))
    }

    /// As [`Upstream::start`], answering with `app`.
    pub fn serving(app: axum::Router) -> anyhow::Result<Upstream> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the upstream")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new().name("upstream".into()).spawn(move || {
            runtime.block_on(serve(listener, app, stopped));
        })?;
        Ok(Upstream { port, stop: Some(stop), thread: Some(thread) })
    }
}

async fn serve(listener: TcpListener, app: axum::Router, stopped: oneshot::Receiver<()>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    tokio::select! {
        result = axum::serve(listener, app) => {
            if let Err(err) = result {
                eprintln!("upstream stopped: {err}");
            }
        }
        _ = stopped => {}
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
