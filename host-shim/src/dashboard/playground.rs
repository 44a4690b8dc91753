//! The policy playground at `/playground/`: the static site `cargo xtask
//! playground` builds (`dist/playground/`), served from a directory. It is
//! not embedded, so building the shim never needs the wasm-bindgen build;
//! without the directory, `/playground/` answers 404 with how to get it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use tower_http::services::ServeDir;

/// `playground/` beside the running binary: `dist/playground` for `dist/sluice`.
pub fn beside_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.join("playground"))
}

pub fn routes(dir: Option<PathBuf>) -> Router {
    // The page's links are relative: `/playground` must become `/playground/`.
    Router::new()
        .route("/playground", get(|| async { Redirect::permanent("/playground/") }))
        .route("/playground/", get(serve))
        .route("/playground/{*file}", get(serve))
        .with_state(Arc::new(dir))
}

async fn serve(State(dir): State<Arc<Option<PathBuf>>>, req: Request) -> Response {
    let Some(dir) = dir.as_deref().filter(|d| d.join("index.html").is_file()) else {
        return missing(dir.as_deref());
    };
    // ServeDir serves the request's path under `dir`: strip the prefix.
    let (mut parts, body) = req.into_parts();
    let inner = parts.uri.path().strip_prefix("/playground").unwrap_or("/");
    parts.uri = match inner.parse::<Uri>() {
        Ok(uri) => uri,
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    match ServeDir::new(dir).try_call(Request::from_parts(parts, body)).await {
        Ok(resp) => resp.into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")).into_response(),
    }
}

fn missing(dir: Option<&Path>) -> Response {
    let looked = match dir {
        Some(dir) => format!("<p>No playground in <code>{}</code>.</p>", escape(&dir.display().to_string())),
        None => "<p>No playground directory was given.</p>".to_string(),
    };
    let page = format!(
        "<!doctype html><meta charset=utf-8><title>Sluice: no playground</title>\
         <h1>The policy playground is not here</h1>{looked}\
         <p>Build it with <code>cargo xtask playground</code> (it writes <code>dist/playground/</code>, \
         which <code>dist/sluice</code> serves by default), or start the shim with \
         <code>sluice serve --playground DIR</code>.</p><p><a href=\"/\">The Limits dashboard</a></p>\n"
    );
    (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
