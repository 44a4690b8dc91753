//! The shim's HTTP endpoints. One port speaks HTTP/1.1 and HTTP/2 (prior
//! knowledge in cleartext, ALPN over TLS), so Envoy can multiplex every call
//! over one connection. With [`Options::tls`] every client must present a
//! certificate signed by the configured CA (see [`crate::tls`]).
//!
//! The accept loop is hyper-util's, not `axum::serve`, for what a port open
//! to a network needs: a cap on concurrent connections, and a deadline for a
//! new connection's first bytes (or TLS handshake) and for HTTP/1.1 headers.
//!
//! - `POST /v1/check`, `/v1/release`, `/v1/renew`, `/v1/adjust`, `/v1/feedback`,
//!   `/v1/shed`, `/v1/lease`: see `sluice_policies::wire`.
//!   Each answers 200 with JSON, 400 for a malformed or oversized body, 503
//!   when Redis fails.
//! - `POST /v1/checks`: many checks in one call, each decided as `/v1/check`
//!   would, answered with each one's status and body ([`crate::batch`]).
//! - `POST /v1/report`: failure-mode passes a filter let through, counted in
//!   the dashboard's history when received (no Redis); 200 and `{}`, 400 for
//!   a malformed body, one over `MAX_REPORT_BODY` bytes or
//!   `MAX_REPORT_ENTRIES` entries, or an invalid policy name.
//! - `GET /healthz`: 200 while the shim serves, with a warning line while
//!   Redis's eviction policy can reset limits.
//! - `GET /metrics`: see [`crate::metrics`].
//! - `GET /`, `/dashboard.json`, `/playground/`: see [`crate::dashboard`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::future::Either;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sluice_policies::wire::{
    AdjustRequest, Answered, BatchAnswer, CheckBatch, CheckRequest, Encoding, FeedbackRequest, LeaseRequest,
    ReleaseRequest, RenewRequest, ReportRequest, ShedRequest, ADJUST_PATH, BATCH_PATH, CHECK_PATH,
    FEEDBACK_PATH, JSON_CONTENT_TYPE, LEASE_PATH, MAX_REPORT_BODY, PROTOCOL_HEADER, PROTOCOL_VERSION,
    RELEASE_PATH, RENEW_PATH, REPORT_PATH, SHED_PATH,
};

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::limiter::{CheckError, Limiter};
use crate::logs::Throttled;

/// The largest body accepted: the bound every valid document stays within.
pub use sluice_policies::bounds::{MAX_BATCH_BODY, MAX_BODY};

/// The decision routes (with `/healthz`) and the operator's routes (the
/// dashboard and `/metrics`, see [`crate::admin`]), apart.
pub fn routers(limiter: Arc<Limiter>, dashboard: crate::dashboard::Options) -> (Router, Router) {
    let pages = crate::dashboard::routes(&limiter, dashboard);
    let metrics = limiter.metrics.clone();
    let app = Router::new()
        .route(CHECK_PATH, post(check))
        .route(BATCH_PATH, post(batch).layer(DefaultBodyLimit::max(MAX_BATCH_BODY)))
        .route(RELEASE_PATH, post(release))
        .route(RENEW_PATH, post(renew))
        .route(SHED_PATH, post(shed))
        .route(ADJUST_PATH, post(adjust))
        .route(FEEDBACK_PATH, post(feedback))
        .route(LEASE_PATH, post(lease))
        .route(REPORT_PATH, post(report))
        .layer(SameProtocol)
        .route("/healthz", get(healthz))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(limiter);
    (crate::metrics::count(app, metrics.clone()), crate::metrics::page_route(metrics).merge(pages))
}

/// `GET /healthz`: 200 while the shim serves, with a warning line while
/// Redis's eviction policy can reset limits (see [`crate::eviction`]); 503
/// `draining` once SIGTERM came, so health checks take it out of rotation.
async fn healthz(State(limiter): State<Arc<Limiter>>) -> Response {
    if limiter.drain().is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response();
    }
    match limiter.eviction.warning() {
        Some(warning) => format!("ok\nwarning: {warning}\n").into_response(),
        None => "ok\n".into_response(),
    }
}

