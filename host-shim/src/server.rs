//! The shim's HTTP endpoints. One port speaks HTTP/1.1 and HTTP/2 cleartext
//! with prior knowledge, so Envoy can multiplex every call over one connection.
//!
//! - `POST /v1/check`, `/v1/release`, `/v1/adjust`: see `sluice_policies::wire`.
//!   Each answers 200 with JSON, 400 for a malformed or oversized body, 503
//!   when Redis fails.
//! - `GET /healthz`: 200 while the shim serves.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sluice_policies::wire::{
    AdjustRequest, CheckRequest, ReleaseRequest, ADJUST_PATH, CHECK_PATH, RELEASE_PATH,
};

use crate::limiter::{CheckError, Limiter};

/// The largest check body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// HTTP/2 streams one connection may have open at once. Hyper's default
/// (200) is too low for egress waiting: Envoy multiplexes every call of a
/// worker over one connection, and a shim may hold hundreds of waiting
/// checks per connection, each an open stream until its slot comes.
pub const MAX_STREAMS: u32 = 10_000;

pub fn router(limiter: Limiter) -> Router {
    Router::new()
        .route(CHECK_PATH, post(check))
        .route(RELEASE_PATH, post(release))
        .route(ADJUST_PATH, post(adjust))
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(Arc::new(limiter))
}

/// Serves until `shutdown` completes, then finishes the requests in flight.
pub async fn run(
    listener: tokio::net::TcpListener,
    limiter: Limiter,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = router(limiter);
    // Each connection holds a receiver; all dropped means all are done.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(err) => {
                    // Out of file descriptors and the like: wait, do not spin.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Answers are small: without TCP_NODELAY, Nagle's algorithm holds each
        // one back until the peer's delayed ACK, milliseconds per decision.
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::warn!(%err, "cannot set TCP_NODELAY");
        }
        let service = TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut builder = Builder::new(TokioExecutor::new());
            builder.http2().max_concurrent_streams(MAX_STREAMS);
            let conn = builder.serve_connection(TokioIo::new(tcp), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(err) = result {
                        tracing::debug!(%err, "connection ended");
                    }
                    return;
                }
                _ = stop.changed() => conn.as_mut().graceful_shutdown(),
            }
            if let Err(err) = conn.await {
                tracing::debug!(%err, "connection ended");
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(stop_rx);
    stop_tx.closed().await;
    Ok(())
}

async fn check(State(limiter): State<Arc<Limiter>>, body: Bytes) -> Response {
    match parse::<CheckRequest<'static>>(&body) {
        Ok(req) => answer(limiter.check(&req).await),
        Err(resp) => resp,
    }
}

async fn release(State(limiter): State<Arc<Limiter>>, body: Bytes) -> Response {
    match parse::<ReleaseRequest>(&body) {
        Ok(req) => answer(limiter.release(&req).await),
        Err(resp) => resp,
    }
}

async fn adjust(State(limiter): State<Arc<Limiter>>, body: Bytes) -> Response {
    match parse::<AdjustRequest>(&body) {
        Ok(req) => answer(limiter.adjust(&req).await.map(|()| serde_json::json!({}))),
        Err(resp) => resp,
    }
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Response> {
    serde_json::from_slice(body)
        .map_err(|err| (StatusCode::BAD_REQUEST, format!("malformed request: {err}\n")).into_response())
}

fn answer<T: Serialize>(result: Result<T, CheckError>) -> Response {
    match result {
        Ok(value) => match serde_json::to_vec(&value) {
            Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
            Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")).into_response(),
        },
        Err(CheckError::BadRequest(reason)) => {
            (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response()
        }
        Err(CheckError::Store(reason)) => {
            tracing::warn!(%reason, "redis call failed");
            (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response()
        }
    }
}
