//! The token-budget demo (`cargo xtask demo --llm`): teams streaming chat
//! completions through Envoy to the mock LLM provider
//! (`policies/examples/llm-demo.json`: 10,000 tokens per team per UTC day),
//! each with a few clients that send until the gateway refuses them. A test
//! runs the same code.
//!
//! Every number says what it is. Requests are counted by the gateway's own
//! verdict (`x-sluice-verdict`): a request `failure_mode` let through
//! undecided is never counted as admitted. Tokens are the provider's own
//! count of what it served (`Served::billed`), not the gateway's: the table
//! shows how close the gateway held each team to its budget, from the far
//! side.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use sluice_policies::llm::Api;

use crate::llm::{self, post, request_body, LlmUpstream};

/// Each team's budget in `policies/examples/llm-demo.json`.
pub const BUDGET: u64 = 10_000;
/// The policy's `default_max_tokens`.
pub const DEFAULT_MAX_TOKENS: u64 = 200;

/// How one team sends.
#[derive(Debug, Clone, Copy)]
pub struct Team {
    pub name: &'static str,
    /// Concurrent clients, each sending until its first refusal.
    pub clients: usize,
    /// The requests' `max_completion_tokens`; none: the policy's default is reserved.
    pub cap: Option<u64>,
    /// The most tokens the provider generates for one request (up to the cap).
    pub most: u64,
}

/// The demo's teams: one that caps its requests, one that does not and
/// asks for long answers, one that asks for little.
pub const TEAMS: [Team; 3] = [
    Team { name: "alpha", clients: 6, cap: Some(300), most: 300 },
    Team { name: "beta", clients: 6, cap: None, most: 800 },
    Team { name: "gamma", clients: 2, cap: Some(50), most: 50 },
];

/// What one team got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub team: String,
    pub sent: usize,
    /// Admitted by the shim: `x-sluice-verdict: allowed`.
    pub admitted: usize,
    /// Refused by the budget: 429.
    pub refused: usize,
    /// Decided by `failure_mode`, not the budget.
    pub failure_mode: usize,
    /// Anything else.
    pub other: usize,
    /// Tokens the provider served the team's requests, by its own count.
    pub used: u64,
}

impl Row {
    pub fn head() -> String {
        format!(
            "{:<6} {:>5} {:>9} {:>8} {:>13} {:>6} {:>12} {:>7}  cap",
            "team", "sent", "admitted", "refused", "failure-mode", "other", "tokens used", "budget"
        )
    }

    pub fn line(&self, team: &Team) -> String {
        let Row { team: name, sent, admitted, refused, failure_mode, other, used } = self;
        let cap = team.cap.map_or(format!("none ({DEFAULT_MAX_TOKENS} reserved)"), |c| c.to_string());
        format!(
            "{name:<6} {sent:>5} {admitted:>9} {refused:>8} {failure_mode:>13} {other:>6} {used:>12} {BUDGET:>7}  {cap}"
        )
    }
}

/// The table's footnote.
pub const LEGEND: &str = "admitted = the shim admitted it (its reservation fit the budget); refused = 429;\n\
failure-mode = the shim did not answer in time, so failure_mode decided without the budget;\n\
tokens used = input and output tokens the mock provider served the team, by its own count.\n\
A team that caps its requests never exceeds its budget; one that does not may exceed it by what\n\
its requests in flight used beyond their reservations (docs/token-budgets.md#the-bound).\n\
A team stops short of its budget once its next request's reservation no longer fits, and\n\
refunds under concurrency are conservative: under-spent, never over.";

/// Runs `team` through Envoy on `port`: its clients send streamed chat
/// requests until each is refused once (or `max_each` requests).
pub fn send(port: u16, llm: &LlmUpstream, team: &Team, max_each: usize) -> anyhow::Result<Row> {
    let verdicts = Mutex::new(HashMap::<String, usize>::new());
    let next = AtomicUsize::new(0);
    let failed = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..team.clients {
            scope.spawn(|| {
                for _ in 0..max_each {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    let id = format!("{}-{n}", team.name);
                    let output = (n as u64 * 7919 % team.most + 1).to_string();
                    let prompt = format!("Summarise report {n} in a few sentences. ").repeat(4);
                    let body = request_body(Api::OpenaiChat, &prompt, team.cap, true);
                    let headers = [
                        ("x-team", team.name),
                        ("x-mock-output", output.as_str()),
                        ("x-mock-id", id.as_str()),
                    ];
                    let reply = match post(port, llm::path(Api::OpenaiChat), &headers, &body) {
                        Ok(reply) => reply,
                        Err(err) => {
                            *failed.lock().expect("a lock") = Some(err);
                            return;
                        }
                    };
                    let verdict =
                        match (reply.status, reply.headers.get("x-sluice-verdict").map(String::as_str)) {
                            (_, Some(v)) if v.starts_with("failure_") => "failure_mode",
                            (200, Some("allowed")) if reply.complete => "admitted",
                            (429, _) => "refused",
                            _ => "other",
                        };
                    *verdicts.lock().expect("a lock").entry(verdict.into()).or_default() += 1;
                    if reply.status == 429 {
                        return;
                    }
                }
            });
        }
    });
    if let Some(err) = failed.into_inner().expect("a lock") {
        return Err(err);
    }
    let counts = verdicts.into_inner().expect("a lock");
    let count = |v: &str| counts.get(v).copied().unwrap_or(0);
    let prefix = format!("{}-", team.name);
    let used = llm.served().iter().filter(|s| s.id.starts_with(&prefix)).map(|s| s.billed()).sum();
    Ok(Row {
        team: team.name.to_string(),
        sent: counts.values().sum(),
        admitted: count("admitted"),
        refused: count("refused"),
        failure_mode: count("failure_mode"),
        other: count("other"),
        used,
    })
}