/// Aborts a background task when the server it belongs to stops.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Refuses a call whose `x-sluice-protocol` names another version of the
/// wire than this shim's: 400, naming both, instead of a misread. A call
/// without the header (`curl`, a debugging client) is served.
///
/// A plain tower layer, not `axum::middleware::from_fn`: that boxes the
/// inner service and every request's future, a cost each check paid
/// (docs/performance.md, "Levers measured").
#[derive(Clone, Copy)]
struct SameProtocol;

impl<S> tower_layer::Layer<S> for SameProtocol {
    type Service = SameProtocolService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        SameProtocolService(inner)
    }
}

#[derive(Clone)]
struct SameProtocolService<S>(S);

impl<S> tower_service::Service<axum::extract::Request> for SameProtocolService<S>
where
    S: tower_service::Service<axum::extract::Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Either<std::future::Ready<Result<Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: axum::extract::Request) -> Self::Future {
        match req.headers().get(PROTOCOL_HEADER) {
            Some(v) if v.as_bytes() != PROTOCOL_VERSION.as_bytes() => {
                Either::Left(std::future::ready(Ok(mismatch(&String::from_utf8_lossy(v.as_bytes())))))
            }
            _ => Either::Right(self.0.call(req)),
        }
    }
}

fn mismatch(theirs: &str) -> Response {
    let reason = format!(
        "protocol version mismatch: the caller speaks {theirs:?}, this shim speaks {PROTOCOL_VERSION:?}; \
         run a filter and a shim of the same release"
    );
    warn_mismatch(&reason);
    (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response()
}

/// At most one mismatch line a minute: every call of a mismatched fleet
/// meets it, and the filter logs each too.
static MISMATCH_LOG: Throttled = Throttled::per_minute();

fn warn_mismatch(line: &str) {
    if let Some(suppressed) = MISMATCH_LOG.admit() {
        tracing::warn!(suppressed, "{line}");
    }
}

/// Every check fails while Redis is down: one line a minute says so.
static REDIS_FAILED_LOG: Throttled = Throttled::per_minute();

/// HTTP/2 streams one connection may have open at once. Hyper's default
/// (200) is too low for egress waiting: Envoy multiplexes every call of a
/// worker over one connection, and a shim may hold hundreds of waiting
/// checks per connection, each an open stream until its slot comes.
pub const MAX_STREAMS: u32 = 10_000;

/// How the shim accepts connections.
#[derive(Clone)]
pub struct Options {
    /// Mutual TLS; `None` serves cleartext.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The most connections served at once; further ones wait in the
    /// listen backlog until one closes. Connections, not streams: one HTTP/2
    /// connection from Envoy carries any number of calls.
    pub max_connections: usize,
    /// How long a new connection may take to send its first byte (cleartext)
    /// or complete its TLS handshake, and an HTTP/1.1 request its headers.
    pub header_read_timeout: Duration,
    /// How long a request may take to send its body, once its headers came.
    pub body_read_timeout: Duration,
    /// The dashboard's policy document and playground directory.
    pub dashboard: crate::dashboard::Options,
    /// The dashboard's and `/metrics`' own listener and token.
    pub admin: crate::admin::Options,
    /// On shutdown, how long the shim keeps accepting and serving while
    /// `/healthz` answers 503, so health checks take it out of rotation.
    pub drain_delay: Duration,
    /// Then, the longest the drain may take: answering what is in flight,
    /// serving or refusing the waiters, giving their reservations back.
    pub drain_timeout: Duration,
    /// Of the drain timeout, what is kept after the last hold for giving
    /// reservations back (a Redis call: the Redis timeout).
    pub give_back_time: Duration,
}

/// The default of `--drain-timeout-ms`: under Kubernetes' default grace
/// period of 30 s with room for a drain delay.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

impl Default for Options {
    fn default() -> Self {
        Options {
            tls: None,
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            dashboard: Default::default(),
            admin: Default::default(),
            drain_delay: Duration::ZERO,
            drain_timeout: DRAIN_TIMEOUT,
            give_back_time: Duration::from_secs(1),
        }
    }
}

/// Where the shim accepts connections: TCP, or a Unix socket for an Envoy
/// on the same host (see `sluice_envoy_config::ShimAddress`).
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Self {
        Listener::Tcp(listener)
    }
}

