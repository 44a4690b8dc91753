//! The mock service of scenario 6: an upstream with a fixed capacity that
//! load can exceed. It has `slots` slots of work; each request holds one
//! for `service`, so it serves at most `slots / service` requests a second.
//! Beyond the slots, requests wait in a first-come queue of `queue` places,
//! so latency grows with the backlog; beyond the queue, it answers 503 at
//! once (with `x-bench-upstream: full`, so the bench can tell its own
//! refusals from Sluice's sheds).
//!
//! Every answer reports the utilization in the ORCA header Envoy's load
//! balancers read, `endpoint-load-metrics: TEXT cpu_utilization=U`, where
//! `U` is the requests in the service (working or queued, the answering one
//! included) over `slots`, capped at 1. It runs on its own thread and Tokio
//! runtime, in the bench's process; dropping it stops it.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::sync::{oneshot, Semaphore};

/// The header on the upstream's own refusals.
pub(crate) const FULL_HEADER: &str = "x-bench-upstream";

pub(crate) struct Overloaded {
    pub(crate) port: u16,
    service: Arc<Service>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

struct Service {
    slots: u32,
    queue: u32,
    work: Duration,
    free: Semaphore,
    /// Requests working or queued.
    inside: AtomicU32,
}

impl Service {
    fn utilization(&self) -> f64 {
        (f64::from(self.inside.load(Ordering::SeqCst)) / f64::from(self.slots)).min(1.0)
    }
}

/// Counts a request in the service until dropped, even if its client goes
/// away mid-wait (axum then drops the handler's future).
struct Inside<'a>(&'a Service);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Overloaded {
    /// Binds 127.0.0.1:0 and serves with `slots` slots held `work` each and
    /// a queue of `queue` places.
    pub(crate) fn start(slots: u32, work: Duration, queue: u32) -> Result<Overloaded> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the overloaded upstream")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let service = Arc::new(Service {
            slots,
            queue,
            work,
            free: Semaphore::new(slots as usize),
            inside: AtomicU32::new(0),
        });
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (stop, stopped) = oneshot::channel();
        let served = service.clone();
        let thread = std::thread::Builder::new()
            .name("overloaded-upstream".into())
            .spawn(move || runtime.block_on(serve(listener, served, stopped)))?;
        Ok(Overloaded { port, service, stop: Some(stop), thread: Some(thread) })
    }

    /// The utilization an answer would report now.
    pub(crate) fn utilization(&self) -> f64 {
        self.service.utilization()
    }
}

async fn serve(listener: TcpListener, service: Arc<Service>, stopped: oneshot::Receiver<()>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => return eprintln!("bench: the overloaded upstream cannot listen: {err}"),
    };
    let app = axum::Router::new().fallback(handle).with_state(service);
    tokio::select! {
        result = axum::serve(listener, app) => {
            if let Err(err) = result {
                eprintln!("bench: the overloaded upstream stopped: {err}");
            }
        }
        _ = stopped => {}
    }
}

async fn handle(State(service): State<Arc<Service>>) -> Response {
    let before = service.inside.fetch_add(1, Ordering::SeqCst);
    let inside = Inside(&service);
    if before >= service.slots + service.queue {
        return answer(&service, StatusCode::SERVICE_UNAVAILABLE, "full\n");
    }
    // The semaphore is never closed, so this only fails if it were.
    let Ok(_slot) = service.free.acquire().await else {
        return answer(&service, StatusCode::SERVICE_UNAVAILABLE, "closed\n");
    };
    tokio::time::sleep(service.work).await;
    let response = answer(&service, StatusCode::OK, "ok\n");
    drop(inside);
    response
}

fn answer(service: &Service, status: StatusCode, body: &'static str) -> Response {
    let report = format!("TEXT cpu_utilization={:.3}", service.utilization());
    let mut headers = vec![("endpoint-load-metrics", report)];
    if status != StatusCode::OK {
        headers.push((FULL_HEADER, "full".to_string()));
    }
    (status, axum::response::AppendHeaders(headers), body).into_response()
}

impl Drop for Overloaded {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
