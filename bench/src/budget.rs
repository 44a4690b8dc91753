//! One decision's CPU, part by part (in every run after scenario 1, and
//! alone with `cargo xtask bench --budget`): the
//! CPU time (user and system, from `/proc/PID/stat`) that each process on
//! a request's path spends per request, in scenario 1's setups at one
//! Envoy worker. oha sends a fixed count of requests in a closed loop
//! (16 connections); rounds interleave the setups in a different order
//! each time and the median round is reported. CPU per request moves far
//! less with other load on the machine than latency or throughput does.

use std::collections::BTreeMap;

use anyhow::{Context, Result};

use super::load::{self, Shape, Target};
use super::plan::Plan;
use super::setups::{Rig, Setup, ENVOY_WORKERS};
use super::tools::Tools;

/// The setups whose parts the budget tells apart: Envoy alone, the
/// callout floor, Sluice's exact allow path (alone and with shared
/// callouts), and the deny path beside the Wasm deny floor.
const SETUPS: [Setup; 6] = [
    Setup::Plain,
    Setup::Floor,
    Setup::SluiceAllow,
    Setup::SluiceShared,
    Setup::DenyFloor,
    Setup::SluiceDeny,
];

/// The processes a request can cross.
const PARTS: [&str; 5] = ["envoy", "shim", "redis", "upstream", "floor responder"];

/// One process's CPU per request, in µs: (user, system).
pub(crate) type Cpu = (f64, f64);

/// Per setup, per process: the median round's CPU per request.
pub(crate) struct Budget {
    pub(crate) requests: u64,
    pub(crate) rounds: usize,
    pub(crate) cpu: Vec<(Setup, BTreeMap<&'static str, Cpu>)>,
    /// Setup (d′) over every round: the batches the shim saw and the
    /// checks they carried (`sluice_batch_checks`).
    pub(crate) batches: (f64, f64),
}

/// The shim's `sluice_batch_checks` so far: (batches, checks).
fn batches(port: u16) -> Result<(f64, f64)> {
    let page = sluice_harness::gateway::send(port, "GET", "/metrics", &[])?.body;
    let sample = |name: &str| {
        page.lines()
            .filter_map(|line| line.split_once(' '))
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((sample("sluice_batch_checks_count"), sample("sluice_batch_checks_sum")))
}

/// Clock ticks (user, system) a process has used.
fn ticks(pid: u32) -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The fields after the command's closing parenthesis; utime and stime are the 14th and 15th.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).context("a /proc stat line")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| fields.get(i - 3).and_then(|f| f.parse().ok()).context("a /proc stat field");
    Ok((field(14)?, field(15)?))
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

pub(crate) fn run(rig: &Rig, plan: &Plan, tools: &Tools) -> Result<Budget> {
    let (requests, rounds) = if plan.quick { (3_000, 1) } else { (50_000, 3) };
    let hz = clock_ticks_per_second();
    let mut runs: Vec<Vec<BTreeMap<&'static str, Cpu>>> = vec![Vec::new(); SETUPS.len()];
    let mut shared = (0.0, 0.0);
    for round in 0..rounds {
        eprintln!("bench: budget round {}/{rounds}", round + 1);
        for i in (0..SETUPS.len()).map(|i| (i + round) % SETUPS.len()) {
            let setup = SETUPS[i];
            let pids = [
                rig.envoy(ENVOY_WORKERS, setup)?.pid(),
                rig.shim.pid(),
                rig.redis.pid(),
                rig.upstream.pid(),
                rig.floor_responder.pid(),
            ];
            let target = Target::get(rig.url(ENVOY_WORKERS, setup)?);
            load::run(&tools.oha, &target, &Shape::Closed(500), 16).context("warming up")?;
            let before = pids.iter().map(|&p| ticks(p)).collect::<Result<Vec<_>>>()?;
            let batched = batches(rig.shim.port)?;
            let run = load::run(&tools.oha, &target, &Shape::Closed(requests), 16)
                .with_context(|| setup.label())?;
            if setup == Setup::SluiceShared {
                let after = batches(rig.shim.port)?;
                shared.0 += after.0 - batched.0;
                shared.1 += after.1 - batched.1;
            }
            let status = setup.expected_status();
            anyhow::ensure!(
                run.other_than(status) == 0,
                "{}: {} answers were not {status}",
                setup.label(),
                run.other_than(status)
            );
            let mut cpu = BTreeMap::new();
            for ((part, &pid), (user, system)) in PARTS.iter().zip(&pids).zip(before) {
                let (u, s) = ticks(pid)?;
                let per = |t: u64| t as f64 / hz * 1e6 / requests as f64;
                cpu.insert(*part, (per(u - user), per(s - system)));
            }
            runs[i].push(cpu);
        }
    }
    let cpu = SETUPS
        .iter()
        .zip(runs)
        .map(|(&setup, rounds)| {
            let median = |part: &str, f: fn(Cpu) -> f64| {
                load::median(rounds.iter().map(|r| r.get(part).copied().map_or(f64::NAN, f)))
            };
            let parts = PARTS.iter().map(|&p| (p, (median(p, |c| c.0), median(p, |c| c.1)))).collect();
            (setup, parts)
        })
        .collect();
    Ok(Budget { requests, rounds, cpu, batches: shared })
}

/// The budget as a Markdown table: µs of CPU per request, user + system.
pub(crate) fn markdown(budget: &Budget) -> String {
    let mut out = format!(
        "CPU per request in µs (user + system), the median of {} interleaved round(s) of {} requests, oha in a closed loop over 16 connections, one Envoy worker.\n\n| setup |",
        budget.rounds, budget.requests
    );
    for part in PARTS {
        out.push_str(&format!(" {part} |"));
    }
    out.push_str(" all |\n|---|");
    for _ in PARTS {
        out.push_str("---:|");
    }
    out.push_str("---:|\n");
    for (setup, parts) in &budget.cpu {
        out.push_str(&format!("| {} |", setup.label()));
        let mut all = 0.0;
        for part in PARTS {
            let (user, system) = parts.get(part).copied().unwrap_or((f64::NAN, f64::NAN));
            all += user + system;
            out.push_str(&format!(" {:.1} + {:.1} |", user, system));
        }
        out.push_str(&format!(" {all:.1} |\n"));
    }
    let (batches, checks) = budget.batches;
    let sent = (budget.requests as f64) * budget.rounds as f64;
    if batches > 0.0 {
        out.push_str(&format!(
            "\nShared callouts in (d′): {checks:.0} of its {sent:.0} checks went in {batches:.0} batches, {:.1} checks a batch; the other {:.0} went alone.\n",
            checks / batches,
            sent - checks
        ));
    }
    out
}