impl From<UnixListener> for Listener {
    fn from(listener: UnixListener) -> Self {
        Listener::Unix(listener)
    }
}

/// One accepted connection, and who it came from (for the log).
enum Accepted {
    Tcp(TcpStream, std::net::SocketAddr),
    Unix(UnixStream),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Accepted> {
        match self {
            Listener::Tcp(listener) => {
                let (tcp, peer) = listener.accept().await?;
                // Answers are small: without TCP_NODELAY, Nagle's algorithm holds each
                // one back until the peer's delayed ACK, milliseconds per decision.
                if let Err(err) = tcp.set_nodelay(true) {
                    tracing::warn!(%err, "cannot set TCP_NODELAY");
                }
                Ok(Accepted::Tcp(tcp, peer))
            }
            Listener::Unix(listener) => Ok(Accepted::Unix(listener.accept().await?.0)),
        }
    }
}

/// Serves until `shutdown` completes, then drains (see [`crate::drain`]):
/// `/healthz` says draining and the shim serves on for the drain delay;
/// then it stops accepting, answers what is in flight, hands each waiter
/// its outcome, gives back what they held, and returns, within the drain
/// timeout.
pub async fn run(
    listener: impl Into<Listener>,
    limiter: Limiter,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    run_shared(listener, Arc::new(limiter), options, shutdown).await
}

/// [`run`], for a limiter the gRPC faces share.
pub async fn run_shared(
    listener: impl Into<Listener>,
    limiter: Arc<Limiter>,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let watcher = crate::eviction::watch(limiter.eviction.clone(), limiter.store.clone());
    let _stop_watching = AbortOnDrop(watcher);
    run_another(listener, limiter, options, shutdown).await
}

/// [`run_shared`] without its watch of Redis's eviction policy: a further
/// listener of the same shim, on a thread of its own (`--listeners
/// per-thread`, see [`crate::threads`]).
pub async fn run_another(
    listener: impl Into<Listener>,
    limiter: Arc<Limiter>,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let drain = limiter.drain().clone();
    let delay = options.drain_delay;
    let announced = drain.clone();
    let shutdown = async move {
        shutdown.await;
        announced.announce();
        if !delay.is_zero() {
            tracing::info!(
                delay_ms = delay.as_millis(),
                "draining: /healthz answers 503; serving on for the drain delay"
            );
            tokio::time::sleep(delay).await;
        }
    };
    let (decisions, admin) = routers(limiter, options.dashboard.clone());
    let decisions = crate::admin::body_deadline(decisions, options.body_read_timeout, MAX_BODY);
    let admin = crate::admin::guard(admin, options.admin.token.clone());
    let (app, admin) = match &options.admin.listener {
        Some(listener) => {
            let listener = listener.try_clone()?;
            listener.set_nonblocking(true)?;
            (decisions, Some((Listener::from(TcpListener::from_std(listener)?), admin)))
        }
        None => (decisions.merge(admin), None),
    };
    serve(listener, app, options, shutdown, drain, admin).await
}

