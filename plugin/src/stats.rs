//! The filter's Envoy stats, defined once per VM in `on_configure`. Envoy
//! keeps one stat per name across all workers, so these are totals for the
//! whole proxy; `/stats/prometheus` shows them with dots as underscores.
//!
//! Per policy `P`: `sluice.P.allowed`, `.denied`, `.shadow_denied`,
//! `.cache_denied`, `.failure_allowed`, `.failure_denied`, `.released`,
//! `.release_failed` and `.reclaimed` (counters). A policy with `wait` also
//! has `.immediate`, `.waited`, `.wait_timeout`, `.wait_cancelled` (counters)
//! and `.wait_ms` (histogram); one with a `concurrency` limit `.held_ms`
//! (histogram) and `.overages` (counter); one with `shed` `.shed` (counter);
//! a leased one `.leased`, `.lease_empty`, `.lease_granted`,
//! `.lease_given_back` and `.lease_failed` (counters).
//! For the whole filter:
//! `sluice.shim_latency_ms` (histogram), `sluice.breaker.opened` and
//! `sluice.breaker.closed` (counters), and `sluice.breaker.open_workers` (a
//! gauge: workers whose breaker is open right now). A document with
//! priority classes has, per class `C`: `sluice.class.C.allowed`, `.denied`
//! and `.shed` (counters: requests of the class, once each however many
//! policies apply), and `.shed_permille` (a gauge: the fraction of the
//! class the shedder drops now, in thousandths, summed over the workers).

use proxy_wasm::hostcalls::{define_metric, increment_metric, record_metric};
use proxy_wasm::types::MetricType;
use sluice_policies::Document;

use crate::wait::holds_leases;

/// One counter per outcome, for one policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicyStats {
    pub allowed: Option<u32>,
    pub denied: Option<u32>,
    pub shadow_denied: Option<u32>,
    pub cache_denied: Option<u32>,
    pub failure_allowed: Option<u32>,
    pub failure_denied: Option<u32>,
    pub released: Option<u32>,
    pub release_failed: Option<u32>,
    pub reclaimed: Option<u32>,
    /// A policy with `wait`: admitted without being held.
    pub immediate: Option<u32>,
    /// A policy with `wait`: admitted after being held.
    pub waited: Option<u32>,
    /// A policy with `wait` (histogram): how long each admitted request was held, 0 if not.
    pub wait_ms: Option<u32>,
    /// A policy with `wait`: refused at once, its slot further away than the wait.
    pub wait_timeout: Option<u32>,
    /// A policy with `wait`: the stream ended while the request was held.
    pub wait_cancelled: Option<u32>,
    /// A policy with a concurrency limit (histogram): admission to release.
    pub held_ms: Option<u32>,
    /// A policy with a concurrency limit: leases held longer than `lease`.
    pub overages: Option<u32>,
    /// A policy with `upstream`: the partner's answers that paused its key.
    pub upstream_throttled: Option<u32>,
    /// A policy with `upstream`: of those, hints cut to `max_pause` or ignored as broken.
    pub upstream_clamped: Option<u32>,
    /// A policy with `upstream`: requests refused because the partner paused the key.
    pub paused_denied: Option<u32>,
    /// A policy with `upstream` and `wait`: requests held until a pause ended.
    pub paused_waited: Option<u32>,
    /// A policy with `shed`: requests shed.
    pub shed: Option<u32>,
    /// A leased policy: requests admitted from the lease, without a shim call.
    pub leased: Option<u32>,
    /// A leased policy: requests that found the lease empty and asked the shim.
    pub lease_empty: Option<u32>,
    /// A leased policy: tokens the shim granted.
    pub lease_granted: Option<u32>,
    /// A leased policy: unused tokens given back.
    pub lease_given_back: Option<u32>,
    /// A leased policy: lease calls that failed.
    pub lease_failed: Option<u32>,
}

/// One priority class's counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClassStats {
    pub allowed: Option<u32>,
    pub denied: Option<u32>,
    pub shed: Option<u32>,
    pub shed_permille: Option<u32>,
}

#[derive(Debug, Default)]
pub struct Stats {
    /// Indexed like the document's policies.
    pub policies: Vec<PolicyStats>,
    /// Indexed like the document's classes; empty without classes.
    pub classes: Vec<ClassStats>,
    pub shim_latency_ms: Option<u32>,
    pub breaker_opened: Option<u32>,
    pub breaker_closed: Option<u32>,
    pub breaker_open_workers: Option<u32>,
}

