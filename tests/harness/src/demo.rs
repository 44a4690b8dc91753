//! The demo's traffic and its table: `cargo xtask demo` prints them, and a
//! test runs the same code against a Redis paused at the start.
//!
//! Every count comes from what the gateway says about each request, its
//! `x-sluice-verdict` header (`policies/examples/demo.json` turns it on),
//! never from the status alone: a request that `failure_mode: allow` let
//! through undecided is a 200 too, and the table counts it under
//! `failure-mode`, never under `allowed`.

use std::time::{Duration, Instant};

use crate::client::{burst, HttpReply};

/// The limits of `policies/examples/demo.json`, for the table.
pub const LIMIT: &str = "25/5s + 300/1m";
/// The path the demo's requests take.
pub const PATH: &str = "/v42/orders";
/// API keys and how many concurrent GETs each one sends.
pub const TRAFFIC: [(&str, usize); 3] = [("alice", 40), ("bob", 25), ("carol", 10)];
/// The key of the warm-up requests, apart from the table's keys.
pub const WARM_UP_KEY: &str = "warm-up";

/// What one key's burst got, by the gateway's own verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub key: String,
    pub sent: usize,
    /// Admitted by the shim: `x-sluice-verdict: allowed`.
    pub allowed: usize,
    /// Refused by the limit: 429.
    pub rejected: usize,
    /// Decided by `failure_mode`, not by the limit: `failure_allowed` or
    /// `failure_denied`. Nothing enforced these.
    pub failure_mode: usize,
    /// Anything else: another status, or a response without a verdict.
    pub other: usize,
}

impl Row {
    pub fn of(key: &str, replies: &[HttpReply]) -> Row {
        let mut row = Row {
            key: key.to_string(),
            sent: replies.len(),
            allowed: 0,
            rejected: 0,
            failure_mode: 0,
            other: 0,
        };
        for reply in replies {
            match (reply.status, reply.verdict.as_deref()) {
                (_, Some(v)) if v.starts_with("failure_") => row.failure_mode += 1,
                (200, Some("allowed")) => row.allowed += 1,
                (429, _) => row.rejected += 1,
                _ => row.other += 1,
            }
        }
        row
    }

    /// The table's head, for [`Row::line`].
    pub fn head() -> String {
        format!(
            "{:<8} {:>5} {:>8} {:>9} {:>13} {:>6}  limit",
            "key", "sent", "allowed", "rejected", "failure-mode", "other"
        )
    }

    pub fn line(&self) -> String {
        let Row { key, sent, allowed, rejected, failure_mode, other } = self;
        format!("{key:<8} {sent:>5} {allowed:>8} {rejected:>9} {failure_mode:>13} {other:>6}  {LIMIT}")
    }
}

/// The table's footnote: what each column means.
pub const LEGEND: &str = "allowed = admitted by the shim; rejected = 429 with retry-after;\n\
failure-mode = the shim did not answer within the document's timeout_ms, so failure_mode decided \
(let through or refused) without enforcing the limit;\nother = anything else";

/// How the warm-up went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmUp {
    /// Requests sent until one came back decided.
    pub tries: usize,
    pub took: Duration,
    /// Whether one came back decided by the shim within the time given.
    pub decided: bool,
}

/// Sends single requests under [`WARM_UP_KEY`] until one has gone the whole
/// way (Envoy, the filter, the shim, Redis) and come back with a decision,
/// `allowed` or `denied`, or until `within` is over. A cold shim's first
/// calls (connecting to Redis, loading its scripts) may take longer than
/// the demo's 50 ms timeout; the table's traffic starts after them.
pub fn warm_up(port: u16, within: Duration) -> anyhow::Result<WarmUp> {
    let started = Instant::now();
    let mut tries = 0;
    while started.elapsed() < within {
        tries += 1;
        let replies = burst(port, "GET", PATH, Some(("x-api-key", WARM_UP_KEY)), 1)?;
        if replies.iter().any(|r| matches!(r.verdict.as_deref(), Some("allowed" | "denied"))) {
            return Ok(WarmUp { tries, took: started.elapsed(), decided: true });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(WarmUp { tries, took: started.elapsed(), decided: false })
}

/// One key's burst of `sent` concurrent GETs through Envoy on `port`.
pub fn send(port: u16, key: &str, sent: usize) -> anyhow::Result<Row> {
    let replies = burst(port, "GET", PATH, Some(("x-api-key", key)), sent)?;
    Ok(Row::of(key, &replies))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, verdict: Option<&str>) -> HttpReply {
        HttpReply { status, retry_after: None, verdict: verdict.map(String::from) }
    }

    /// A 200 counts as allowed only when the gateway says the shim admitted
    /// it: a failure-mode pass and a 200 with no verdict are not admissions.
    #[test]
    fn a_row_counts_by_the_verdict_not_the_status() {
        let replies = [
            reply(200, Some("allowed")),
            reply(200, Some("failure_allowed")),
            reply(503, Some("failure_denied")),
            reply(429, Some("denied")),
            reply(429, Some("cache_denied")),
            reply(200, None),
        ];
        let row = Row::of("k", &replies);
        assert_eq!((row.sent, row.allowed, row.rejected, row.failure_mode, row.other), (6, 1, 2, 2, 1));
    }
}
