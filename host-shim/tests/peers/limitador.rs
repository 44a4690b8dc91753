//! A model of Limitador's decision, written from its documentation, for the
//! differential test (`host-shim/tests/rls_peers.rs`).

use std::collections::HashMap;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use serde::Deserialize;

use super::ratelimit::{Call, OK, OVER};

// The rules: each limit of the
// call's namespace applies when all its conditions hold on descriptors[0]
// (a missing entry: false) and all its variables resolve, its counter
// qualified by the variables' values; the call is limited when one
// counter would pass its max_value, and then no counter is charged. A
// counter is created by the hit that charges it, and expires `seconds`
// after: from then (expiry <= now) it counts 0, and the next charged hit
// creates it again.

#[derive(Debug, Deserialize)]
struct Limit {
    namespace: String,
    max_value: u64,
    seconds: u64,
    #[serde(default)]
    conditions: Option<Vec<String>>,
    #[serde(default)]
    variables: Option<Vec<String>>,
}

/// `descriptors[0]['k'] OP 'v'` read the model's own way: (k, equal, v).
fn parse_condition(text: &str) -> (String, bool, String) {
    let (left, equal, right) = match text.split_once("==") {
        Some((l, r)) => (l, true, r),
        None => {
            let (l, r) = text.split_once("!=").expect("== or !=");
            (l, false, r)
        }
    };
    (parse_variable(left), equal, right.trim().trim_matches(['\'', '"']).to_string())
}

fn parse_variable(text: &str) -> String {
    let rest = text.trim().strip_prefix("descriptors[0]").expect("descriptors[0]");
    match rest.strip_prefix('.') {
        Some(name) => name.to_string(),
        None => rest.trim_matches(['[', ']', '\'', '"']).to_string(),
    }
}

pub struct Limitador {
    limits: Vec<Limit>,
    /// Each counter's value and its expiry, in µs.
    counters: HashMap<String, (u64, u64)>,
}

impl Limitador {
    /// The model of a limits file (YAML).
    pub fn new(yaml: &str) -> Limitador {
        Limitador {
            limits: serde_norway::from_str(yaml).expect("the model's limits"),
            counters: HashMap::new(),
        }
    }
}

impl Limitador {
    /// Limitador's whole answer to the call (its RLS server, with its
    /// rate-limit headers off, their default): the overall code alone, with
    /// no statuses and no headers.
    pub fn answer_at(&mut self, domain: &str, call: &Call, now: u64, hits: u64) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: self.decide_hits_at(domain, call, now, hits),
            ..RateLimitResponse::default()
        }
    }

    /// The call's overall code at `now` (µs), each matching limit's counter
    /// taking `hits` (the call's `hits_addend`, Limitador's delta): limited
    /// when a counter would pass its `max_value`, and then none is updated.
    pub fn decide_hits_at(&mut self, domain: &str, call: &Call, now: u64, hits: u64) -> i32 {
        let first: HashMap<&str, &str> = call[0].iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut counters = Vec::new();
        for (i, limit) in self.limits.iter().enumerate() {
            if limit.namespace != domain {
                continue;
            }
            let holds = limit.conditions.iter().flatten().all(|c| {
                let (k, equal, v) = parse_condition(c);
                first.get(k.as_str()).is_some_and(|got| (*got == v) == equal)
            });
            let values: Option<Vec<&str>> = limit
                .variables
                .iter()
                .flatten()
                .map(|v| first.get(parse_variable(v).as_str()).copied())
                .collect();
            if let (true, Some(values)) = (holds, values) {
                counters.push((format!("{i}|{}", values.join("|")), limit.max_value, limit.seconds));
            }
        }
        let value = |c: &HashMap<String, (u64, u64)>, k: &str| match c.get(k) {
            Some(&(n, expiry)) if expiry > now => n,
            _ => 0,
        };
        let limited = counters.iter().any(|(k, max, _)| value(&self.counters, k) + hits > *max);
        if !limited {
            for (k, _, seconds) in counters {
                let live = value(&self.counters, &k);
                let entry = self.counters.entry(k).or_insert((0, 0));
                if live == 0 {
                    *entry = (hits, now + seconds * 1_000_000);
                } else {
                    entry.0 += hits;
                }
            }
        }
        if limited {
            OVER
        } else {
            OK
        }
    }
}

/// Short windows, for runs that cross their ends.
pub const LIMITADOR_SHORT: &str = r#"
- namespace: shop
  max_value: 5
  seconds: 3
  conditions: []
  variables: []
- namespace: shop
  max_value: 2
  seconds: 2
  conditions: ["descriptors[0]['req.method'] == 'POST'"]
  variables: ["descriptors[0]['user']"]
- namespace: shop
  max_value: 3
  seconds: 1
  conditions: ["descriptors[0].method == 'GET'", "descriptors[0].path != '/health'"]
  variables: []
"#;

/// The limits the differential runs use.
pub const LIMITADOR: &str = r#"
- namespace: shop
  max_value: 30
  seconds: 86400
  conditions: []
  variables: []
- namespace: shop
  max_value: 4
  seconds: 86400
  name: "posts per user"
  conditions: ["descriptors[0]['req.method'] == 'POST'"]
  variables: ["descriptors[0]['user']"]
- namespace: shop
  max_value: 6
  seconds: 86400
  conditions: ["descriptors[0].method == 'GET'", "descriptors[0].path != '/health'"]
  variables: []
- namespace: shop
  max_value: 3
  seconds: 86400
  conditions: ["descriptors[0]['path'] == '/checkout'"]
  variables: ["descriptors[0].user"]
- namespace: other
  max_value: 1
  seconds: 86400
  conditions: []
  variables: []
"#;
