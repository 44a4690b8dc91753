//! The soak's steady mixed traffic, open loop: each class sends at its own
//! rate, a request per tick share, whatever the answers take (a class whose
//! requests pile up past its bound skips ticks, and the skips are counted).
//!
//! - `api`: the ingress mix, four keyed policies (sliding log + token
//!   bucket per user, a fixed window per client address, points per
//!   session, an approximate sliding window per device). Nine in ten
//!   requests bring a user, an address, a session and a device never seen
//!   before (a counter), so the key space keeps growing; one in
//!   ten is one of [`HOT`] hot callers, who are over their limits. Its
//!   latency is the one sampled (it never waits).
//! - `lease`: a leased fixed window shared by all (leased mode takes `key: []`), offered more than it allows.
//! - `wait`: an interval per partner ([`PARTNERS`]) with `wait`, sent
//!   faster than the interval allows, so waiters queue and the latest are
//!   refused.
//! - `pool`: a concurrency pool with a reserve for the critical class; the
//!   upstream holds each for [`POOL_HOLD`], so the batch class is shed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::sync::Semaphore;

pub(crate) const HOT: u64 = 20;
pub(crate) const PARTNERS: u64 = 2;
pub(crate) const POOL_LIMIT: u64 = 8;
pub(crate) const POOL_HOLD: Duration = Duration::from_millis(100);
/// The partners' interval and the longest wait.
pub(crate) const EVERY_MS: u64 = 50;
pub(crate) const WAIT_MS: u64 = 1_000;
/// Key-bearing policies of an `api` request (each fresh request brings a new key for each).
pub(crate) const API_KEYS: u64 = 4;
/// The longest TTL of an `api` key (the 10 s windows, plus the second every key gets).
pub(crate) const API_TTL_S: u64 = 11;
const TICK: Duration = Duration::from_millis(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The policy document the soak's Envoy runs.
pub(crate) fn document() -> String {
    format!(
        r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "verdict_header": true,
  "classes": [{{"name": "critical", "match": {{"path_prefix": "/pool/critical/"}}}}, {{"name": "batch"}}],
  "policies": [
    {{"name": "users", "match": {{"path_prefix": "/api/"}}, "key": ["header:x-user"],
      "limits": [{{"type": "sliding_window", "limit": 5, "window": "10s"}},
                 {{"type": "token_bucket", "rate": 2, "per": "1s", "burst": 4}}]}},
    {{"name": "addresses", "match": {{"path_prefix": "/api/"}}, "key": ["header:x-client-ip"],
      "limits": [{{"type": "fixed_window", "limit": 10, "window": "10s"}}]}},
    {{"name": "sessions", "match": {{"path_prefix": "/api/"}}, "key": ["header:x-session"],
      "limits": [{{"type": "points", "capacity": 100, "refill": "10s", "cost": 10}}]}},
    {{"name": "devices", "match": {{"path_prefix": "/api/"}}, "key": ["header:x-device"],
      "limits": [{{"type": "sliding_window", "limit": 10, "window": "10s", "approximate": true}}]}},
    {{"name": "tenants", "match": {{"path_prefix": "/lease/"}},
      "leased": {{"tokens": 10, "ttl": "2s"}},
      "limits": [{{"type": "fixed_window", "limit": 30, "window": "1s"}}]}},
    {{"name": "partners", "match": {{"path_prefix": "/wait/"}}, "key": ["header:x-partner"],
      "wait": {{"timeout": "{WAIT_MS}ms"}},
      "limits": [{{"type": "interval", "every": "{EVERY_MS}ms"}}]}},
    {{"name": "pool", "match": {{"path_prefix": "/pool/"}},
      "limits": [{{"type": "concurrency", "limit": {POOL_LIMIT}, "lease": "30s", "reserve": {{"for": "critical", "share": 0.25}}}}]}}
  ]}}"#
    )
}

/// Requests per second of each class.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mix {
    pub(crate) api: f64,
    pub(crate) lease: f64,
    pub(crate) wait: f64,
    pub(crate) pool: f64,
}

pub(crate) const MIX: Mix = Mix { api: 250.0, lease: 40.0, wait: 50.0, pool: 50.0 };

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Class {
    Api,
    Lease,
    Wait,
    Pool,
}

impl Class {
    pub(crate) const ALL: [Class; 4] = [Class::Api, Class::Lease, Class::Wait, Class::Pool];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Class::Api => "api",
            Class::Lease => "lease",
            Class::Wait => "wait",
            Class::Pool => "pool",
        }
    }

    fn rate(self, mix: &Mix) -> f64 {
        match self {
            Class::Api => mix.api,
            Class::Lease => mix.lease,
            Class::Wait => mix.wait,
            Class::Pool => mix.pool,
        }
    }

    /// Requests of the class in flight at most: beyond, ticks are skipped.
    fn bound(self) -> usize {
        match self {
            Class::Wait => 256,
            _ => 512,
        }
    }
}

/// What one sampling window saw.
#[derive(Default, Debug)]
pub(crate) struct Window {
    /// `api` latencies, in ms.
    pub(crate) api_ms: Vec<f64>,
    pub(crate) requests: u64,
}

/// The whole run's outcomes: (class, outcome) → count, and the distinct keys sent.
#[derive(Default, Debug, Clone)]
pub(crate) struct Totals {
    pub(crate) outcomes: BTreeMap<(Class, String), u64>,
    pub(crate) skipped: BTreeMap<Class, u64>,
    /// Fresh `api` requests: each brought [`API_KEYS`] keys never seen before.
    pub(crate) fresh: u64,
}

