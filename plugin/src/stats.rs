//! The filter's Envoy stats, defined once per VM in `on_configure`, one per
//! name that `sluice_core::stats` gives. Envoy keeps one stat per name
//! across all workers, so these are totals for the whole proxy;
//! `/stats/prometheus` shows them with dots as underscores.
//!
//! Per policy `P`: `sluice.P.<stat>` for each `PolicyStat` the policy has.
//! Per priority class `C` (a document with classes): `sluice.class.C.<stat>`.
//! For the whole filter: `sluice.<stat>` for each `FilterStat`.

use proxy_wasm::hostcalls::{define_metric, increment_metric, record_metric};
use proxy_wasm::types::MetricType;
use sluice_core::stats::{ClassStat, FilterStat, Kind, PolicyStat};
use sluice_policies::Document;

/// The host's metric ids, `None` where a stat is not defined.
pub struct Stats {
    /// Per policy (document order), per `PolicyStat` (declaration order).
    policies: Vec<Vec<Option<u32>>>,
    /// Per class, per `ClassStat`; empty without classes.
    classes: Vec<Vec<Option<u32>>>,
    filter: Vec<Option<u32>>,
}

impl Stats {
    pub fn define(doc: &Document) -> Stats {
        let policies = doc
            .policies
            .iter()
            .map(|p| {
                let defined = |s: &PolicyStat| {
                    s.applies(p)
                        .then(|| metric(s.kind(), &format!("sluice.{}.{}", p.name, s.name())))
                        .flatten()
                };
                PolicyStat::ALL.iter().map(defined).collect()
            })
            .collect();
        let classes = doc
            .classes
            .0
            .iter()
            .map(|c| {
                let defined =
                    |s: &ClassStat| metric(s.kind(), &format!("sluice.class.{}.{}", c.name, s.name()));
                ClassStat::ALL.iter().map(defined).collect()
            })
            .collect();
        let filter =
            FilterStat::ALL.iter().map(|s| metric(s.kind(), &format!("sluice.{}", s.name()))).collect();
        Stats { policies, classes, filter }
    }

    /// Adds `n` to a policy's counter, or records it in its histogram.
    pub fn policy(&self, policy: usize, stat: PolicyStat, n: u64) {
        let id = self.policies.get(policy).and_then(|s| s.get(stat as usize)).copied().flatten();
        apply(id, stat.kind(), n.try_into().unwrap_or(i64::MAX));
    }

    /// Adds `n` to a class's counter, or sets its gauge to `n`.
    pub fn class(&self, class: usize, stat: ClassStat, n: u64) {
        let Some(id) = self.classes.get(class).and_then(|s| s.get(stat as usize)).copied().flatten() else {
            return;
        };
        let _ = match stat.kind() {
            Kind::Counter => increment_metric(id, n.try_into().unwrap_or(i64::MAX)),
            Kind::Gauge | Kind::Histogram => record_metric(id, n),
        };
    }

    /// Adds `n` to a filter counter or gauge, or records it in a histogram.
    pub fn filter(&self, stat: FilterStat, n: i64) {
        apply(self.filter.get(stat as usize).copied().flatten(), stat.kind(), n);
    }
}

fn apply(id: Option<u32>, kind: Kind, n: i64) {
    let Some(id) = id else { return };
    let _ = match kind {
        Kind::Counter | Kind::Gauge => increment_metric(id, n),
        Kind::Histogram => record_metric(id, n.max(0) as u64),
    };
}

fn metric(kind: Kind, name: &str) -> Option<u32> {
    let kind = match kind {
        Kind::Counter => MetricType::Counter,
        Kind::Gauge => MetricType::Gauge,
        Kind::Histogram => MetricType::Histogram,
    };
    match define_metric(kind, name) {
        Ok(id) => Some(id),
        Err(status) => {
            log::warn!("cannot define the stat {name}: {status:?}");
            None
        }
    }
}
