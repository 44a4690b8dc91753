//! The operator's endpoints: the dashboard (`GET /`, `/dashboard.json`,
//! `/playground/`) and `GET /metrics`. They read every key's state and the
//! policy document, so they may be kept off the decision port
//! (`--admin-listen`: served only on a second listener) and may require a
//! bearer token (`--admin-token-file`). See `docs/security.md`.
//!
//! Also here: the deadline for a request body. `header_read_timeout` covers
//! only HTTP/1.1 headers; a client sending its body a byte a second would
//! otherwise hold its connection and a task for as long as it likes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::Router;
use subtle::ConstantTimeEq;

/// Where and how the operator's endpoints are served.
#[derive(Clone, Default)]
pub struct Options {
    /// A second listener serving only the operator's endpoints; `None`
    /// serves them on the decision listener.
    pub listener: Option<Arc<std::net::TcpListener>>,
    /// When set, each operator's request must carry
    /// `Authorization: Bearer <token>`; 401 otherwise.
    pub token: Option<Token>,
}

/// A bearer token. Its `Debug` hides it, so it cannot reach a log line.
#[derive(Clone)]
pub struct Token(Arc<[u8]>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<hidden>)")
    }
}

impl Token {
    /// Reads a token file; surrounding whitespace (the trailing newline) is
    /// not part of the token. An empty file is refused.
    pub fn read(path: &Path) -> anyhow::Result<Token> {
        let text = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("cannot read --admin-token-file {}: {e}", path.display()))?;
        let token = text.trim_ascii();
        if token.is_empty() {
            anyhow::bail!("--admin-token-file {} is empty", path.display());
        }
        Ok(Token(token.into()))
    }

    /// Whether an `Authorization` header value presents this token, in
    /// time independent of where the two differ.
    fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(presented) = authorization.and_then(|v| v.strip_prefix(b"Bearer ")) else {
            return false;
        };
        bool::from(presented.ct_eq(&self.0))
    }
}

/// `routes`, requiring the token when one is set.
pub fn guard(routes: Router, token: Option<Token>) -> Router {
    let Some(token) = token else { return routes };
    routes.layer(axum::middleware::from_fn(move |req: Request, next: Next| {
        let token = token.clone();
        async move {
            let authorization = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
            if token.admits(authorization) {
                next.run(req).await
            } else {
                (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    "a bearer token is required (--admin-token-file)\n",
                )
                    .into_response()
            }
        }
    }))
}

/// `routes` with each request's body read in full within `timeout` (408
/// otherwise, and the connection closed) and within `limit` bytes (413).
pub fn body_deadline(routes: Router, timeout: Duration, limit: usize) -> Router {
    routes.layer(axum::middleware::from_fn(move |req: Request, next: Next| async move {
        let (parts, body) = req.into_parts();
        match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
            Ok(Ok(bytes)) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
            Ok(Err(err)) => {
                let too_large = std::error::Error::source(&err)
                    .is_some_and(|e| e.is::<http_body_util::LengthLimitError>());
                if too_large {
                    (StatusCode::PAYLOAD_TOO_LARGE, format!("request body larger than {limit} bytes\n"))
                        .into_response()
                } else {
                    (StatusCode::BAD_REQUEST, "cannot read the request body\n").into_response()
                }
            }
            Err(_) => (
                StatusCode::REQUEST_TIMEOUT,
                [(header::CONNECTION, "close")],
                format!("request body not received within {} ms\n", timeout.as_millis()),
            )
                .into_response(),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_admitted_only_exactly() {
        let token = Token(b"s3cret".as_slice().into());
        assert!(token.admits(Some(b"Bearer s3cret")));
        assert!(!token.admits(Some(b"Bearer s3cre")));
        assert!(!token.admits(Some(b"Bearer s3cretx")));
        assert!(!token.admits(Some(b"Basic s3cret")));
        assert!(!token.admits(None));
        assert!(!format!("{token:?}").contains("s3cret"));
    }
}
