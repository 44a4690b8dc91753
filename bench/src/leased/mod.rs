//! Scenario 7, leased mode (`cargo xtask bench --leased`): the allow path
//! of a leased policy beside the same window checked exactly and native
//! `local_ratelimit`, and what leases cost in admissions against the exact
//! mode on the same traffic.
//!
//! - **Allow path.** Three Envoys of one worker each, side by side, each
//!   loaded in turn (in a different order each round) at the plan's fixed
//!   rates and at its maximum throughput: native `local_ratelimit` that
//!   never runs out, Sluice with a `fixed_window` of 10^9 an hour checked
//!   exactly (one shim call per request), and the same window leased. The
//!   ratios to native are what the target (within 1.2×) is about.
//! - **Under-admission.** Two gateways share one window of `SHARE_LIMIT`,
//!   offered half as much again, a trickle of it at one gateway and the
//!   rest at the other, at once; once in exact mode, once leased (fresh windows each).
//!   Exact admits the limit; leased admits the limit less the tokens left
//!   unspent in a gateway when the window ran out, at most
//!   `gateways × 1.5 × tokens`.

use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result};
use sluice_harness::envoy::demo_template;
use sluice_harness::gateway::{prometheus, sample};
use sluice_harness::{dist, workspace_root, Envoy, Redis, Service, Shim};
use sluice_policies::leased::Leased;

use super::load::{self, Run, Shape, Target};
use super::plan::Plan;
use super::setups::ENVOY_WORKERS;
use super::tools::Tools;
use crate::tools::BenchArtifacts;
use zipf::ZipfRun;

mod zipf;

/// Tokens per lease on the allow path: two 25 ms refills' worth at 20,000
/// requests a second, beyond what one worker serves here.
const ALLOW_TOKENS: u32 = 1_000;
/// The shared window of the under-admission run, its lease and its load.
const SHARE_LIMIT: u32 = 6_000;
const SHARE_TOKENS: u32 = 100;
const SHARE_RATE: u32 = 3_000;
/// Of that, the quiet gateway's share: it takes leases and spends little.
const QUIET_RATE: u32 = 20;
const SHARE_FOR: Duration = Duration::from_secs(3);

const WARMUP: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Native,
    Exact,
    Leased,
    /// A diagnostic: the leased Envoy on a path no policy matches, so the
    /// filter runs (reads the request, matches) but spends nothing: what
    /// the Wasm filter costs before any lease.
    Unmatched,
}

impl Mode {
    pub(crate) const ALL: [Mode; 4] = [Mode::Native, Mode::Exact, Mode::Leased, Mode::Unmatched];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Mode::Native => "native `local_ratelimit`, allowing",
            Mode::Exact => "Sluice, exact (one shim call per request)",
            Mode::Leased => "Sluice, leased",
            Mode::Unmatched => "Sluice, no policy applies (the Wasm filter alone)",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Mode::Unmatched => "/other",
            _ => "/allow",
        }
    }
}

/// What scenario 7 measured.
pub(crate) struct LeasedRun {
    /// For each fixed rate: each mode's median run.
    pub(crate) fixed: Vec<(u32, Vec<(Mode, Run)>)>,
    /// Each mode's median maximum-throughput run.
    pub(crate) max: Vec<(Mode, Run)>,
    /// The leased Envoy's requests that made a shim call, of those it admitted.
    pub(crate) leased_calls: (f64, f64),
    /// The under-admission run: (exact admitted, leased admitted, offered).
    pub(crate) share: (u64, u64, u64),
    /// Tokens left unspent in each leased gateway at the end of that run.
    pub(crate) share_stranded: Vec<f64>,
    /// Per key on a Zipf key population.
    pub(crate) zipf: ZipfRun,
}

