//! What the shim itself saw of each policy's checks: totals, per-second
//! rates over the last few seconds, a [`History`] of the last minutes, the
//! limits the checks carried, and the busiest keys in a [`SpaceSaving`]
//! sketch. Fed by every `/v1/check` this shim answers
//! ([`crate::metrics::Metrics::decided`]), so it covers this shim only; what
//! a key holds is read from Redis when the page asks. Failure-mode passes,
//! which the shim never decided, come from the filters' reports
//! (`/v1/report`, [`Traffic::passed`]) and count when received.
//!
//! Memory is bounded: at most [`MAX_POLICIES`] policies, each with at most
//! [`KEYS_PER_POLICY`] keys (each a valid encoded key, at most
//! `sluice_policies::bounds::MAX_KEY_LEN` bytes), [`MAX_LIMITS`] limits and
//! one fixed history ring.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use serde::Serialize;
use sluice_policies::key::is_encoded;
use sluice_policies::units::Millis;
use sluice_policies::wire::{CheckLevel, CheckRequest, CheckResponse, WireLimit};
use sluice_policies::PolicyName;

use super::history::{History, Kind, Series};
use super::sketch::{Estimate, SpaceSaving};
use crate::decision::CheckError;
use crate::keys::MAX_LIMITS;

/// Policies tracked; checks of further names are not shown.
pub const MAX_POLICIES: usize = 256;
/// Keys each policy's sketch keeps.
pub const KEYS_PER_POLICY: usize = 64;
/// Rates are averaged over this many whole seconds, the last ones before now.
pub const RATE_SECONDS: u64 = 5;
/// Every this many seconds the sketch's counts are halved: the busiest keys
/// are the busiest of the last minutes, not since the shim started.
const HALVE_EVERY_S: u64 = 60;

/// Totals since the shim started, for requests this shim answered.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Admitted at once.
    pub allowed: u64,
    /// Denied by this policy: by this shim, or by a gateway's over-limit
    /// cache as its filters reported them.
    pub denied: u64,
    /// Of `denied`, those answered from an over-limit cache: a gateway's,
    /// with no call to the shim, or this shim's own (the RLS face's), with
    /// no Redis call.
    pub cache_denied: u64,
    /// Admitted after being held (egress wait).
    pub waited: u64,
    /// Requests that could wait but were admitted at once.
    pub immediate: u64,
    /// Milliseconds the waited requests were held, added up.
    pub wait_ms: u64,
    /// Expired leases that checks reclaimed (their holder died).
    pub reclaimed: u64,
    /// Checks that failed: Redis errors (503) and malformed requests (400).
    pub errors: u64,
    /// Requests `failure_mode: allow` let through, as the filters reported them.
    pub failure_passes: u64,
}

/// Decisions per second, averaged over the last [`RATE_SECONDS`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize)]
pub struct Rates {
    pub allowed: f64,
    pub denied: f64,
    pub waited: f64,
}

/// The counts of one second.
#[derive(Debug, Default, Clone, Copy)]
struct Second {
    at: u64,
    allowed: u64,
    denied: u64,
    waited: u64,
}

#[derive(Debug)]
struct Policy {
    limits: Vec<WireLimit>,
    /// A hierarchy's levels as its checks carried them: each name and the
    /// index of its first limit.
    levels: Vec<(String, usize)>,
    totals: Totals,
    /// A ring of the last seconds, by `at % len`.
    seconds: [Second; RATE_SECONDS as usize + 1],
    keys: SpaceSaving,
    halved_at: u64,
    history: History,
}

/// One policy as the page shows it.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub limits: Vec<WireLimit>,
    /// A hierarchy's levels: each name and the index of its first limit.
    pub levels: Vec<(String, usize)>,
    pub totals: Totals,
    pub rates: Rates,
    pub history: Series,
    pub keys: Vec<(String, Estimate)>,
}

pub struct Traffic {
    started: Instant,
    policies: Mutex<HashMap<String, Policy>>,
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic { started: Instant::now(), policies: Mutex::default() }
    }
}

