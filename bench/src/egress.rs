//! Scenario 5, egress waits: S0, S1 and S2a (SCENARIOS.md, "The egress
//! shape") against the mock partner of `sluice_harness::partner`, which
//! enforces its limits exactly, by its own clock, and answers 429 beyond
//! them. Sluice's `wait` policy (one gateway: the shim and Envoy with the
//! real template) beside the hand-written clients of `egress_clients`, one
//! after the other against the same partner and Redis. Each approach calls
//! as its own account, so the partner counts each apart and every approach
//! starts with fresh limits.
//!
//! Per approach: calls served, the partner's 429s, calls refused or given
//! up, the partner's span (first to last admitted call) against the least
//! the limits allow, Redis commands per served call (client commands seen
//! with MONITOR: a script call counts once), gaps between calls at the
//! partner, the most in flight, and how long a freed slot stays empty at
//! the partner (S2a: from an answer finishing to the next call arriving,
//! while callers wait).
//!
//! Sluice's row says "not measured" with the reason when the gateway cannot
//! run the policy (before the `wait` feature, the policy parser refuses it).

use std::time::Duration;

use anyhow::Result;
use sluice_harness::egress::{Caller, Gateway, Workers};
use sluice_harness::partner::{Limits, Log};
use sluice_harness::{Partner, Redis};

use super::egress_clients::{self, Client};
use super::monitor;
use super::plan::{self, Plan};
use super::tools::Tools;

/// Sluice's `wait` as the feature's contract spells it, with the policy's
/// default margin: what a user gets. (A 20 ms margin here once made the S1
/// row read 120 ms gaps at a 100 ms interval: interval plus margin.)
const WAIT_TIMEOUT: &str = "15s";
/// Except with windows (S0, the feedback case): their slots come in bursts
/// (a window's worth of calls released at once when the window before
/// expires), which reach the partner spread over more than the default
/// margin on this shared host; with the 4 ms default a run of S0 at load 10
/// saw 32 partner 429s and 75 calls refused by the gateway (new slots
/// pushed them past their wait or their third new slot), and the feedback
/// case served 44 calls instead of 91. The burst spread, not one call's
/// jitter, sets this margin.
const BURST_MARGIN: &str = "20ms";
/// The path the partner serves and the policy matches.
const PATH: &str = "/v42/orders";
/// A hand-written run starts no call after twice the least span plus this.
const BUDGET_SLACK: Duration = Duration::from_secs(30);

pub(crate) struct Scenario {
    pub(crate) plan: plan::Egress,
    /// The least time the partner's time-based limits allow for all calls.
    pub(crate) fastest: Duration,
    pub(crate) approaches: Vec<Measured>,
}

pub(crate) struct Measured {
    pub(crate) approach: &'static str,
    pub(crate) outcome: Result<Numbers, String>,
}

pub(crate) struct Numbers {
    pub(crate) served: usize,
    /// Refused by the gateway, given up or failed.
    pub(crate) unserved: usize,
    pub(crate) partner_429: usize,
    pub(crate) elapsed: Duration,
    /// First to last admitted call at the partner.
    pub(crate) span: Duration,
    pub(crate) redis_per_call: f64,
    pub(crate) min_gap: Option<Duration>,
    pub(crate) mean_gap: Option<Duration>,
    pub(crate) max_in_flight: u32,
    /// Freed slot to the next admission at the partner: p50, p99.
    pub(crate) handoff: Option<(Duration, Duration)>,
    /// The run's budget ran out before every call was made (hand-written
    /// callers only): the span covers only the calls served.
    pub(crate) stopped: bool,
}

pub(crate) fn run(plan: &Plan, tools: &Tools) -> Result<Vec<Scenario>> {
    let mut scenarios = Vec::new();
    for egress in &plan.egress {
        eprintln!(
            "bench: egress {}: {} workers, {} calls, partner {:?}",
            egress.scenario, egress.workers, egress.calls, egress.limits
        );
        scenarios.push(scenario(egress, tools)?);
    }
    Ok(scenarios)
}

