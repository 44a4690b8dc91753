//! Requests of a few shapes, each played end to end through the real
//! `dist/sluice.wasm` (stream created, request headers, the shim's answer,
//! response headers, `on_log`, `on_done`, `on_delete`), for measuring what
//! one request costs: `benches/filter.rs` prints the counts and times the
//! callbacks, `tests/wasm_request_costs.rs` holds the counts that must not
//! grow back.
//!
//! The shim is scripted ([`Route::Scripted`]): its answer is built by the
//! host outside any callback, so only the filter's work, and the host calls
//! it makes, are measured. Every request checks that it took its shape's
//! path (a call, a cached denial, nothing), so a measurement can never count
//! the wrong path.

use std::path::PathBuf;

use anyhow::{bail, Context};

use super::calls::{Answer, Route};
use super::costs::Costs;
use super::pairs::HeaderMap;
use super::proxy::{End, HostConfig, Proxy, Returned};
use super::state::Effect;

/// One policy, one limit: the allow path, the cached denial, no match.
const ONE_POLICY: &str = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 100},
  "policies": [{"name": "partner-api", "match": {"path_prefix": "/api/", "methods": ["GET", "POST"]},
                "key": ["header:x-api-key"],
                "limits": [{"type": "sliding_window", "limit": 1000000000, "window": "1s"}]}]}"#;

/// Three policies that all apply: by API key, by client address, by tenant and method.
const THREE_POLICIES: &str = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 100},
  "policies": [
    {"name": "partner-api", "match": {"path_prefix": "/api/", "methods": ["GET", "POST"]},
     "key": ["header:x-api-key"],
     "limits": [{"type": "sliding_window", "limit": 1000000000, "window": "1s"}]},
    {"name": "per-ip", "key": ["ip"],
     "limits": [{"type": "fixed_window", "limit": 1000000000, "window": "1m"}]},
    {"name": "per-tenant", "match": {"headers": {"x-tenant": {"present": true}}},
     "key": ["header:x-tenant", "method"],
     "limits": [{"type": "token_bucket", "rate": 1000000, "per": "1s", "burst": 1000000}]}]}"#;

/// How long the cached denial lasts: far longer than any measurement.
const DENIED_FOR_MS: u64 = 3_600_000;

/// A request shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One policy with one limit applies; the shim allows.
    Allow,
    /// One policy applies and the over-limit cache denies (no shim call).
    CachedDeny,
    /// No policy applies.
    NoMatch,
    /// Three policies apply, each with one limit; the shim allows.
    ThreePolicies,
}

impl Shape {
    pub const ALL: [Shape; 4] = [Shape::Allow, Shape::CachedDeny, Shape::NoMatch, Shape::ThreePolicies];

    pub fn name(self) -> &'static str {
        match self {
            Shape::Allow => "allow (1 policy, shim allows)",
            Shape::CachedDeny => "deny from the over-limit cache",
            Shape::NoMatch => "no policy matches",
            Shape::ThreePolicies => "3 policies (shim allows)",
        }
    }

    /// A short name for bench ids.
    pub fn id(self) -> &'static str {
        match self {
            Shape::Allow => "allow",
            Shape::CachedDeny => "cached_deny",
            Shape::NoMatch => "no_match",
            Shape::ThreePolicies => "three_policies",
        }
    }

    fn document(self) -> &'static str {
        match self {
            Shape::ThreePolicies => THREE_POLICIES,
            _ => ONE_POLICY,
        }
    }

    /// The request: a browser-like header set, on `/api/` unless no policy may match.
    pub fn headers(self) -> HeaderMap {
        let path = match self {
            Shape::NoMatch => "/health?full=1",
            _ => "/api/orders?page=2",
        };
        [
            (":method", "GET"),
            (":path", path),
            (":authority", "api.example.com"),
            (":scheme", "https"),
            ("user-agent", "Mozilla/5.0 (X11; Linux x86_64) sluice-bench"),
            ("accept", "application/json"),
            ("accept-encoding", "gzip, br"),
            ("x-api-key", "acct-123456"),
            ("x-tenant", "tenant-42"),
            ("x-request-id", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"),
        ]
        .into_iter()
        .collect()
    }
}

/// sluice.wasm, configured for one shape, ready to play its requests.
pub struct Driver {
    proxy: Proxy,
    shape: Shape,
}

