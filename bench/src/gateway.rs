//! Scenario 1, gateway overhead: every setup at each fixed rate and at its
//! maximum throughput, in rounds that visit the setups in a different order
//! each time; the median round is kept. Also counts the Redis commands one
//! Sluice request sends (a small MONITOR sample, outside the timed runs).

use std::time::Duration;

use anyhow::{Context, Result};

use super::load::{self, Run, Shape, Target};
use super::monitor;
use super::plan::Plan;
use super::setups::{Rig, Setup};
use super::tools::Tools;

/// Load per setup before the first round: connection pools, Wasm VMs and
/// the deny key's first (admitted) request.
const WARMUP: Duration = Duration::from_millis(500);
const WARMUP_RATE: u32 = 500;
/// Requests sent while MONITOR counts Redis commands.
const SAMPLE: u64 = 50;

pub(crate) struct Gateway {
    /// For each fixed rate: each setup's median run.
    pub(crate) fixed: Vec<(u32, Vec<(Setup, Run)>)>,
    /// Each setup's median maximum-throughput run.
    pub(crate) max: Vec<(Setup, Run)>,
    /// Client commands Redis received per Sluice request: allow, deny.
    pub(crate) redis_per_request: (f64, f64),
    /// The names of those commands.
    pub(crate) redis_commands: Vec<String>,
}

pub(crate) fn run(rig: &Rig, plan: &Plan, tools: &Tools) -> Result<Gateway> {
    let load = |setup: Setup, shape: &Shape| {
        let target = Target { url: rig.url(setup), body: None };
        load::run(&tools.oha, &target, shape, plan.connections).with_context(|| setup.label())
    };
    for setup in Setup::ALL {
        load(setup, &Shape::Rate { rps: WARMUP_RATE, for_: WARMUP })?;
    }
    let mut fixed: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); Setup::ALL.len()]; plan.rates.len()];
    let mut max: Vec<Vec<Run>> = vec![Vec::new(); Setup::ALL.len()];
    for round in 0..plan.rounds {
        eprintln!("bench: gateway round {}/{}", round + 1, plan.rounds);
        for (r, &rps) in plan.rates.iter().enumerate() {
            for i in rotated(round) {
                fixed[r][i].push(load(Setup::ALL[i], &Shape::Rate { rps, for_: plan.fixed })?);
            }
        }
        for i in rotated(round) {
            max[i].push(load(Setup::ALL[i], &Shape::Max { for_: plan.max })?);
        }
    }
    let per_setup =
        |runs: &[Vec<Run>]| Setup::ALL.iter().copied().zip(runs.iter().map(|r| Run::median(r))).collect();
    let fixed = plan.rates.iter().copied().zip(fixed.iter().map(|runs| per_setup(runs))).collect();
    let max = per_setup(&max);

    let (allow, mut names) = redis_per_request(rig, tools, Setup::SluiceAllow)?;
    let (deny, deny_names) = redis_per_request(rig, tools, Setup::SluiceDeny)?;
    names.extend(deny_names);
    names.sort();
    names.dedup();
    Ok(Gateway { fixed, max, redis_per_request: (allow, deny), redis_commands: names })
}

/// Setup indices, starting at a different one each round.
fn rotated(round: usize) -> impl Iterator<Item = usize> {
    let n = Setup::ALL.len();
    (0..n).map(move |i| (i + round) % n)
}

/// Client commands per request that Redis received while [`SAMPLE`]
/// requests went through `setup`, and their names.
fn redis_per_request(rig: &Rig, tools: &Tools, setup: Setup) -> Result<(f64, Vec<String>)> {
    let target = Target { url: rig.url(setup), body: None };
    let commands = monitor::client_commands(&tools.redis_cli, rig.redis.port, || {
        load::run(&tools.oha, &target, &Shape::Count(SAMPLE), 1).map(drop)
    })?;
    let names = commands.iter().filter_map(|c| c.first()).map(|n| n.to_uppercase()).collect();
    Ok((commands.len() as f64 / SAMPLE as f64, names))
}
