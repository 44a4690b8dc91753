//! The Limits dashboard: a page at `GET /` that polls `GET /dashboard.json`
//! every second, and the policy playground's static files at `/playground/`.
//! Everything the page uses is embedded in the binary; it needs no network.
//!
//! For each policy, where each number comes from:
//!
//! - its limits: the policy document (`sluice serve --policy FILE`), else
//!   the limits its checks carried;
//! - rates and totals (allowed, denied, waited, immediate, wait time,
//!   reclaimed): the checks *this* shim answered ([`crate::metrics::traffic`]);
//! - the last 10 minutes, in 5-second buckets: allowed, denied and waited
//!   from the same checks, and failure-mode passes as the filters report
//!   them (`POST /v1/report`), counted when received, so up to a second or
//!   two late ([`crate::metrics::history`]);
//! - the busiest keys: a Space-Saving sketch of this shim's checks
//!   ([`crate::metrics::sketch`]), bounded per policy;
//! - each busy key's remaining, reset, leases held and waiters: read from
//!   Redis when the page asks ([`state`]), so they hold for the whole fleet.
//!
//! # Layout
//!
//! - [`state`]: a key's state read from Redis.
//! - [`playground`]: the playground's files, from a directory.

pub mod playground;
pub mod state;

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::future::join_all;
use serde::Serialize;
use sluice_policies::units::Millis;
use sluice_policies::wire::WireLimit;
use sluice_policies::Document;

use crate::limiter::Limiter;
use crate::metrics::history::Series;
use crate::metrics::sketch::Estimate;
use crate::metrics::traffic::{self, Rates, Seen, Totals};
use crate::metrics::Metrics;
use crate::store::RedisClient;
use state::LimitState;
use state::StateError;

/// Busy keys per policy whose state the page shows (read from Redis on
/// each poll); the sketch keeps more, [`traffic::KEYS_PER_POLICY`].
pub const SHOWN_KEYS: usize = 8;

const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("page.js");
const STYLE: &str = include_str!("page.css");

/// The policy document the dashboard lists, replaced whole on a reload
/// (`sluice serve` on SIGHUP); clones share it.
#[derive(Clone, Default)]
pub struct Policies(Arc<std::sync::RwLock<Option<Arc<Document>>>>);

impl Policies {
    pub fn get(&self) -> Option<Arc<Document>> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub fn set(&self, document: Document) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(document));
    }
}

impl From<Option<Arc<Document>>> for Policies {
    fn from(document: Option<Arc<Document>>) -> Policies {
        Policies(Arc::new(std::sync::RwLock::new(document)))
    }
}

/// What the dashboard is given at start.
#[derive(Clone, Default)]
pub struct Options {
    /// The policy document, so every policy shows before its first check.
    pub policies: Policies,
    /// The playground's built files (`cargo xtask playground`).
    pub playground: Option<PathBuf>,
}

struct Dashboard {
    store: Arc<RedisClient>,
    metrics: Arc<Metrics>,
    document: Policies,
}

/// `GET /`, its script and style, `GET /dashboard.json`, and `/playground/`.
pub fn routes(limiter: &Limiter, options: Options) -> Router {
    let dashboard = Arc::new(Dashboard {
        store: limiter.store.clone(),
        metrics: limiter.metrics.clone(),
        document: options.policies,
    });
    Router::new()
        .route("/", get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE) }))
        .route("/dashboard.js", get(|| async { ([(header::CONTENT_TYPE, "text/javascript")], SCRIPT) }))
        .route("/dashboard.css", get(|| async { ([(header::CONTENT_TYPE, "text/css")], STYLE) }))
        .route("/dashboard.json", get(json))
        .with_state(dashboard)
        .merge(playground::routes(options.playground))
}

/// The body of `GET /dashboard.json`.
#[derive(Debug, Serialize)]
pub struct Snapshot {
    /// Redis's clock when the state was read, ms since the epoch; `None` if Redis failed.
    pub now_ms: Option<u64>,
    /// Why Redis could not be read, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_error: Option<String>,
    /// The seconds the rates are averaged over.
    pub rate_seconds: u64,
    pub policies: Vec<PolicyView>,
}

#[derive(Debug, Serialize)]
pub struct PolicyView {
    pub name: String,
    /// `document` or `traffic`: where its limits come from.
    pub source: &'static str,
    /// Whether the document gives it `wait` (egress waiting).
    pub wait: bool,
    /// The face its requests come through, as the document says: `filter`
    /// (the Sluice filter), `rls` or `rlqs` (Envoy's own filters); `None`
    /// for a policy seen only in traffic.
    pub face: Option<&'static str>,
    pub limits: Vec<LimitView>,
    pub rates: Rates,
    pub totals: Totals,
    /// The last minutes, oldest bucket first.
    pub history: Series,
    pub keys: Vec<KeyView>,
}