fn scenario(egress: &plan::Egress, tools: &Tools) -> Result<Scenario> {
    let redis = Redis::start()?;
    let partner = Partner::start_with_delay(egress.limits.clone(), egress.delay)?;
    let fastest = least_span(egress);
    let mut approaches = Vec::new();
    if egress.feedback {
        for (approach, account, upstream) in [
            ("Sluice `wait`, feedback off", "feedback-off", None),
            ("Sluice `wait`, feedback on, pause only (`adapt: false`)", "feedback-pause", Some(false)),
            ("Sluice `wait`, feedback on, pause and rate (the default)", "feedback-on", Some(true)),
        ] {
            let doc = document(&egress.limits, 2, upstream);
            let outcome = through_sluice(egress, &doc, account, tools, &redis, &partner);
            report(approach, &outcome);
            approaches.push(Measured { approach, outcome });
        }
        return Ok(Scenario { plan: egress.clone(), fastest, approaches });
    }

    let outcome =
        through_sluice(egress, &document(&egress.limits, 1, None), "sluice", tools, &redis, &partner);
    report("Sluice wait", &outcome);
    approaches.push(Measured { approach: "Sluice `wait`", outcome });

    for client in Client::for_limits(&egress.limits) {
        let account = match client {
            Client::RetryOn429 => "retry",
            Client::SetNxPx => "setnx",
            Client::DualWindowScript => "zset",
        };
        let outcome = measure(tools, &redis, &partner, account, || {
            let tally = egress_clients::run(
                client,
                partner.port,
                &redis.url(),
                account,
                &egress.limits,
                egress.workers,
                egress.calls,
                fastest * 2 + BUDGET_SLACK,
            )?;
            Ok((tally.served, tally.gave_up, tally.elapsed, tally.stopped))
        });
        report(client.label(), &outcome);
        approaches.push(Measured { approach: client.label(), outcome });
    }
    Ok(Scenario { plan: egress.clone(), fastest, approaches })
}

/// The scenario's workers through one gateway running `document`, as `account`.
fn through_sluice(
    egress: &plan::Egress,
    document: &str,
    account: &str,
    tools: &Tools,
    redis: &Redis,
    partner: &Partner,
) -> Result<Numbers, String> {
    let workers = Workers {
        workers: egress.workers,
        calls: egress.calls,
        path: PATH.into(),
        account: account.into(),
        timeout: Duration::from_secs(60),
    };
    match start_gateway(document, redis, partner) {
        Err(err) => Err(format!("{err:#}")),
        Ok(gateway) => measure(tools, redis, partner, account, || {
            let run = workers.run(&[gateway.envoy.port])?;
            let served = run.count(|c| c.served());
            Ok((served, run.calls.len() - served, run.elapsed, false))
        }),
    }
}

/// Runs one approach under MONITOR and reads the partner's log of its
/// account. `go` returns (served, unserved, elapsed, stopped at its
/// budget); its error becomes
/// the row's "not measured" reason.
fn measure(
    tools: &Tools,
    redis: &Redis,
    partner: &Partner,
    account: &str,
    go: impl FnOnce() -> Result<(usize, usize, Duration, bool)>,
) -> Result<Numbers, String> {
    let mut outcome = None;
    let commands = monitor::client_commands(&tools.redis_cli, redis.port, || {
        outcome = Some(go());
        Ok(())
    });
    let (served, unserved, elapsed, stopped) = match outcome {
        Some(Ok(tally)) => tally,
        Some(Err(err)) => return Err(format!("{err:#}")),
        None => return Err("did not run".into()),
    };
    let commands = commands.map_err(|err| format!("MONITOR: {err:#}"))?;
    let log: Log = partner.log().of(account);
    let gaps = log.gaps();
    let mean_gap = (!gaps.is_empty()).then(|| gaps.iter().sum::<Duration>() / gaps.len() as u32);
    let handoffs = log.handoffs();
    let handoff = (!handoffs.is_empty()).then(|| (percentile(&handoffs, 0.5), percentile(&handoffs, 0.99)));
    Ok(Numbers {
        served,
        unserved,
        partner_429: log.refused(),
        elapsed,
        span: log.span(),
        redis_per_call: commands.len() as f64 / served.max(1) as f64,
        min_gap: log.min_gap(),
        mean_gap,
        max_in_flight: log.max_in_flight(),
        handoff,
        stopped,
    })
}