impl Traffic {
    fn second(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Counts one answered check request: `label` and `only` say what the
    /// metrics count it as ([`crate::metrics::classify`]).
    pub(crate) fn record(
        &self,
        req: &CheckRequest<'_>,
        result: &Result<CheckResponse, CheckError>,
        label: &str,
        only: Option<usize>,
    ) {
        self.record_at(self.second(), req, result, label, only);
    }

    fn record_at(
        &self,
        now: u64,
        req: &CheckRequest<'_>,
        result: &Result<CheckResponse, CheckError>,
        label: &str,
        only: Option<usize>,
    ) {
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        for (i, check) in req.checks.iter().enumerate() {
            let Some(policy) = tracked(&mut policies, &check.policy, now) else { continue };
            policy.age(now);
            // Only keys the shim would take: at most MAX_KEY_LEN bytes each.
            // A hierarchy's every level is a key of its own: each is shown
            // from its own state.
            let levels_valid = check
                .levels
                .iter()
                .all(|l| is_encoded(&l.level.key) && PolicyName::new(&l.level.name).is_some());
            if is_encoded(&check.key) && levels_valid {
                for shown in check.shown_keys() {
                    policy.keys.add(&shown);
                }
            }
            if check.limits.len() <= MAX_LIMITS && policy.limits != check.limits {
                policy.limits = check.limits.clone();
            }
            if levels_valid && check.levels.len() <= MAX_LIMITS && !same_levels(&policy.levels, &check.levels)
            {
                policy.levels = check.levels.iter().map(|l| (l.level.name.clone(), l.from)).collect();
            }
            if let Ok(resp) = result {
                let outcome = resp.checks.get(i).map(|c| c.limits.as_slice()).unwrap_or_default();
                policy.totals.reclaimed += outcome.iter().map(|l| l.reclaimed).sum::<u64>();
            }
            if only.is_some_and(|only| only != i) {
                continue;
            }
            let second = second(&mut policy.seconds, now);
            let t = &mut policy.totals;
            let could_wait = req.wait_ms.is_some_and(|ms| ms.get() > 0);
            let kind = match label {
                "allowed" => {
                    t.allowed += 1;
                    second.allowed += 1;
                    t.immediate += u64::from(could_wait);
                    Kind::Allowed
                }
                "waited" => {
                    t.waited += 1;
                    second.waited += 1;
                    t.wait_ms += result.as_ref().ok().and_then(|r| r.waited_ms).map_or(0, Millis::get);
                    Kind::Waited
                }
                "denied" => {
                    t.denied += 1;
                    second.denied += 1;
                    Kind::Denied
                }
                _ => {
                    t.errors += 1;
                    continue;
                }
            };
            policy.history.add(now, kind, 1);
        }
    }

    /// Counts what Envoy reported it enforced from an RLQS assignment of
    /// `policy` on `key` under `limit`: `allowed` and `denied` requests,
    /// landing in the history when received (up to a report period late).
    pub(crate) fn enforced(&self, policy: &str, key: &str, limit: WireLimit, allowed: u64, denied: u64) {
        self.enforced_at(self.second(), policy, key, limit, allowed, denied);
    }

    fn enforced_at(&self, now: u64, policy: &str, key: &str, limit: WireLimit, allowed: u64, denied: u64) {
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(policy) = tracked(&mut policies, policy, now) else { return };
        policy.age(now);
        if is_encoded(key) && allowed + denied > 0 {
            policy.keys.add_n(key, allowed.saturating_add(denied));
        }
        if policy.limits.first() != Some(&limit) {
            policy.limits = vec![limit];
        }
        let second = second(&mut policy.seconds, now);
        second.allowed += allowed;
        second.denied += denied;
        policy.totals.allowed = policy.totals.allowed.saturating_add(allowed);
        policy.totals.denied = policy.totals.denied.saturating_add(denied);
        policy.history.add(now, Kind::Allowed, allowed);
        policy.history.add(now, Kind::Denied, denied);
    }

    /// Counts `count` failure-mode passes of `policy` that a filter reported
    /// now: they happened up to a report period (a second) before, and land
    /// in the history when received. A name past [`MAX_POLICIES`] is not
    /// counted.
    pub(crate) fn passed(&self, policy: &str, count: u64) {
        self.passed_at(self.second(), policy, count);
    }

    fn passed_at(&self, now: u64, policy: &str, count: u64) {
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(policy) = tracked(&mut policies, policy, now) {
            policy.totals.failure_passes = policy.totals.failure_passes.saturating_add(count);
            policy.history.add(now, Kind::FailurePass, count);
        }
    }

    /// Counts `count` denials of `policy` that a filter answered from its
    /// over-limit cache and reported now: denials like this shim's, landing
    /// in the history when received (up to a report period late).
    pub(crate) fn cache_denied(&self, policy: &str, count: u64) {
        self.cache_denied_at(self.second(), policy, count);
    }

    fn cache_denied_at(&self, now: u64, policy: &str, count: u64) {
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(policy) = tracked(&mut policies, policy, now) {
            policy.totals.denied = policy.totals.denied.saturating_add(count);
            policy.totals.cache_denied = policy.totals.cache_denied.saturating_add(count);
            let second = second(&mut policy.seconds, now);
            second.denied = second.denied.saturating_add(count);
            policy.history.add(now, Kind::Denied, count);
        }
    }

    /// Marks one denial of `policy` this shim counted ([`Traffic::record`])
    /// as answered from its own over-limit cache (the RLS face's), with no
    /// Redis call.
    pub(crate) fn answered_from_cache(&self, policy: &str) {
        let now = self.second();
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(policy) = tracked(&mut policies, policy, now) {
            policy.totals.cache_denied = policy.totals.cache_denied.saturating_add(1);
        }
    }

    /// Every policy seen so far, by name.
    pub fn seen(&self, top: usize) -> HashMap<String, Seen> {
        self.seen_at(self.second(), top)
    }

    fn seen_at(&self, now: u64, top: usize) -> HashMap<String, Seen> {
        let policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        policies
            .iter()
            .map(|(name, p)| {
                let seen = Seen {
                    limits: p.limits.clone(),
                    levels: p.levels.clone(),
                    totals: p.totals,
                    rates: p.rates(now),
                    history: p.history.series(now),
                    keys: p.keys.top(top),
                };
                (name.clone(), seen)
            })
            .collect()
    }
}

impl Policy {
    fn new(now: u64) -> Policy {
        Policy {
            limits: Vec::new(),
            levels: Vec::new(),
            totals: Totals::default(),
            seconds: Default::default(),
            keys: SpaceSaving::new(KEYS_PER_POLICY),
            halved_at: now,
            history: History::default(),
        }
    }

