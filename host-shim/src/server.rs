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
use axum::serve::ListenerExt;
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sluice_policies::wire::{
    AdjustRequest, CheckRequest, ReleaseRequest, ADJUST_PATH, CHECK_PATH, RELEASE_PATH,
};

use crate::limiter::{CheckError, Limiter};

/// The largest body accepted: the bound every valid document stays within.
pub use sluice_policies::bounds::MAX_BODY;

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
    // Answers are small: without TCP_NODELAY, Nagle's algorithm holds each
    // one back until the peer's delayed ACK, milliseconds per decision.
    let listener = listener.tap_io(|tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::warn!(%err, "cannot set TCP_NODELAY");
        }
    });
    axum::serve(listener, router(limiter))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| anyhow::anyhow!("server failed: {e}"))
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