impl Totals {
    pub(crate) fn distinct_keys(&self) -> u64 {
        API_KEYS * (self.fresh + HOT) + PARTNERS + 2
    }

    pub(crate) fn of(&self, class: Class) -> u64 {
        self.outcomes.iter().filter(|((c, _), _)| *c == class).map(|(_, n)| n).sum()
    }

    /// Answers that came from the failure mode, or no answer at all.
    pub(crate) fn failures(&self) -> u64 {
        self.outcomes.iter().filter(|((_, o), _)| o.contains("failure") || o == "error").map(|(_, n)| n).sum()
    }
}

#[derive(Default)]
struct Shared {
    window: Mutex<Window>,
    totals: Mutex<Totals>,
    /// Fresh `api` requests sent so far.
    fresh: AtomicU64,
}

pub(crate) struct Traffic {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Traffic {
    /// Starts sending `mix` to Envoy's listener on `port`.
    pub(crate) fn start(port: u16, mix: Mix) -> Result<Traffic> {
        let shared = Arc::new(Shared::default());
        let stop = Arc::new(AtomicBool::new(false));
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let client =
            reqwest::Client::builder().timeout(REQUEST_TIMEOUT).pool_max_idle_per_host(1024).build()?;
        let (s, st) = (shared.clone(), stop.clone());
        let thread = std::thread::Builder::new().name("soak-traffic".into()).spawn(move || {
            runtime.block_on(async move {
                let tasks: Vec<_> = Class::ALL
                    .into_iter()
                    .map(|class| {
                        let (client, shared, stop) = (client.clone(), s.clone(), st.clone());
                        tokio::spawn(generate(class, class.rate(&mix), port, client, shared, stop))
                    })
                    .collect();
                for task in tasks {
                    let _ = task.await;
                }
            })
        })?;
        Ok(Traffic { shared, stop, thread: Some(thread) })
    }

    /// The window since the last call, and a fresh one begun.
    pub(crate) fn take_window(&self) -> Window {
        std::mem::take(&mut *self.shared.window.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn totals(&self) -> Totals {
        let mut totals = self.shared.totals.lock().unwrap_or_else(|e| e.into_inner()).clone();
        totals.fresh = self.shared.fresh.load(Ordering::Relaxed);
        totals
    }

    /// Stops sending and waits for every request in flight to end.
    pub(crate) fn stop(mut self) -> Totals {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.totals()
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

async fn generate(
    class: Class,
    rate: f64,
    port: u16,
    client: reqwest::Client,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
) {
    let in_flight = Arc::new(Semaphore::new(class.bound()));
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let (mut owed, mut n) = (0.0, 0u64);
    while !stop.load(Ordering::SeqCst) {
        ticker.tick().await;
        owed += rate * TICK.as_secs_f64();
        while owed >= 1.0 {
            owed -= 1.0;
            n += 1;
            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                *shared.totals.lock().unwrap_or_else(|e| e.into_inner()).skipped.entry(class).or_default() +=
                    1;
                continue;
            };
            let (path, headers) = request(class, n, &shared.fresh);
            let (client, shared) = (client.clone(), shared.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let mut req = client.get(format!("http://127.0.0.1:{port}{path}"));
                for (name, value) in &headers {
                    req = req.header(*name, value);
                }
                let outcome = match req.send().await {
                    Ok(resp) => {
                        let verdict = resp
                            .headers()
                            .get("x-sluice-verdict")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("none")
                            .to_string();
                        let status = resp.status().as_u16();
                        let _ = resp.bytes().await;
                        format!("{status} {verdict}")
                    }
                    Err(_) => "error".to_string(),
                };
                let ms = started.elapsed().as_secs_f64() * 1000.0;
                {
                    let mut window = shared.window.lock().unwrap_or_else(|e| e.into_inner());
                    window.requests += 1;
                    if class == Class::Api {
                        window.api_ms.push(ms);
                    }
                }
                *shared
                    .totals
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .outcomes
                    .entry((class, outcome))
                    .or_default() += 1;
                drop(permit);
            });
        }
    }
    // Let the last requests finish: every permit back.
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, in_flight.acquire_many(class.bound() as u32)).await;
}

/// Request `n` of `class`: its path and headers.
fn request(class: Class, n: u64, fresh: &AtomicU64) -> (String, Vec<(&'static str, String)>) {
    match class {
        Class::Api => {
            let who = if n.is_multiple_of(10) {
                format!("hot{}", n / 10 % HOT)
            } else {
                format!("{}", fresh.fetch_add(1, Ordering::Relaxed))
            };
            let headers = vec![
                ("x-user", format!("u{who}")),
                ("x-client-ip", format!("ip{who}")),
                ("x-session", format!("s{who}")),
                ("x-device", format!("d{who}")),
            ];
            ("/api/items".to_string(), headers)
        }
        Class::Lease => ("/lease/items".to_string(), Vec::new()),
        Class::Wait => ("/wait/orders".to_string(), vec![("x-partner", format!("p{}", n % PARTNERS))]),
        Class::Pool => {
            let class = if n.is_multiple_of(2) { "critical" } else { "batch" };
            (format!("/pool/{class}/jobs"), Vec::new())
        }
    }
}

/// The upstream: `/pool/...` holds each request [`POOL_HOLD`], anything else answers at once.
pub(crate) fn upstream() -> Result<sluice_harness::Upstream> {
    let app = axum::Router::new().fallback(|uri: axum::http::Uri| async move {
        if uri.path().starts_with("/pool/") {
            tokio::time::sleep(POOL_HOLD).await;
        }
        "ok\n"
    });
    sluice_harness::Upstream::serving(app)
}