    fn age(&mut self, now: u64) {
        if now >= self.halved_at + HALVE_EVERY_S {
            self.keys.halve();
            self.halved_at = now;
        }
    }

    fn rates(&self, now: u64) -> Rates {
        let recent = self.seconds.iter().filter(|s| s.at < now && s.at + RATE_SECONDS >= now);
        let (mut allowed, mut denied, mut waited) = (0, 0, 0);
        for s in recent {
            allowed += s.allowed;
            denied += s.denied;
            waited += s.waited;
        }
        let per_second = |n: u64| n as f64 / RATE_SECONDS as f64;
        Rates { allowed: per_second(allowed), denied: per_second(denied), waited: per_second(waited) }
    }
}

fn same_levels(seen: &[(String, usize)], levels: &[CheckLevel]) -> bool {
    seen.len() == levels.len()
        && seen.iter().zip(levels).all(|((n, f), l)| *n == l.level.name && *f == l.from)
}

/// The policy named `name`, added if new: `None` for an invalid name, or a
/// new one past [`MAX_POLICIES`].
fn tracked<'a>(policies: &'a mut HashMap<String, Policy>, name: &str, now: u64) -> Option<&'a mut Policy> {
    PolicyName::new(name)?;
    if !policies.contains_key(name) && policies.len() >= MAX_POLICIES {
        return None;
    }
    Some(policies.entry(name.to_string()).or_insert_with(|| Policy::new(now)))
}

/// The counts of second `now`, emptied if the ring last held an older one.
fn second(ring: &mut [Second], now: u64) -> &mut Second {
    let len = ring.len() as u64;
    let slot = &mut ring[(now % len) as usize];
    if slot.at != now {
        *slot = Second { at: now, ..Second::default() };
    }
    slot
}

#[cfg(test)]
mod tests {
    use sluice_policies::wire::{Check, CheckOutcome, LimitOutcome};

    use super::*;
    use sluice_policies::units::Micros;