impl Driver {
    /// Boots and configures the filter; for [`Shape::CachedDeny`], one
    /// request denied by the shim fills the cache. Then one request of the
    /// shape warms the VM, and the costs start from zero.
    pub fn new(shape: Shape) -> anyhow::Result<Driver> {
        Driver::with_wasm(shape, None)
    }

    /// [`Driver::new`] with another build of the filter than `dist/sluice.wasm`.
    pub fn with_wasm(shape: Shape, wasm: Option<PathBuf>) -> anyhow::Result<Driver> {
        let mut config = HostConfig::new(shape.document()).cluster("sluice_shim", Route::Scripted);
        config.wasm = wasm;
        let mut proxy = Proxy::boot(config)?;
        if proxy.configure()?.returned != Returned::Bool(true) {
            bail!("the document of {shape:?} was refused");
        }
        let mut driver = Driver { proxy, shape };
        if shape == Shape::CachedDeny {
            driver.play(Answer::Deny { retry_after_ms: DENIED_FOR_MS }).context("filling the cache")?;
        }
        driver.request().context("the first request")?;
        driver.proxy.take_costs();
        Ok(driver)
    }

    /// One request of the shape, end to end.
    pub fn request(&mut self) -> anyhow::Result<()> {
        self.play(Answer::Allow)
    }

    /// The root context's tick, as Envoy's timer fires it.
    pub fn tick(&mut self) -> anyhow::Result<()> {
        self.proxy.tick().map(drop)
    }

    /// Turns [`Costs::trace`] on or off.
    pub fn trace(&mut self, on: bool) {
        self.proxy.trace(on);
    }

    /// What the requests cost since the last call (or since [`Driver::new`]).
    pub fn take_costs(&mut self) -> Costs {
        self.proxy.take_costs()
    }

    fn play(&mut self, answer: Answer) -> anyhow::Result<()> {
        let proxy = &mut self.proxy;
        let id = proxy.open()?;
        let asked = proxy.request_headers(id, self.shape.headers(), true)?;
        let calls = asked.effects.iter().filter(|e| matches!(e, Effect::HttpCall(_))).count();
        let status = match (self.shape, answer) {
            (Shape::NoMatch, _) => {
                if asked.returned != Returned::Continue || calls > 0 {
                    bail!("a request no policy matches: {asked:?}");
                }
                200
            }
            (_, Answer::Allow) if self.shape != Shape::CachedDeny => {
                let token = proxy.pending_calls(id).into_iter().next();
                let (Returned::Pause, 1, Some(token)) = (asked.returned, calls, token) else {
                    bail!("an allowed request must pause for one shim call: {asked:?}");
                };
                let answered = proxy.deliver(token, answer)?;
                if !answered.effects.iter().any(|e| matches!(e, Effect::Continue(0))) {
                    bail!("the shim allowed, the request was not resumed: {answered:?}");
                }
                200
            }
            (_, Answer::Allow) => {
                let denied = asked.local_response().map(|r| r.status);
                if asked.returned != Returned::Pause || calls > 0 || denied != Some(429) {
                    bail!("the over-limit cache did not deny: {asked:?}");
                }
                429
            }
            (_, answer) => {
                let token = proxy.pending_calls(id).into_iter().next().context("no shim call to deny")?;
                let answered = proxy.deliver(token, answer)?;
                if answered.local_response().map(|r| r.status) != Some(429) {
                    bail!("the shim denied, the filter did not answer 429: {answered:?}");
                }
                429
            }
        };
        let response: HeaderMap = [(":status", status.to_string())].into_iter().collect();
        proxy.response_headers(id, response, false)?;
        proxy.end(id, End::Complete)?;
        Ok(())
    }
}

/// What `n` requests of `shape` cost, after one to warm up; `wasm` as in
/// [`Driver::with_wasm`].
pub fn measure_wasm(shape: Shape, n: u64, wasm: Option<PathBuf>) -> anyhow::Result<Costs> {
    let mut driver = Driver::with_wasm(shape, wasm)?;
    for _ in 0..n {
        driver.request()?;
    }
    Ok(driver.take_costs())
}

/// What `n` requests of `shape` cost with `dist/sluice.wasm`.
pub fn measure(shape: Shape, n: u64) -> anyhow::Result<Costs> {
    measure_wasm(shape, n, None)
}
