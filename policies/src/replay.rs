//! Replaying traffic through a document: each request, in time order,
//! through the matcher and the reference model of the Redis scripts (what
//! the shim would have decided), counted per policy. `sluice simulate`
//! replays access logs with it, and the browser playground generated traffic.
//!
//! Requests are decided as the filter sends them, by the one plan every
//! face makes (`crate::plan`): the enforced policies that apply in one
//! all-or-nothing check, the shadow ones in another. A request
//! admitted with a concurrency limit holds its lease for its `duration_ms`.
//! The model's state keys are named like the shim's: one per policy, key and
//! limit.
//!
//! A logged request is known only from its record, which holds some of its
//! attributes and not others ([`Recorded`]): Envoy's text format logs no
//! peer address and three headers. A policy whose key reads what the record
//! does not hold decides nothing for that request, and is counted apart
//! ([`PolicyReport::unrecorded`]): never in the shared bucket of requests
//! that truly lacked a key.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use serde::Serialize;

use crate::algorithm::{self, Algorithm, RedisTwin};
use crate::plan::plan_evaluated;
use crate::request::{Attribute, SimpleRequest};
use crate::wire::{Check, LimitOutcome, WireLimit};
use crate::{Document, Policy};

/// One request to replay.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// Microseconds since any fixed origin; requests come in this order.
    pub at_us: u64,
    pub request: SimpleRequest,
    /// How long it is in flight: when a concurrency lease ends.
    pub duration_ms: u64,
    /// Its LLM token count as logged, as a policy's `llm` would charge it:
    /// what its `llm_tokens` limits are charged (see [`Replay`]).
    pub tokens: Option<u64>,
    /// What the record of it holds.
    pub recorded: Recorded,
}

/// Which of a request's attributes its record holds. The path and method
/// always are; a record that holds a header the request lacked says so (the
/// request lacked it), one that does not hold it cannot say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The downstream peer address.
    pub source_address: bool,
    pub authority: bool,
    pub headers: RecordedHeaders,
    /// A gRPC face's request: its domain, and its descriptor's entries or
    /// bucket id (one the record lacks, the request lacked).
    pub grpc: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordedHeaders {
    /// Every header: one the record lacks, the request lacked.
    All,
    /// Only these, by lower-case name.
    Only(Vec<String>),
}

impl Recorded {
    /// A record that holds the whole request: generated traffic.
    pub const EVERYTHING: Recorded =
        Recorded { source_address: true, authority: true, headers: RecordedHeaders::All, grpc: true };

    pub fn holds(&self, attribute: Attribute<'_>) -> bool {
        match attribute {
            Attribute::Path | Attribute::Method => true,
            Attribute::Authority => self.authority,
            Attribute::SourceAddress => self.source_address,
            Attribute::Domain | Attribute::Entry(_) | Attribute::Bucket(_) => self.grpc,
            // Logs record no request body.
            Attribute::Body(_) => false,
            Attribute::Header(name) => match &self.headers {
                RecordedHeaders::All => true,
                RecordedHeaders::Only(names) => names.iter().any(|n| n == name),
            },
        }
    }
}

/// What happened to one request, for a timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    pub at_us: u64,
    /// `admitted`, `denied`, `missing_key` or `unlimited` (no policy applied).
    pub decision: &'static str,
    /// The enforced policies that applied, with their keys and each
    /// limit's remaining capacity after the decision.
    pub policies: Vec<PolicyEvent>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyEvent {
    pub policy: String,
    pub key: String,
    pub remaining: Vec<u64>,
    pub allowed: Vec<bool>,
}

/// What one policy would have done to the traffic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PolicyReport {
    pub policy: String,
    /// The face its requests come through: `filter`, `rls` or `rlqs`.
    pub face: &'static str,
    pub shadow: bool,
    pub matched: u64,
    pub admitted: u64,
    /// Refused by one of this policy's limits.
    pub denied: u64,
    /// Refused for a missing key (`on_missing_key: deny`).
    pub missing_key: u64,
    /// Matched, but the key reads what the request's record does not hold:
    /// decided nothing, per key source (the first such source of each
    /// request). Also in `matched`.
    pub unrecorded: Vec<Unrecorded>,
    pub limits: Vec<LimitReport>,
    /// The keys with the most requests, most first.
    pub busiest_keys: Vec<(String, u64)>,
    /// A policy with an `llm`: the tokens its admitted requests were charged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokensReport>,
}