    fn request(policies: &[(&str, &str)], wait_ms: Option<u64>) -> CheckRequest<'static> {
        let checks: Vec<Check> = policies
            .iter()
            .map(|(policy, key)| Check {
                policy: policy.to_string(),
                key: key.to_string(),
                limits: vec![WireLimit::Concurrency { limit: 5, lease_ms: Millis(1000) }],
                margin_ms: None,
                upstream: false,
                levels: Vec::new(),
            })
            .collect();
        CheckRequest {
            checks: checks.into(),
            id: None,
            now_us: None,
            wait_ms: wait_ms.map(Millis),
            views: Default::default(),
        }
    }

    fn admitted(checks: usize, waited_ms: Option<u64>, reclaimed: u64) -> Result<CheckResponse, CheckError> {
        let limit = LimitOutcome {
            allowed: true,
            remaining: 1,
            reset_ms: Millis(0),
            retry_after_ms: Some(Millis(0)),
            reclaimed,
            held_until_us: None,
            refunded_us: Micros(0),
        };
        Ok(CheckResponse {
            allowed: true,
            retry_after_ms: Some(Millis(0)),
            checks: vec![CheckOutcome { limits: vec![limit], paused_ms: None }; checks],
            lease: None,
            waited_ms: waited_ms.map(Millis),
        })
    }

    #[test]
    fn rates_cover_the_last_whole_seconds() {
        let traffic = Traffic::default();
        let req = request(&[("api", "k")], None);
        for second in [10, 11, 11, 12, 12, 12] {
            traffic.record_at(second, &req, &admitted(1, None, 0), "allowed", None);
        }
        let rate = |now| traffic.seen_at(now, 1)["api"].rates.allowed;
        // At 13 the last five whole seconds (8 to 12) hold all six.
        assert_eq!(rate(13), 6.0 / 5.0);
        // At 17 only second 12 is within 12 to 16.
        assert_eq!(rate(17), 3.0 / 5.0);
        assert_eq!(rate(18), 0.0);
        assert_eq!(traffic.seen_at(18, 1)["api"].totals.allowed, 6);
    }

    #[test]
    fn a_denial_counts_for_the_policy_that_denied_and_every_key_for_its_policy() {
        let traffic = Traffic::default();
        let req = request(&[("search", "a"), ("api", "b")], None);
        let denied = Ok(CheckResponse {
            allowed: false,
            retry_after_ms: None,
            checks: Vec::new(),
            lease: None,
            waited_ms: None,
        });
        traffic.record_at(1, &req, &denied, "denied", Some(1));
        let seen = traffic.seen_at(2, 5);
        assert_eq!(seen["api"].totals.denied, 1);
        assert_eq!(seen["search"].totals, Totals::default());
        assert_eq!(seen["search"].keys[0].0, "a");
        assert_eq!(seen["api"].limits, [WireLimit::Concurrency { limit: 5, lease_ms: Millis(1000) }]);
    }

    #[test]
    fn waiting_requests_count_as_immediate_or_waited_with_their_wait() {
        let traffic = Traffic::default();
        let req = request(&[("egress", "k")], Some(15_000));
        traffic.record_at(1, &req, &admitted(1, None, 2), "allowed", None);
        traffic.record_at(1, &req, &admitted(1, Some(250), 0), "waited", None);
        traffic.record_at(1, &req, &admitted(1, Some(100), 0), "waited", None);
        let totals = traffic.seen_at(2, 1)["egress"].totals;
        assert_eq!((totals.immediate, totals.waited, totals.wait_ms, totals.reclaimed), (1, 2, 350, 2));
    }

    /// Decisions and reported failure-mode passes land in the history's
    /// bucket of their time; errors do not.
    #[test]
    fn the_history_counts_decisions_and_reported_passes() {
        use super::super::history::BUCKET_S;
        let traffic = Traffic::default();
        let req = request(&[("api", "k")], Some(1_000));
        traffic.record_at(10, &req, &admitted(1, None, 0), "allowed", None);
        traffic.record_at(10, &req, &admitted(1, Some(300), 0), "waited", None);
        traffic.record_at(10, &req, &Err(CheckError::Store(String::new())), "error", None);
        traffic.passed_at(10 + BUCKET_S, "api", 3);
        traffic.passed_at(10 + BUCKET_S, "not a name", 3);
        let seen = traffic.seen_at(10 + BUCKET_S, 1);
        let history = &seen["api"].history;
        let last_two = |series: &[u64]| series[series.len() - 2..].to_vec();
        assert_eq!(last_two(&history.allowed), [1, 0]);
        assert_eq!(last_two(&history.waited), [1, 0]);
        assert_eq!(last_two(&history.failure_passes), [0, 3]);
        assert!(history.denied.iter().all(|&n| n == 0));
        assert_eq!((seen["api"].totals.failure_passes, seen.len()), (3, 1));
    }

    #[test]
    fn policies_are_capped_and_invalid_names_ignored() {
        let traffic = Traffic::default();
        for i in 0..MAX_POLICIES + 10 {
            let name = format!("p{i}");
            traffic.record_at(1, &request(&[(&name, "k")], None), &admitted(1, None, 0), "allowed", None);
        }
        traffic.record_at(1, &request(&[("not a name", "k")], None), &admitted(1, None, 0), "allowed", None);
        assert_eq!(traffic.seen_at(1, 1).len(), MAX_POLICIES);
        // Reports are held to the same cap.
        traffic.passed_at(1, "reported-only", 1);
        assert!(!traffic.seen_at(1, 1).contains_key("reported-only"));
        // A key the shim refuses is never kept.
        let long = "k".repeat(70_000);
        traffic.record_at(
            1,
            &request(&[("p0", long.as_str()), ("p0", "a b")], None),
            &Err(CheckError::BadRequest(String::new())),
            "invalid",
            None,
        );
        let p0 = &traffic.seen_at(1, 5)["p0"];
        assert_eq!((p0.keys.len(), p0.totals.errors), (1, 2));
    }
}
