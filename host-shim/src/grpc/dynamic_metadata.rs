//! An RLS answer's `dynamic_metadata`, with the document's
//! `dynamic_metadata` on, as envoyproxy/ratelimit fills it when its
//! `RESPONSE_DYNAMIC_METADATA` is on:
//!
//! - `domain`: the call's;
//! - `descriptors`: each descriptor of the call, in order, as `entries`
//!   (each `key=value`) and its own `hitsAddend` when it has one;
//! - `hitsAddend`: the call's, when not 0;
//! - `metadata`: the `metadata` of the policies that decided the
//!   descriptors that passed (not over, neither unlimited nor replaced),
//!   merged in order: a key already there stays, two objects under one key
//!   are merged the same way; left out when empty.
//!
//! Envoy's filter puts it in the request's dynamic metadata
//! (`envoy.filters.http.ratelimit`), for the access log or later filters.

use std::collections::HashMap;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};
use serde_json::{Map, Value as Json};
use sluice_policies::plan::Plan;

/// The struct for `req`, whose plan is `plan` and whose descriptors' codes
/// are `over` (`over[i]`: the descriptor at `i` is answered over).
pub fn of(req: &RateLimitRequest, plan: &Plan<'_>, over: &[bool]) -> Struct {
    let mut fields = HashMap::new();
    fields.insert("domain".to_string(), string(req.domain.clone()));
    let descriptors = req
        .descriptors
        .iter()
        .map(|d| {
            let entries = d.entries.iter().map(|e| string(format!("{}={}", e.key, e.value))).collect();
            let mut fields = HashMap::from([("entries".to_string(), list(entries))]);
            if let Some(hits) = &d.hits_addend {
                fields.insert("hitsAddend".to_string(), number(hits.value as f64));
            }
            value(Kind::StructValue(Struct { fields }))
        })
        .collect();
    fields.insert("descriptors".to_string(), list(descriptors));
    if req.hits_addend != 0 {
        fields.insert("hitsAddend".to_string(), number(f64::from(req.hits_addend)));
    }
    let mut passed = Map::new();
    for (planned, over) in plan.descriptors.iter().zip(over) {
        if *over {
            continue;
        }
        let enforced = planned.enforced.iter().filter_map(|&c| plan.enforced.policies.get(c));
        let shadow = planned.shadow.iter().filter_map(|&c| plan.shadow.policies.get(c));
        for metadata in enforced.chain(shadow).filter_map(|p| p.metadata.as_ref()) {
            merge(&mut passed, metadata);
        }
    }
    if !passed.is_empty() {
        fields.insert("metadata".to_string(), json(&Json::Object(passed)));
    }
    Struct { fields }
}

/// Adds `from`'s keys that `into` lacks; under a key both hold objects
/// at, merges those.
fn merge(into: &mut Map<String, Json>, from: &Map<String, Json>) {
    for (key, v) in from {
        match (into.get_mut(key), v) {
            (Some(Json::Object(mine)), Json::Object(theirs)) => merge(mine, theirs),
            (Some(_), _) => {}
            (None, v) => {
                into.insert(key.clone(), v.clone());
            }
        }
    }
}

/// A JSON value as a protobuf one (numbers as doubles).
fn json(v: &Json) -> Value {
    value(match v {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(items) => Kind::ListValue(ListValue { values: items.iter().map(json).collect() }),
        Json::Object(map) => {
            Kind::StructValue(Struct { fields: map.iter().map(|(k, v)| (k.clone(), json(v))).collect() })
        }
    })
}

fn value(kind: Kind) -> Value {
    Value { kind: Some(kind) }
}

fn string(s: String) -> Value {
    value(Kind::StringValue(s))
}

fn number(n: f64) -> Value {
    value(Kind::NumberValue(n))
}

fn list(values: Vec<Value>) -> Value {
    value(Kind::ListValue(ListValue { values }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_already_there_stays_and_objects_merge() {
        let mut into = serde_json::json!({"team": "a", "tags": {"x": 1}});
        let from = serde_json::json!({"team": "b", "tags": {"x": 2, "y": 3}, "new": true});
        let (Json::Object(into_map), Json::Object(from_map)) = (&mut into, &from) else { unreachable!() };
        merge(into_map, from_map);
        assert_eq!(into, serde_json::json!({"team": "a", "tags": {"x": 1, "y": 3}, "new": true}));
    }
}
