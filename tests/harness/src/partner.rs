//! A mock third-party API, the far end of the egress tests and bench: it
//! enforces its own limits exactly on arrival, by its own clock, and answers
//! 429 with `retry-after` beyond them, as a strict partner does. It records
//! every call, so a test can count the partner's 429s, the smallest gap
//! between calls, the most in flight and the order of the client's sequence
//! numbers.
//!
//! - `rules`: [`Limits`] and their decisions over an injected clock.
//! - `log`: [`Arrival`], [`Log`] and the measures taken from it.
//!
//! Requests may carry [`ACCOUNT`] (the key its limits count per), [`SEQ`]
//! (a number the client chose, recorded) and [`DELAY`] (how long to take
//! over this answer, in ms, instead of the partner's default). Every answer
//! carries [`MARK`]: `ok` or `refused`, so a client tells the partner's 429
//! from the gateway's. Runs on its own thread and Tokio runtime; dropping it
//! stops both.

mod log;
mod rules;

use std::net::TcpListener;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use tokio::sync::oneshot;

pub use log::{Arrival, Log};
pub use rules::{Limits, Rules, Verdict, Window};

/// The header the partner's limits count per.
pub const ACCOUNT: &str = "x-account";
/// The client's sequence number, recorded with the arrival.
pub const SEQ: &str = "x-seq";
/// This answer's delay in milliseconds, overriding the partner's default.
pub const DELAY: &str = "x-delay-ms";
/// On every answer of the partner: `ok` or `refused`.
pub const MARK: &str = "x-partner";

pub struct Partner {
    pub port: u16,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    started: Instant,
    /// The wall clock at `started`, so an arrival can be compared with a
    /// time on Redis's clock (same host): [`Partner::wall`].
    started_wall: SystemTime,
    delay: Duration,
    /// Admitted answers carry `x-ratelimit-remaining` and `x-ratelimit-reset`.
    announce: bool,
    state: Mutex<(Rules, Vec<Arrival>)>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, (Rules, Vec<Arrival>)> {
        // A panicking holder cannot leave the log half-written: keep going.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Partner {
    /// Serves on 127.0.0.1:0, answering admitted calls at once.
    pub fn start(limits: Limits) -> anyhow::Result<Partner> {
        Partner::start_with_delay(limits, Duration::ZERO)
    }

    /// Serves on 127.0.0.1:0; each admitted call takes `delay` to answer
    /// (a slow partner, for concurrency limits).
    pub fn start_with_delay(limits: Limits, delay: Duration) -> anyhow::Result<Partner> {
        Partner::spawn(limits, delay, false)
    }

    /// Serves on 127.0.0.1:0, and every admitted answer announces what its
    /// first window has left: `x-ratelimit-remaining` and, in whole seconds
    /// rounded up, `x-ratelimit-reset`, as many partners do on a 200.
    pub fn start_announcing(limits: Limits) -> anyhow::Result<Partner> {
        Partner::spawn(limits, Duration::ZERO, true)
    }

    fn spawn(limits: Limits, delay: Duration, announce: bool) -> anyhow::Result<Partner> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the partner")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let state = Mutex::new((Rules::new(limits), Vec::new()));
        let shared = Arc::new(Shared {
            started: Instant::now(),
            started_wall: SystemTime::now(),
            delay,
            announce,
            state,
        });
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (stop, stopped) = oneshot::channel();
        let serving = shared.clone();
        let thread = std::thread::Builder::new().name("partner".into()).spawn(move || {
            runtime.block_on(serve(listener, serving, stopped));
        })?;
        Ok(Partner { port, shared, stop: Some(stop), thread: Some(thread) })
    }

    /// Every call so far, in order of arrival.
    pub fn log(&self) -> Log {
        Log(self.shared.state().1.clone())
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The wall-clock time of `at` on the partner's clock (an [`Arrival`]'s
    /// `at`), to compare with times on another clock of the same host, such
    /// as Redis's `TIME`.
    pub fn wall(&self, at: Duration) -> SystemTime {
        self.shared.started_wall + at
    }

    /// The partner's clock: time since it started, as its log counts.
    pub fn now(&self) -> Duration {
        self.shared.started.elapsed()
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>, stopped: oneshot::Receiver<()>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let app = axum::Router::new().fallback(call).with_state(shared);
    tokio::select! {
        result = axum::serve(listener, app) => {
            if let Err(err) = result {
                eprintln!("partner stopped: {err}");
            }
        }
        _ = stopped => {}
    }
}

/// Marks an admitted call finished when dropped: when its answer is
/// returned, or when the call is abandoned halfway.
struct Finish {
    shared: Arc<Shared>,
    key: String,
    index: usize,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let at = self.shared.started.elapsed();
        let mut state = self.shared.state();
        state.0.finish(&self.key);
        state.1[self.index].finished = Some(at);
    }
}

async fn call(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let key = header(ACCOUNT).unwrap_or_default();
    let seq = header(SEQ).and_then(|v| v.trim().parse().ok());
    let delay = header(DELAY).and_then(|v| v.trim().parse().ok()).map_or(shared.delay, Duration::from_millis);
    let (verdict, index, quota) = {
        let mut state = shared.state();
        let at = shared.started.elapsed();
        let verdict = state.0.arrive(&key, at);
        let quota = if shared.announce { state.0.quota(&key, at) } else { None };
        let in_flight = state.0.in_flight(&key);
        let refused = match &verdict {
            Verdict::Admit => None,
            Verdict::Refuse { limit, .. } => Some(limit.clone()),
        };
        state.1.push(Arrival { at, key: key.clone(), seq, in_flight, refused, finished: None });
        (verdict, state.1.len() - 1, quota)
    };
    match verdict {
        Verdict::Admit => {
            let _finish = Finish { shared, key, index };
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let mut headers = vec![(MARK, "ok".to_string())];
            if let Some((remaining, reset)) = quota {
                headers.push(("x-ratelimit-remaining", remaining.to_string()));
                headers.push(("x-ratelimit-reset", reset.as_millis().div_ceil(1000).to_string()));
            }
            answer(StatusCode::OK, &headers, "ok\n".into())
        }
        Verdict::Refuse { limit, retry_after } => {
            // Whole seconds, rounded up, at least 1 (also when unknown).
            let secs = retry_after.map_or(1, |wait| wait.as_millis().div_ceil(1000).max(1) as u64);
            let exact = retry_after.map_or(String::new(), |wait| wait.as_millis().to_string());
            let body = serde_json::json!({"error": "partner_rate_limited", "limit": limit}).to_string();
            let headers =
                [(MARK, "refused".into()), ("retry-after", secs.to_string()), ("x-retry-after-ms", exact)];
            answer(StatusCode::TOO_MANY_REQUESTS, &headers, body)
        }
    }
}

fn answer(status: StatusCode, headers: &[(&str, String)], body: String) -> Response {
    let mut response = Response::builder().status(status);
    for (name, value) in headers {
        response = response.header(*name, value);
    }
    response.body(Body::from(body)).unwrap_or_else(|_| Response::new(Body::from("partner: bad header")))
}

impl Drop for Partner {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