/// A gateway for `limits`, warmed up with one call of another account (so
/// the script is loaded and pools are open before MONITOR counts).
fn start_gateway(document: &str, redis: &Redis, partner: &Partner) -> Result<Gateway> {
    let gateway = Gateway::start(document, redis, partner.port)?;
    let warm = Caller::new(PATH, "warm-up", Duration::from_secs(10))?.send(gateway.envoy.port, 0, 0, &[])?;
    anyhow::ensure!(warm.served(), "the warm-up call was not served: {warm:?}");
    Ok(gateway)
}

fn report(what: &str, outcome: &Result<Numbers, String>) {
    match outcome {
        Ok(n) => eprintln!(
            "bench:   {what}: served {}, unserved {}, partner 429s {}, {:.1} s, span {:.1} s, {:.2} Redis commands per call",
            n.served,
            n.unserved,
            n.partner_429,
            n.elapsed.as_secs_f64(),
            n.span.as_secs_f64(),
            n.redis_per_call
        ),
        Err(why) => eprintln!("bench:   {what}: not measured: {why}"),
    }
}

/// The least span (first to last call at the partner) its limits allow:
/// the fastest schedule of the time-based ones; for a concurrency limit,
/// full rounds of `delay` each, the last one starting the span's end.
fn least_span(egress: &plan::Egress) -> Duration {
    let timed = egress.limits.fastest_schedule(egress.calls).last().copied().unwrap_or_default();
    let rounds =
        egress.limits.concurrency.map_or(0, |max| egress.calls.div_ceil(max as usize).saturating_sub(1));
    timed.max(egress.delay * rounds as u32)
}

fn percentile(values: &[Duration], p: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or_default()
}

/// The policy document stating the partner's limits (its windows `scale`
/// times too generous, for the feedback case), with `wait`, and with
/// `upstream` feedback if asked (`Some(adapt)`: whether a refusal also
/// lowers the rate); fails closed so a shim failure shows as a 503, never
/// as a call let through.
fn document(limits: &Limits, scale: u32, upstream: Option<bool>) -> String {
    let mut parts: Vec<String> = limits
        .windows
        .iter()
        .map(|w| {
            format!(
                r#"{{"type": "sliding_window", "limit": {}, "window": "{}ms"}}"#,
                w.limit * scale,
                w.window.as_millis()
            )
        })
        .collect();
    if let Some(every) = limits.interval {
        parts.push(format!(r#"{{"type": "interval", "every": "{}ms"}}"#, every.as_millis()));
    }
    if let Some(max) = limits.concurrency {
        parts.push(format!(r#"{{"type": "concurrency", "limit": {max}, "lease": "30s"}}"#));
    }
    let wait = if !limits.windows.is_empty() {
        format!(r#"{{"timeout": "{WAIT_TIMEOUT}", "margin": "{BURST_MARGIN}"}}"#)
    } else {
        format!(r#"{{"timeout": "{WAIT_TIMEOUT}"}}"#)
    };
    let upstream = match upstream {
        Some(adapt) => format!(r#""upstream": {{"max_pause": "1m", "adapt": {adapt}}},"#),
        None => String::new(),
    };
    format!(
        r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "policies": [
            {{"name": "partner-api", "match": {{"path_prefix": "/v42/"}}, "key": ["header:x-account"],
              {upstream} "wait": {wait}, "limits": [{}]}}]}}"#,
        parts.join(", ")
    )
}