impl Stats {
    pub fn define(doc: &Document) -> Stats {
        let counter = |name: String| metric(MetricType::Counter, &name);
        let policies = doc
            .policies
            .iter()
            .map(|p| {
                let c = |what: &str| counter(format!("sluice.{}.{what}", p.name));
                let h = |what: &str| metric(MetricType::Histogram, &format!("sluice.{}.{what}", p.name));
                let waits = p.wait.is_some();
                let feedback = p.upstream.is_some();
                let leases = holds_leases(p);
                let leased = p.leased.is_some();
                PolicyStats {
                    allowed: c("allowed"),
                    denied: c("denied"),
                    shadow_denied: c("shadow_denied"),
                    cache_denied: c("cache_denied"),
                    failure_allowed: c("failure_allowed"),
                    failure_denied: c("failure_denied"),
                    released: c("released"),
                    release_failed: c("release_failed"),
                    reclaimed: c("reclaimed"),
                    immediate: waits.then(|| c("immediate")).flatten(),
                    waited: waits.then(|| c("waited")).flatten(),
                    wait_ms: waits.then(|| h("wait_ms")).flatten(),
                    wait_timeout: waits.then(|| c("wait_timeout")).flatten(),
                    wait_cancelled: waits.then(|| c("wait_cancelled")).flatten(),
                    held_ms: leases.then(|| h("held_ms")).flatten(),
                    overages: leases.then(|| c("overages")).flatten(),
                    upstream_throttled: feedback.then(|| c("upstream_throttled")).flatten(),
                    upstream_clamped: feedback.then(|| c("upstream_clamped")).flatten(),
                    paused_denied: feedback.then(|| c("paused_denied")).flatten(),
                    paused_waited: (feedback && waits).then(|| c("paused_waited")).flatten(),
                    shed: p.shed.is_some().then(|| c("shed")).flatten(),
                    leased: leased.then(|| c("leased")).flatten(),
                    lease_empty: leased.then(|| c("lease_empty")).flatten(),
                    lease_granted: leased.then(|| c("lease_granted")).flatten(),
                    lease_given_back: leased.then(|| c("lease_given_back")).flatten(),
                    lease_failed: leased.then(|| c("lease_failed")).flatten(),
                }
            })
            .collect();
        let classes = doc
            .classes
            .0
            .iter()
            .map(|class| {
                let name = |what: &str| format!("sluice.class.{}.{what}", class.name);
                ClassStats {
                    allowed: counter(name("allowed")),
                    denied: counter(name("denied")),
                    shed: counter(name("shed")),
                    shed_permille: metric(MetricType::Gauge, &name("shed_permille")),
                }
            })
            .collect();
        Stats {
            policies,
            classes,
            shim_latency_ms: metric(MetricType::Histogram, "sluice.shim_latency_ms"),
            breaker_opened: counter("sluice.breaker.opened".into()),
            breaker_closed: counter("sluice.breaker.closed".into()),
            breaker_open_workers: metric(MetricType::Gauge, "sluice.breaker.open_workers"),
        }
    }

    /// Adds 1 to `which` of policy `index`.
    pub fn count(&self, index: usize, which: impl Fn(&PolicyStats) -> Option<u32>) {
        self.add(index, which, 1);
    }

    pub fn add(&self, index: usize, which: impl Fn(&PolicyStats) -> Option<u32>, n: u64) {
        if let Some(id) = self.policies.get(index).and_then(which) {
            bump(Some(id), i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Adds 1 to `which` of class `class`, if the document has classes.
    pub fn count_class(&self, class: usize, which: impl Fn(&ClassStats) -> Option<u32>) {
        bump(self.classes.get(class).and_then(which), 1);
    }

    /// Records `ms` in histogram `which` of policy `index`.
    pub fn record(&self, index: usize, which: impl Fn(&PolicyStats) -> Option<u32>, ms: u64) {
        if let Some(id) = self.policies.get(index).and_then(which) {
            let _ = record_metric(id, ms);
        }
    }

    pub fn latency(&self, ms: u64) {
        if let Some(id) = self.shim_latency_ms {
            let _ = record_metric(id, ms);
        }
    }
}

/// Adds `n` (which may be negative for a gauge) to a metric, if defined.
pub fn bump(id: Option<u32>, n: i64) {
    if let Some(id) = id {
        let _ = increment_metric(id, n);
    }
}

fn metric(kind: MetricType, name: &str) -> Option<u32> {
    match define_metric(kind, name) {
        Ok(id) => Some(id),
        Err(status) => {
            log::warn!("cannot define the stat {name}: {status:?}");
            None
        }
    }
}