fn policy(name: &str, limit: u32, window: &str, leased: Option<(u32, &str)>) -> String {
    let leased = leased.map_or(String::new(), |(tokens, ttl)| {
        format!(r#""leased": {{"tokens": {tokens}, "ttl": "{ttl}"}},"#)
    });
    format!(
        r#"{{"shim": {{"cluster": "sluice_shim", "timeout_ms": 1000}}, "failure_mode": "deny",
            "policies": [{{"name": "{name}", "match": {{"path_prefix": "/allow"}}, {leased}
              "limits": [{{"type": "fixed_window", "limit": {limit}, "window": "{window}"}}]}}]}}"#
    )
}

/// Starts an Envoy of `workers` workers with the Sluice filter and `doc`, in
/// front of the upstream at `upstream_port`, calling the shim at `shim_port`.
fn sluice_envoy(doc: &str, shim_port: u16, upstream_port: u16, workers: u16) -> Result<Envoy> {
    let values = [
        ("UPSTREAM_PORT", upstream_port.to_string()),
        ("SHIM_PORT", shim_port.to_string()),
        ("WASM_PATH", dist("sluice.wasm")?.display().to_string()),
        ("POLICY_JSON", serde_json::to_string(doc)?),
    ];
    Envoy::start_template(&demo_template(), &values, workers).context("starting envoy with the Sluice filter")
}

/// Each mode's runs, interleaved: every round loads each of `modes` in
/// turn (in a different order each round) at the plan's fixed rates, then
/// at its maximum throughput; each mode's median per rate and at max.
type PerMode = Vec<(Mode, Run)>;
fn interleaved(
    plan: &Plan,
    what: &str,
    modes: &[Mode],
    load: impl Fn(Mode, &Shape) -> Result<Run>,
) -> Result<(Vec<(u32, PerMode)>, PerMode)> {
    let n = modes.len();
    let mut fixed: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); n]; plan.rates.len()];
    let mut max: Vec<Vec<Run>> = vec![Vec::new(); n];
    for round in 0..plan.rounds {
        eprintln!("bench: {what} round {}/{}", round + 1, plan.rounds);
        let order: Vec<usize> = (0..n).map(|i| (i + round) % n).collect();
        for (r, &rps) in plan.rates.iter().enumerate() {
            for &i in &order {
                fixed[r][i].push(load(modes[i], &Shape::Rate { rps, for_: plan.fixed })?);
            }
        }
        for &i in &order {
            max[i].push(load(modes[i], &Shape::Max { for_: plan.max })?);
        }
    }
    let per_mode =
        |runs: &[Vec<Run>]| modes.iter().copied().zip(runs.iter().map(|r| Run::median(r))).collect();
    let fixed = plan.rates.iter().copied().zip(fixed.iter().map(|runs| per_mode(runs))).collect();
    Ok((fixed, per_mode(&max)))
}