/// What a policy with an `llm` charged in a replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TokensReport {
    /// Tokens charged to admitted requests: their logged counts (or
    /// reservations, for those without one).
    pub charged: u64,
    /// Requests whose line had no token count: charged the reservation a
    /// request without a body makes (`default_max_tokens`).
    pub unlogged: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unrecorded {
    /// The key source as the document writes it: `ip`, `header:x-api-key`.
    pub source: String,
    pub requests: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LimitReport {
    pub limit: String,
    pub capacity: u64,
    /// The most of `capacity` in use right after any admission.
    pub peak: u64,
    pub denied: u64,
}

/// How many busiest keys a report lists.
const BUSIEST: usize = 5;

/// A lease to end: (until µs, sequence, lease id, (key, limit, lease µs) of each).
type Ending = (u64, u64, String, Vec<(String, u64, u64)>);

pub struct Replay<'d> {
    doc: &'d Document,
    store: RedisTwin,
    /// Leases to end, soonest first.
    leases: BinaryHeap<Reverse<Ending>>,
    reports: Vec<PolicyReport>,
    keys: Vec<HashMap<String, u64>>,
    /// Per policy, per key source: requests whose record lacked it.
    unrecorded: Vec<Vec<u64>>,
    sequence: u64,
}

impl<'d> Replay<'d> {
    pub fn new(doc: &'d Document) -> Replay<'d> {
        let reports = doc
            .policies
            .iter()
            .map(|p| PolicyReport {
                policy: p.name.as_str().to_string(),
                face: p.matcher.face().name(),
                shadow: p.shadow,
                tokens: p.llm.as_ref().map(|_| TokensReport::default()),
                limits: p
                    .limits
                    .iter()
                    .map(|l| {
                        let wire = WireLimit::with_cost(l, 1);
                        LimitReport {
                            limit: wire.describe(),
                            capacity: wire.capacity().into(),
                            peak: 0,
                            denied: 0,
                        }
                    })
                    .collect(),
                ..PolicyReport::default()
            })
            .collect();
        Replay {
            doc,
            store: RedisTwin::default(),
            leases: BinaryHeap::new(),
            reports,
            keys: vec![HashMap::new(); doc.policies.len()],
            unrecorded: doc.policies.iter().map(|p| vec![0; p.key_sources().len()]).collect(),
            sequence: 0,
        }
    }

    /// Decides one request; requests must come in time order.
    pub fn request(&mut self, logged: &Replayed) -> Event {
        let now = logged.at_us;
        while let Some(Reverse((until, ..))) = self.leases.peek() {
            if *until > now {
                break;
            }
            if let Some(Reverse((until, _, id, keys))) = self.leases.pop() {
                algorithm::release(&mut self.store, until, &keys, &id);
            }
        }
        let evaluation = self.doc.evaluate_recorded(&logged.request, |a| logged.recorded.holds(a));
        if let Ok(evaluation) = &evaluation {
            for &(i, source) in &evaluation.unrecorded {
                if let (Some(report), Some(n)) =
                    (self.reports.get_mut(i), self.unrecorded.get_mut(i).and_then(|u| u.get_mut(source)))
                {
                    report.matched += 1;
                    *n += 1;
                }
            }
        }
        let mut event = Event { at_us: now, decision: "unlimited", policies: Vec::new() };
        // One request is bounded by the document to what the shim decides
        // at once: its plan cannot fail.
        let Ok(plan) = plan_evaluated(self.doc, [(&logged.request, None, &evaluation)]) else { return event };
        let Some(planned) = plan.descriptors.first() else { return event };
        if let Some(policy) = planned.missing_key {
            self.count(policy, |r| r.missing_key += 1);
            event.decision = "missing_key";
            return event;
        }
        // A shadow policy's missing key is a would-deny, never a refusal.
        for policy in &planned.shadow_missing_key {
            self.count(policy, |r| r.missing_key += 1);
        }
        for policy in &planned.unlimited {
            self.count(policy, |r| r.admitted += 1);
        }
        for policy in &planned.blocked {
            self.count(policy, |r| r.denied += 1);
        }
        if planned.matched() {
            event.decision = "admitted";
        }
        if planned.refused() {
            event.decision = "denied";
            return event;
        }
        for (checks, shadow) in [(&plan.enforced, false), (&plan.shadow, true)] {
            let chosen: Vec<(usize, Check)> = (checks.policies.iter().zip(&checks.checks))
                .filter_map(|(policy, check)| {
                    let index = self.doc.index_of(policy)?;
                    Some((index, self.charged(policy, index, check.clone(), logged)))
                })
                .collect();
            if chosen.is_empty() {
                continue;
            }
            let (allowed, outcomes) = self.decide(now, logged.duration_ms, &chosen);
            if !shadow {
                event.decision = if allowed { "admitted" } else { "denied" };
                let mut outcomes = outcomes.iter();
                for (_, check) in &chosen {
                    let mine: Vec<&LimitOutcome> = outcomes.by_ref().take(check.limits.len()).collect();
                    event.policies.push(PolicyEvent {
                        policy: check.policy.clone(),
                        key: check.key.clone(),
                        remaining: mine.iter().map(|o| o.remaining).collect(),
                        allowed: mine.iter().map(|o| o.allowed).collect(),
                    });
                }
            }
        }
        event
    }

    /// Counts a request `policy` decided without a check.
    fn count(&mut self, policy: &Policy, what: impl FnOnce(&mut PolicyReport)) {
        if let Some(report) = self.doc.index_of(policy).and_then(|i| self.reports.get_mut(i)) {
            report.matched += 1;
            what(report);
        }
    }

    /// The planned `check` of `policy` (document index `index`) for
    /// `logged`. A log holds no body, so a policy with an `llm` is charged
    /// the logged token count at once, as if its reservation had been exact
    /// (the gateway reserves at least that much while the request is in
    /// flight: its denials are at least these); without a count, the
    /// reservation of a request without a body.
    fn charged(&mut self, policy: &Policy, index: usize, mut check: Check, logged: &Replayed) -> Check {
        if policy.llm.is_none() {
            return check;
        }
        let report = self.reports[index].tokens.get_or_insert_with(TokensReport::default);
        let Some(tokens) = logged.tokens else {
            // The check carries the reservation already.
            report.unlogged += 1;
            return check;
        };
        let tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
        for (limit, wire) in policy.limits.iter().zip(&mut check.limits) {
            if limit.costs_llm_tokens() {
                let capacity = wire.capacity();
                *wire = WireLimit::with_cost(limit, tokens.min(capacity));
            }
        }
        check
    }

    /// One all-or-nothing check; whether it passed, and each limit's outcome.
    fn decide(&mut self, now: u64, duration_ms: u64, chosen: &[(usize, Check)]) -> (bool, Vec<LimitOutcome>) {
        let mut model: Vec<(String, Algorithm)> = Vec::new();
        for (_, check) in chosen {
            for (i, limit) in check.limits.iter().enumerate() {
                let algorithm = Algorithm::of(limit);
                let key = algorithm.state_key(&check.state_prefix(i));
                model.push((key, algorithm));
            }
        }
        self.sequence += 1;
        let id = format!("r{}", self.sequence);
        let reply = algorithm::check(&mut self.store, now, &id, &model);
        let mut outcomes = reply.limits.iter();
        for (index, check) in chosen {
            let report = &mut self.reports[*index];
            report.matched += 1;
            *self.keys[*index].entry(check.key.clone()).or_insert(0) += 1;
            let mine: Vec<_> = outcomes.by_ref().take(check.limits.len()).collect();
            if reply.allowed {
                report.admitted += 1;
                if let Some(tokens) = &mut report.tokens {
                    let limits = self.doc.policies[*index].limits.iter().zip(&check.limits);
                    let cost =
                        limits.filter(|(l, _)| l.costs_llm_tokens()).find_map(|(_, w)| w.points_cost());
                    tokens.charged += u64::from(cost.unwrap_or(0));
                }
                for (limit, outcome) in report.limits.iter_mut().zip(&mine) {
                    limit.peak = limit.peak.max(limit.capacity.saturating_sub(outcome.remaining));
                }
            } else if mine.iter().any(|o| !o.allowed) {
                report.denied += 1;
                for (limit, outcome) in report.limits.iter_mut().zip(&mine) {
                    limit.denied += u64::from(!outcome.allowed);
                }
            }
        }
        let lease_keys: Vec<(String, u64, u64)> = model
            .iter()
            .filter_map(|(k, a)| match *a {
                Algorithm::Concurrency { limit, lease_us } => Some((k.clone(), limit, lease_us.get())),
                _ => None,
            })
            .collect();
        if reply.allowed && !lease_keys.is_empty() {
            let until = now.saturating_add(duration_ms.saturating_mul(1000));
            self.leases.push(Reverse((until, self.sequence, id, lease_keys)));
        }
        (reply.allowed, reply.limits)
    }

    pub fn finish(mut self) -> Vec<PolicyReport> {
        for ((report, counts), policy) in
            self.reports.iter_mut().zip(&self.unrecorded).zip(self.doc.policies.iter())
        {
            report.unrecorded = (policy.key_sources().iter().zip(counts))
                .filter(|(_, n)| **n > 0)
                .map(|(source, n)| Unrecorded { source: source.to_string(), requests: *n })
                .collect();
        }
        for (report, keys) in self.reports.iter_mut().zip(self.keys) {
            let mut busiest: Vec<(String, u64)> = keys.into_iter().collect();
            busiest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            busiest.truncate(BUSIEST);
            report.busiest_keys = busiest;
        }
        self.reports
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shadow policy's missing key (`on_missing_key: deny`) is counted
    /// for that policy and refuses nothing: the enforced policy decides.
    #[test]
    fn a_shadow_missing_key_refuses_nothing() {
        let doc = crate::parse(
            r#"{"policies": [
                {"name": "enforced", "limits": [{"type": "interval", "every": "1ms"}]},
                {"name": "trial", "shadow": true, "key": ["header:x-api-key"], "on_missing_key": "deny",
                 "limits": [{"type": "interval", "every": "1s"}]}]}"#,
        )
        .expect("valid document");
        let mut replay = Replay::new(&doc);
        let logged = Replayed {
            at_us: 1_000_000,
            request: SimpleRequest::new("GET", "/"),
            duration_ms: 1,
            tokens: None,
            recorded: Recorded::EVERYTHING,
        };
        assert_eq!(replay.request(&logged).decision, "admitted");
        let reports = replay.finish();
        assert_eq!((reports[1].matched, reports[1].missing_key), (1, 1));
        assert_eq!(reports[0].admitted, 1);
    }

