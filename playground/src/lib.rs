//! The policy playground's engine, compiled with wasm-bindgen for the
//! browser: the real policy parser and the real reference model from
//! `sluice_policies`, not a copy. The page (`www/`) calls two functions:
//!
//! - [`validate`]: a document's errors, with their JSON path and line:column,
//!   as the operator types;
//! - [`run`]: a traffic pattern ([`pattern`]) replayed through the document,
//!   request by request, for the timeline.
//!
//! Both take and return JSON text, so the page needs no generated types.

pub mod pattern;

use serde::Serialize;
use sluice_policies::replay::{Event, PolicyReport, Replay};
use wasm_bindgen::prelude::wasm_bindgen;

#[derive(Serialize)]
struct Validated<'a> {
    ok: bool,
    error: Option<String>,
    policies: Vec<&'a str>,
}

/// `{"ok": true, "policies": [...]}` or `{"ok": false, "error": "..."}`.
#[wasm_bindgen]
pub fn validate(document: &str) -> String {
    let reply = match sluice_policies::parse(document) {
        Ok(doc) => {
            let names: Vec<String> = doc.policies.iter().map(|p| p.name.as_str().to_string()).collect();
            let policies = names.iter().map(String::as_str).collect();
            serde_json::to_string(&Validated { ok: true, error: None, policies })
        }
        Err(err) => serde_json::to_string(&Validated {
            ok: false,
            error: Some(err.to_string()),
            policies: Vec::new(),
        }),
    };
    reply.unwrap_or_default()
}

#[derive(Serialize)]
struct Ran {
    ok: bool,
    error: Option<String>,
    /// Per request: when (ms from the start), its key, and what happened.
    events: Vec<Timed>,
    reports: Vec<PolicyReport>,
}

#[derive(Serialize)]
struct Timed {
    at_ms: f64,
    stream: usize,
    #[serde(flatten)]
    event: Event,
}

/// Replays `pattern` through `document`: `{"ok": true, "events": [...],
/// "reports": [...]}` or `{"ok": false, "error": "..."}`.
#[wasm_bindgen]
pub fn run(document: &str, pattern: &str) -> String {
    let failed =
        |error: String| Ran { ok: false, error: Some(error), events: Vec::new(), reports: Vec::new() };
    let reply = match (sluice_policies::parse(document), pattern::Pattern::parse(pattern)) {
        (Err(err), _) => failed(format!("document: {err}")),
        (_, Err(err)) => failed(format!("pattern: {err}")),
        (Ok(doc), Ok(pattern)) => {
            let mut replay = Replay::new(&doc);
            let events = pattern
                .requests()
                .into_iter()
                .map(|(stream, r)| Timed {
                    at_ms: r.at_us as f64 / 1000.0,
                    stream,
                    event: replay.request(&r),
                })
                .collect();
            Ran { ok: true, error: None, events, reports: replay.finish() }
        }
    };
    serde_json::to_string(&reply).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_gives_the_parsers_message() {
        let reply: serde_json::Value =
            serde_json::from_str(&validate(r#"{"policies": [{"name": "a", "limits": []}]}"#)).expect("JSON");
        assert_eq!(reply["ok"], false);
        let error = reply["error"].as_str().expect("an error");
        assert_eq!(error, "policies[0]: a policy needs at least one limit at 1:42");
    }

    /// A token budget: each request charged the tokens its stream says it
    /// uses, until the budget has no room for the next.
    #[test]
    fn run_charges_a_token_budget() {
        let doc = r#"{"policies": [{"name": "team", "key": ["header:x-team"], "llm": {"api": "openai_chat"},
                       "limits": [{"type": "points", "capacity": 1000, "refill": "1d", "cost": "llm_tokens"}]}]}"#;
        let pattern =
            r#"{"streams": [{"headers": {"x-team": "blue"}, "burst": 5, "at": "1s", "tokens": 300}]}"#;
        let reply: serde_json::Value = serde_json::from_str(&run(doc, pattern)).expect("JSON");
        let decisions: Vec<&str> = reply["events"]
            .as_array()
            .expect("events")
            .iter()
            .filter_map(|e| e["decision"].as_str())
            .collect();
        assert_eq!(decisions, ["admitted", "admitted", "admitted", "denied", "denied"]);
        assert_eq!(reply["reports"][0]["tokens"]["charged"], 900);
        assert_eq!(reply["reports"][0]["tokens"]["unlogged"], 0);
    }

    #[test]
    fn run_decides_a_burst() {
        let doc = r#"{"policies": [{"name": "api", "key": ["header:x-user"],
                       "limits": [{"type": "fixed_window", "limit": 3, "window": "1m"}]}]}"#;
        let pattern = r#"{"streams": [{"headers": {"x-user": "ann"}, "burst": 5, "at": "1s"}]}"#;
        let reply: serde_json::Value = serde_json::from_str(&run(doc, pattern)).expect("JSON");
        let decisions: Vec<&str> = reply["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|e| e["decision"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(decisions, ["admitted", "admitted", "admitted", "denied", "denied"]);
        assert_eq!(reply["events"][2]["policies"][0]["remaining"][0], 0);
    }
}
