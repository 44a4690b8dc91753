//! The shim's HTTP endpoints. One port speaks HTTP/1.1 and HTTP/2 cleartext
//! with prior knowledge, so Envoy can multiplex every call over one connection.
//!
//! - `POST /v1/check`: a `CheckRequest`; answers 200 with a `CheckResponse`,
//!   400 for a malformed or oversized body, 503 when Redis fails.
//! - `GET /healthz`: 200 while the shim serves.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use sluice_policies::wire::{CheckRequest, CHECK_PATH};

use crate::limiter::{CheckError, Limiter};

/// The largest check body accepted.
pub const MAX_BODY: usize = 64 * 1024;

pub fn router(limiter: Limiter) -> Router {
    Router::new()
        .route(CHECK_PATH, post(check))
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
    axum::serve(listener, router(limiter))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| anyhow::anyhow!("server failed: {e}"))
}

async fn check(State(limiter): State<Arc<Limiter>>, body: Bytes) -> Response {
    let req: CheckRequest = match serde_json::from_slice(&body) {
        Ok(req) => req,
        Err(err) => return (StatusCode::BAD_REQUEST, format!("malformed check: {err}\n")).into_response(),
    };
    match limiter.check(&req).await {
        Ok(resp) => match serde_json::to_vec(&resp) {
            Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
            Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")).into_response(),
        },
        Err(CheckError::BadRequest(reason)) => {
            (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response()
        }
        Err(CheckError::Store(reason)) => {
            tracing::warn!(%reason, "check failed");
            (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response()
        }
    }
}