/// Serves `app` on `listener` as [`Options`] say (TLS, connection cap,
/// deadlines) until `shutdown` completes, then drains through `drain`. The
/// HTTP endpoints and the gRPC faces ([`crate::grpc`]) alike. `admin`: the
/// operator's routes on a listener of their own ([`crate::admin`]), served
/// until the main loop ends.
pub async fn serve(
    listener: impl Into<Listener>,
    app: Router,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Arc<crate::drain::Drain>,
    admin: Option<(Listener, Router)>,
) -> anyhow::Result<()> {
    let listener: Listener = listener.into();
    let acceptor = options.tls.clone().map(TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(options.header_read_timeout);
    builder
        .http2()
        .max_concurrent_streams(MAX_STREAMS)
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    let connection = |app: &Router| Connection {
        builder: builder.clone(),
        app: app.clone(),
        acceptor: acceptor.clone(),
        watcher: graceful.watcher(),
        timeout: options.header_read_timeout,
    };
    let serving = accept_loop(listener, options.max_connections, shutdown, || connection(&app));
    match admin {
        // The admin loop ends with the main loop, at shutdown.
        Some((listener, admin)) => tokio::select! {
            () = serving => {}
            () = accept_loop(listener, options.max_connections, std::future::pending(), || connection(&admin)) => {}
        },
        None => serving.await,
    }
    let started = std::time::Instant::now();
    let hold_until = started + options.drain_timeout.saturating_sub(options.give_back_time);
    drain.close(hold_until);
    tracing::info!(
        timeout_ms = options.drain_timeout.as_millis(),
        "draining: stopped accepting; answering what is in flight"
    );
    let deadline = started + options.drain_timeout;
    if tokio::time::timeout_at(deadline.into(), graceful.shutdown()).await.is_err() {
        tracing::warn!("drain timeout: connections still open are closed with their calls unanswered");
    }
    // The give-backs of clients gone away (spawned by their guards) run
    // before the process exits, so no reservation or queue place is left.
    let last = deadline.max(std::time::Instant::now() + options.give_back_time);
    if tokio::time::timeout_at(last.into(), drain.idle()).await.is_err() {
        tracing::warn!(
            pending = drain.pending(),
            "drain timeout: give-backs still running are abandoned; their reservations expire by their TTL"
        );
    }
    tracing::info!(took_ms = started.elapsed().as_millis(), "drained");
    Ok(())
}

/// A connection's stream: TCP or a Unix socket.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {
    /// Waits for the client's first bytes: false if it closed first.
    fn first_bytes(&self) -> impl Future<Output = std::io::Result<bool>> + Send;
}

impl Stream for TcpStream {
    async fn first_bytes(&self) -> std::io::Result<bool> {
        let mut first = [0u8; 1];
        Ok(self.peek(&mut first).await? > 0)
    }
}

impl Stream for UnixStream {
    async fn first_bytes(&self) -> std::io::Result<bool> {
        // Tokio's Unix stream has no `peek`: readable is bytes or the end,
        // and hyper reads the end as a close.
        self.readable().await.map(|()| true)
    }
}

/// Accepts connections from `listener` and serves each with a new
/// `connection()`, at most `max` at once, until `shutdown` completes.
async fn accept_loop(
    listener: Listener,
    max: usize,
    shutdown: impl Future<Output = ()>,
    connection: impl Fn() -> Connection,
) {
    let permits = Arc::new(Semaphore::new(max));
    tokio::pin!(shutdown);
    loop {
        // Taken before accepting: at the cap, new connections wait in the
        // kernel's backlog instead of costing a task each.
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // EMFILE and the like: wait rather than spin.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let connection = connection();
        tokio::spawn(async move {
            match accepted {
                Accepted::Tcp(tcp, peer) => {
                    if let Err(reason) = connection.serve(tcp).await {
                        tracing::debug!(%peer, %reason, "connection closed");
                    }
                }
                Accepted::Unix(unix) => {
                    if let Err(reason) = connection.serve(unix).await {
                        tracing::debug!(peer = "unix socket", %reason, "connection closed");
                    }
                }
            }
            drop(permit);
        });
    }
}