pub(crate) fn run(plan: &Plan, tools: &Tools, built: &BenchArtifacts) -> Result<LeasedRun> {
    let redis = Redis::start()?;
    let shim = Shim::start(&redis.url())?;
    let serve = |port: u16| vec![format!("127.0.0.1:{port}")];
    let upstream = Service::start("bench-upstream", &built.responder, serve)?;
    let up = ("UPSTREAM_PORT", upstream.port.to_string());
    let start = |template: PathBuf, values: &[(&str, String)]| {
        Envoy::start_template(&template, values, ENVOY_WORKERS)
            .with_context(|| format!("starting envoy with {}", template.display()))
    };
    let sluice = |doc: &str| sluice_envoy(doc, shim.port, upstream.port, ENVOY_WORKERS);
    eprintln!("bench: leased mode, starting seven envoys");
    // Exact and leased Envoys match `/allow`; `/other` runs the filter with no policy.
    let native = start(
        workspace_root().join("bench/envoy/native.yaml"),
        &[up.clone(), ("MAX_TOKENS", "1000000000".into()), ("FILL_INTERVAL", "1s".into())],
    )?;
    let exact = sluice(&policy("allow", 1_000_000_000, "1h", None))?;
    // A ttl longer than the run: an idle pool between phases keeps its tokens.
    let leased = sluice(&policy("allow", 1_000_000_000, "1h", Some((ALLOW_TOKENS, "1h"))))?;
    let envoy = |mode: Mode| match mode {
        Mode::Native => &native,
        Mode::Exact => &exact,
        Mode::Leased | Mode::Unmatched => &leased,
    };
    let load = |mode: Mode, shape: &Shape| {
        let target = Target::get(format!("{}{}", envoy(mode).url(), mode.path()));
        load::run(&tools.oha, &target, shape, plan.connections).with_context(|| mode.label())
    };
    for mode in Mode::ALL {
        load(mode, &Shape::Rate { rps: 500, for_: WARMUP })?;
    }
    let (fixed, max) = interleaved(plan, "leased", &Mode::ALL, load)?;
    let page = prometheus(&leased)?;
    let stat = |name: &str| sample(&page, &format!(r#"sluice_{name}{{policy="allow"}}"#));
    let leased_calls = (stat("lease_empty"), stat("allowed"));
    drop((exact, leased));
    let zipf = zipf::run(plan, tools, &native, shim.port, upstream.port)?;
    drop(native);

    eprintln!("bench: leased mode, under-admission against exact");
    let share_doc =
        |name: &str, lease: bool| policy(name, SHARE_LIMIT, "365d", lease.then_some((SHARE_TOKENS, "10s")));
    let (exact_admitted, offered, _) = share(
        tools,
        &[sluice(&share_doc("share-exact", false))?, sluice(&share_doc("share-exact", false))?],
    )?;
    let (leased_admitted, _, stranded) = share(
        tools,
        &[sluice(&share_doc("share-leased", true))?, sluice(&share_doc("share-leased", true))?],
    )?;
    Ok(LeasedRun {
        fixed,
        max,
        leased_calls,
        share: (exact_admitted, leased_admitted, offered),
        share_stranded: stranded,
        zipf,
    })
}

/// A trickle of the load at the first gateway, the rest at the second, at once:
/// requests admitted, requests offered, and each gateway's unspent tokens after.
fn share(tools: &Tools, gateways: &[Envoy; 2]) -> Result<(u64, u64, Vec<f64>)> {
    let runs: Vec<Result<Run>> = thread::scope(|scope| {
        let handles: Vec<_> = gateways
            .iter()
            .zip([QUIET_RATE, SHARE_RATE - QUIET_RATE])
            .map(|(envoy, rps)| {
                scope.spawn(move || {
                    let target = Target::get(format!("{}/allow", envoy.url()));
                    load::run(&tools.oha, &target, &Shape::Rate { rps, for_: SHARE_FOR }, 8)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("oha thread")))).collect()
    });
    let mut admitted = 0;
    let mut offered = 0;
    for run in runs {
        let run = run?;
        admitted += run.statuses.get(&200).copied().unwrap_or(0);
        offered += run.total();
    }
    let mut stranded = Vec::new();
    for envoy in gateways {
        let page = prometheus(envoy)?;
        let stat = |name: &str| sample(&page, &format!(r#"sluice_{name}{{policy="share-leased"}}"#));
        stranded.push(stat("lease_granted") - stat("leased") - stat("lease_given_back"));
    }
    Ok((admitted, offered, stranded))
}

/// The section of LEASED.md with the results.
/// The head of a table with a p50 and a p99 column per rate, then max req/s.
fn table_head(plan: &Plan) -> String {
    let mut head = String::from("| setup |");
    for rps in plan.rates {
        head.push_str(&format!(" {rps}/s p50 | p99 |"));
    }
    head.push_str(" max req/s |\n|---|");
    for _ in plan.rates {
        head.push_str("---:|---:|");
    }
    head.push_str("---:|\n");
    head
}

pub(crate) fn markdown(leased: &LeasedRun, plan: &Plan) -> String {
    let mut out = String::new();
    let get =
        |runs: &[(Mode, Run)], mode: Mode| runs.iter().find(|(m, _)| *m == mode).map(|(_, r)| r.clone());
    out.push_str("## Allow path: leased against exact and native\n\n");
    out.push_str(&format!(
        "Latency in ms, median of {} interleaved round(s), one Envoy worker each, oha at a fixed rate with latency correction, {} connections.\n\n",
        plan.rounds, plan.connections
    ));
    out.push_str(&table_head(plan));
    for mode in Mode::ALL {
        out.push_str(&format!("| {} |", mode.label()));
        for (_, runs) in &leased.fixed {
            let r = get(runs, mode).unwrap_or_default();
            out.push_str(&format!(" {:.2} | {:.2} |", r.p50, r.p99));
        }
        let m = get(&leased.max, mode).unwrap_or_default();
        out.push_str(&format!(" {:.0} |\n", m.rps));
    }
    out.push_str("\nRatios to native (1.00 is native's cost; the target is at most 1.2 for latency, at least 1/1.2 = 0.83 for throughput):\n\n");
    out.push_str(&table_head(plan));
    for mode in [Mode::Exact, Mode::Leased, Mode::Unmatched] {
        out.push_str(&format!("| {} |", mode.label()));
        for (_, runs) in &leased.fixed {
            let (r, n) = (get(runs, mode).unwrap_or_default(), get(runs, Mode::Native).unwrap_or_default());
            out.push_str(&format!(" {:.2}× | {:.2}× |", r.p50 / n.p50, r.p99 / n.p99));
        }
        let (m, n) =
            (get(&leased.max, mode).unwrap_or_default(), get(&leased.max, Mode::Native).unwrap_or_default());
        out.push_str(&format!(" {:.2}× |\n", m.rps / n.rps));
    }
    let failed: u64 = leased
        .fixed
        .iter()
        .flat_map(|(_, runs)| runs.iter())
        .chain(leased.max.iter())
        .map(|(_, r)| r.other_than(200))
        .sum();
    let (empty, allowed) = leased.leased_calls;
    out.push_str(&format!(
        "\nThe leased Envoy made a shim call for {empty:.0} of the {allowed:.0} requests it admitted ({:.2} %: those that found its pool empty, the first ones before its first lease and any faster than the next lease came); requests not answered 200 in all runs: {failed}.\n\n",
        100.0 * empty / allowed.max(1.0)
    ));
    let (exact, leased_admitted, offered) = leased.share;
    let held: f64 = leased.share_stranded.iter().sum();
    let bound = 2 * Leased::new(SHARE_TOKENS, 10_000).map_or(0, Leased::held_at_most);
    out.push_str("## Under-admission against exact, same traffic\n\n");
    out.push_str(&format!(
        "Two gateways share one `fixed_window` of {SHARE_LIMIT}; {SHARE_RATE} requests a second for {} s, {QUIET_RATE} a second of them at a quiet gateway and the rest at a busy one, at once; leases of {SHARE_TOKENS} tokens (`ttl` 10 s, longer than the run, so nothing goes back during it). Offered {offered} requests per mode.\n\n",
        SHARE_FOR.as_secs()
    ));
    out.push_str("| mode | admitted | of the limit | under-admitted |\n|---|---:|---:|---:|\n");
    for (label, n) in [("exact", exact), ("leased", leased_admitted)] {
        out.push_str(&format!(
            "| {label} | {n} | {:.1} % | {} |\n",
            100.0 * n as f64 / f64::from(SHARE_LIMIT),
            u64::from(SHARE_LIMIT).saturating_sub(n)
        ));
    }
    out.push_str(&format!(
        "\nTokens left unspent in the leased gateways when the window ran out: {:?} ({held:.0} in all); the bound is 2 gateways × 1.5 × {SHARE_TOKENS} = {bound}. They go back to the window `ttl` after their last grant.\n",
        leased.share_stranded
    ));
    out.push('\n');
    out.push_str(&zipf::markdown(&leased.zipf, plan, &table_head(plan)));
    out
}