    /// A key the record does not hold is counted apart, never in the shared
    /// bucket; a header the record holds but the request lacked goes where
    /// the gateway puts it (`on_missing_key`, here the shared bucket).
    #[test]
    fn a_key_the_log_does_not_hold_is_not_a_missing_key() {
        let doc = crate::parse(
            r#"{"policies": [
                {"name": "by-ip", "key": ["ip"], "limits": [{"type": "interval", "every": "1s"}]},
                {"name": "by-tenant", "key": ["header:x-tenant"], "limits": [{"type": "interval", "every": "1s"}]}]}"#,
        )
        .expect("valid document");
        let text_log = Recorded {
            source_address: false,
            grpc: false,
            authority: true,
            headers: RecordedHeaders::Only(vec!["x-forwarded-for".into()]),
        };
        let mut replay = Replay::new(&doc);
        for (at_us, recorded) in
            [(1_000_000, text_log.clone()), (2_000_000, text_log), (3_000_000, Recorded::EVERYTHING)]
        {
            replay.request(&Replayed {
                at_us,
                request: SimpleRequest::new("GET", "/"),
                duration_ms: 1,
                tokens: None,
                recorded,
            });
        }
        let reports = replay.finish();
        let by_ip = &reports[0];
        // The third is recorded whole: it truly had no peer address.
        assert_eq!((by_ip.matched, by_ip.admitted), (3, 1));
        assert_eq!(by_ip.busiest_keys, vec![(crate::key::MISSING.to_string(), 1)]);
        assert_eq!(by_ip.unrecorded, vec![Unrecorded { source: "ip".into(), requests: 2 }]);
        let by_tenant = &reports[1];
        assert_eq!(by_tenant.unrecorded, vec![Unrecorded { source: "header:x-tenant".into(), requests: 2 }]);
        assert_eq!(by_tenant.busiest_keys, vec![(crate::key::MISSING.to_string(), 1)]);
    }

    /// A replay counts a calendar day from local midnight to local midnight,
    /// and a hierarchy's levels each on their own key: team `a` spends its
    /// share, team `b` still passes until the organisation's day is spent;
    /// the next Paris day (not the next UTC day) admits again.
    #[test]
    fn calendar_windows_and_levels_replay_as_the_shim_decides() {
        let doc = crate::parse(
            r#"{"policies": [{"name": "org", "key": ["header:x-org"],
                "limits": [{"type": "fixed_window", "limit": 3, "window": {"calendar": "day", "zone": "Europe/Paris"}}],
                "levels": [{"name": "team", "key": ["header:x-org", "header:x-team"],
                            "limits": [{"type": "fixed_window", "limit": 2, "window": {"calendar": "day", "zone": "Europe/Paris"}}]}]}]}"#,
        )
        .expect("valid document");
        let mut replay = Replay::new(&doc);
        let mut decide = |at_us: u64, team: &str| {
            let request = SimpleRequest::new("GET", "/").header("x-org", "acme").header("x-team", team);
            replay
                .request(&Replayed {
                    at_us,
                    request,
                    duration_ms: 1,
                    tokens: None,
                    recorded: Recorded::EVERYTHING,
                })
                .decision
        };
        // 2026-03-10 20:00 UTC is 21:00 in Paris; Paris's next day starts at 23:00 UTC.
        let evening = 1_773_172_800_000_000;
        let hour = 3_600_000_000;
        let got: Vec<&str> = vec![
            decide(evening, "a"),
            decide(evening, "a"),
            decide(evening, "a"),
            decide(evening, "b"),
            decide(evening, "b"),
            decide(evening + 2 * hour + 1, "b"),
            decide(evening + 3 * hour, "b"),
        ];
        assert_eq!(got, ["admitted", "admitted", "denied", "admitted", "denied", "denied", "admitted"]);
    }
}