/// Why a connection closed before its client did; logged.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("TLS handshake timed out")]
    HandshakeTimedOut,
    #[error("TLS handshake failed: {0}")]
    Handshake(std::io::Error),
    #[error("{0}")]
    Read(std::io::Error),
    #[error("no request before the header read timeout")]
    NoRequest,
    #[error("{0}")]
    Http(Box<dyn std::error::Error + Send + Sync>),
}

/// What one accepted connection needs to be served.
struct Connection {
    builder: auto::Builder<TokioExecutor>,
    app: Router,
    acceptor: Option<TlsAcceptor>,
    watcher: Watcher,
    timeout: Duration,
}

impl Connection {
    async fn serve(self, stream: impl Stream) -> Result<(), ConnectionError> {
        let service = TowerToHyperService::new(self.app);
        match self.acceptor {
            Some(acceptor) => {
                let tls = tokio::time::timeout(self.timeout, acceptor.accept(stream))
                    .await
                    .map_err(|_| ConnectionError::HandshakeTimedOut)?
                    .map_err(ConnectionError::Handshake)?;
                let conn = self.builder.serve_connection(TokioIo::new(tls), service);
                self.watcher.watch(conn.into_owned()).await.map_err(ConnectionError::Http)
            }
            None => {
                // A client that connects and sends nothing would otherwise
                // hold its connection (and a permit) for ever.
                match tokio::time::timeout(self.timeout, stream.first_bytes()).await {
                    Ok(Ok(true)) => {}
                    Ok(Ok(false)) => return Ok(()),
                    Ok(Err(err)) => return Err(ConnectionError::Read(err)),
                    Err(_) => return Err(ConnectionError::NoRequest),
                }
                let conn = self.builder.serve_connection(TokioIo::new(stream), service);
                self.watcher.watch(conn.into_owned()).await.map_err(ConnectionError::Http)
            }
        }
    }
}

/// A check, read in the encoding its `content-type` names and answered in
/// the same: the filter's binary wire, or JSON.
async fn check(State(limiter): State<Arc<Limiter>>, Wire(encoding): Wire, body: Bytes) -> Response {
    match encoding.decode::<CheckRequest<'static>>(&body) {
        Ok(req) => answer_in(encoding, limiter.metrics.decided(&req, limiter.check(&req).await)),
        Err(err) => malformed(err),
    }
}

/// Many checks in one call ([`crate::batch`]), answered in the call's encoding.
async fn batch(State(limiter): State<Arc<Limiter>>, Wire(encoding): Wire, body: Bytes) -> Response {
    match encoding.decode::<CheckBatch>(&body) {
        Ok(batch) => {
            let results = crate::batch::decide(&limiter, encoding, &batch).await;
            let answered = |result| {
                let (status, body) = answer_parts(encoding, result);
                Answered { status: status.as_u16(), body }
            };
            answer_in(
                encoding,
                results.map(|r| BatchAnswer { answers: r.into_iter().map(answered).collect() }),
            )
        }
        Err(err) => malformed(err),
    }
}

/// The encoding a call's `content-type` names (read without copying the headers).
struct Wire(Encoding);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Wire {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let value = parts.headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes());
        Ok(Wire(Encoding::of_content_type(value)))
    }
}

async fn release(State(limiter): State<Arc<Limiter>>, body: Bytes) -> Response {
    match parse::<ReleaseRequest>(&body) {
        Ok(req) => answer(limiter.release(&req).await),
        Err(err) => malformed(err),
    }
}

async fn renew(State(limiter): State<Arc<Limiter>>, body: Bytes) -> Response {
    match parse::<RenewRequest>(&body) {
        Ok(req) => answer(limiter.renew(&req).await),
        Err(err) => malformed(err),
    }
}

async fn shed(State(limiter): State<Arc<Limiter>>, body: Bytes) -> Response {
    match parse::<ShedRequest>(&body) {
        Ok(req) => answer(limiter.shed(&req).await),
        Err(err) => malformed(err),
    }
}