#[derive(Debug, Serialize)]
pub struct LimitView {
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// e.g. `25 per 5s`.
    pub text: String,
    /// What `remaining` counts down from.
    pub capacity: u64,
    /// `tokens` for a budget in LLM tokens (a policy's `llm`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct KeyView {
    /// The key as encoded in Redis key names (`sluice_policies::key`).
    pub key: String,
    /// This shim's checks of the key, as the sketch estimates them (halved each minute).
    pub checks: u64,
    /// How many of `checks` may belong to keys it replaced in the sketch.
    pub error: u64,
    /// One per limit, in the policy's order: read from Redis; `None` for
    /// a limit of another level of a hierarchy (each level is a key of
    /// its own: `<key>:@<level>:<level key>`).
    pub state: Vec<Option<LimitState>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_error: Option<String>,
}

async fn json(State(dashboard): State<Arc<Dashboard>>) -> Response {
    match serde_json::to_vec(&dashboard.snapshot().await) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")], json)
            .into_response(),
        Err(err) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")).into_response(),
    }
}

/// A policy to show: where its limits come from, and what this shim saw of it.
struct Listed {
    name: String,
    source: &'static str,
    wait: bool,
    face: Option<&'static str>,
    limits: Vec<WireLimit>,
    /// A hierarchy's levels: each name and the index of its first limit.
    levels: Vec<(String, usize)>,
    /// Parallel to `limits`: the limits the document charges in LLM tokens.
    in_tokens: Vec<bool>,
    seen: Seen,
}

impl Dashboard {
    async fn snapshot(&self) -> Snapshot {
        let now = state::now_us(&self.store).await;
        let policies = join_all(self.listed().into_iter().map(|policy| self.view(policy, &now))).await;
        Snapshot {
            now_ms: now.as_ref().ok().map(|us| us / 1000),
            redis_error: now.err().map(|e| e.to_string()),
            rate_seconds: traffic::RATE_SECONDS,
            policies,
        }
    }

    /// The document's policies first, in its order, a budget several
    /// share once, by its name (the name their checks carry); then the
    /// others seen, by name.
    fn listed(&self) -> Vec<Listed> {
        let mut seen = self.metrics.traffic.seen(SHOWN_KEYS);
        let mut names = std::collections::HashSet::new();
        let mut listed: Vec<Listed> = self
            .document
            .get()
            .iter()
            .flat_map(|doc| doc.policies.iter())
            .filter(|policy| names.insert(policy.state_name().to_string()))
            .map(|policy| Listed {
                name: policy.state_name().to_string(),
                source: "document",
                wait: policy.wait.is_some(),
                face: Some(policy.matcher.face().name()),
                limits: policy.limits.iter().map(|l| WireLimit::with_cost(l, 1)).collect(),
                levels: policy.levels.iter().map(|l| (l.name.as_str().to_string(), l.from)).collect(),
                in_tokens: policy.limits.iter().map(|l| l.costs_llm_tokens()).collect(),
                seen: seen.remove(policy.state_name()).unwrap_or_default(),
            })
            .collect();
        let mut rest: Vec<(String, Seen)> = seen.into_iter().collect();
        rest.sort_by(|a, b| a.0.cmp(&b.0));
        listed.extend(rest.into_iter().map(|(name, seen)| Listed {
            name,
            source: "traffic",
            wait: false,
            face: None,
            limits: seen.limits.clone(),
            levels: seen.levels.clone(),
            in_tokens: Vec::new(),
            seen,
        }));
        listed
    }

    async fn view(&self, policy: Listed, now: &Result<u64, StateError>) -> PolicyView {
        let keys = policy.seen.keys.iter().map(|(key, estimate)| self.key(&policy, key, *estimate, now));
        let keys = join_all(keys).await;
        PolicyView {
            limits: (policy.limits.iter().enumerate())
                .map(|(i, l)| describe(l, policy.in_tokens.get(i).copied().unwrap_or(false)))
                .collect(),
            rates: policy.seen.rates,
            totals: policy.seen.totals,
            history: policy.seen.history,
            name: policy.name,
            source: policy.source,
            wait: policy.wait,
            face: policy.face,
            keys,
        }
    }

    /// A busy key, with its state read from Redis under the policy's limits.
    async fn key(
        &self,
        policy: &Listed,
        key: &str,
        estimate: Estimate,
        now: &Result<u64, StateError>,
    ) -> KeyView {
        let read = match now {
            Ok(now) => {
                state::read(&self.store, *now, &policy.name, key, &policy.limits, &policy.levels).await
            }
            Err(err) => Err(err.clone()),
        };
        let (state, state_error) = match read {
            Ok(state) => (state, None),
            Err(err) => (Vec::new(), Some(err.to_string())),
        };
        KeyView { key: key.to_string(), checks: estimate.count, error: estimate.error, state, state_error }
    }
}

/// A limit in words, and its capacity; a budget in LLM tokens says so.
fn describe(limit: &WireLimit, in_tokens: bool) -> LimitView {
    // In the document's notation: "per 1d", as the policy says it.
    let text = limit.summary(|ms: Millis| sluice_policies::Duration::show(ms.get()));
    let (text, unit) =
        if in_tokens { (text.replacen("points", "LLM tokens", 1), Some("tokens")) } else { (text, None) };
    LimitView { kind: limit.type_name(), text, capacity: limit.capacity().into(), unit }
}