async fn adjust(State(limiter): State<Arc<Limiter>>, body: Bytes) -> Response {
    match parse::<AdjustRequest>(&body) {
        Ok(req) => answer(limiter.adjust(&req).await),
        Err(err) => malformed(err),
    }
}

async fn feedback(State(limiter): State<Arc<Limiter>>, body: Bytes) -> Response {
    match parse::<FeedbackRequest>(&body) {
        Ok(req) => answer(limiter.feedback(&req).await),
        Err(err) => malformed(err),
    }
}

async fn lease(State(limiter): State<Arc<Limiter>>, body: Bytes) -> Response {
    match parse::<LeaseRequest>(&body) {
        Ok(req) => answer(limiter.lease(&req).await),
        Err(err) => malformed(err),
    }
}

/// What a filter decided without the shim, as it reports it: failure-mode
/// passes and denials answered from its over-limit cache, counted now in
/// the dashboard's history, a report period after they happened.
async fn report(State(limiter): State<Arc<Limiter>>, body: Bytes) -> Response {
    if body.len() > MAX_REPORT_BODY {
        let reason =
            format!("report of {} bytes, more than the {MAX_REPORT_BODY} a report may be", body.len());
        return (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response();
    }
    match parse::<ReportRequest>(&body) {
        Ok(req) => answer(req.validate().map_err(CheckError::from).map(|()| {
            for passes in &req.passes {
                limiter.metrics.traffic.passed(&passes.policy, passes.count);
            }
            for denied in &req.cache_denied {
                limiter.metrics.traffic.cache_denied(&denied.policy, denied.count);
            }
            serde_json::json!({})
        })),
        Err(err) => malformed(err),
    }
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(body)
}

fn malformed(err: impl std::fmt::Display) -> Response {
    (StatusCode::BAD_REQUEST, format!("malformed request: {err}\n")).into_response()
}

/// The answer in JSON.
fn answer<T: Serialize>(result: Result<T, CheckError>) -> Response {
    match result {
        Ok(value) => match serde_json::to_vec(&value) {
            Ok(json) => ([(header::CONTENT_TYPE, JSON_CONTENT_TYPE)], json).into_response(),
            Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")).into_response(),
        },
        Err(err) => failed(err),
    }
}

/// The answer in `encoding`.
fn answer_in<T: Serialize + borsh::BorshSerialize>(
    encoding: Encoding,
    result: Result<T, CheckError>,
) -> Response {
    match result {
        Ok(value) => match encoding.encode(&value) {
            Ok(body) => ([(header::CONTENT_TYPE, encoding.content_type())], body).into_response(),
            Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")).into_response(),
        },
        Err(err) => failed(err),
    }
}

/// The status and body of an answer in `encoding`: the value on 200, or
/// why it failed as text (see [`failed`]). A batch's answers are these.
fn answer_parts<T: Serialize + borsh::BorshSerialize>(
    encoding: Encoding,
    result: Result<T, CheckError>,
) -> (StatusCode, Vec<u8>) {
    match result {
        Ok(value) => match encoding.encode(&value) {
            Ok(body) => (StatusCode::OK, body),
            Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n").into_bytes()),
        },
        Err(err) => failure_parts(err),
    }
}

/// A call that failed: 400 for the caller's mistake, 503 for Redis's.
fn failed(err: CheckError) -> Response {
    let (status, text) = failure_parts(err);
    (status, String::from_utf8_lossy(&text).into_owned()).into_response()
}

/// [`failed`]'s status and text.
fn failure_parts(err: CheckError) -> (StatusCode, Vec<u8>) {
    match err {
        CheckError::BadRequest(reason) => (StatusCode::BAD_REQUEST, format!("{reason}\n").into_bytes()),
        CheckError::Store(reason) => {
            if let Some(suppressed) = REDIS_FAILED_LOG.admit() {
                tracing::warn!(?reason, suppressed, "redis call failed");
            }
            (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n").into_bytes())
        }
    }
}
