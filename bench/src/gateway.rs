//! Scenario 1, gateway overhead: every setup, at one and at two Envoy
//! workers, at each fixed rate and at its maximum throughput, in rounds that
//! visit the (workers, setup) pairs in a different order each time; the
//! median round is kept. Also counts the Redis commands one Sluice request
//! sends (a small MONITOR sample, outside the timed runs).

use std::time::Duration;

use anyhow::{Context, Result};

use super::load::{self, Run, Shape, Target};
use super::monitor;
use super::plan::Plan;
use super::setups::{Rig, Setup, WORKERS};
use super::tools::Tools;

/// Load per setup before the first round: connection pools, Wasm VMs, the
/// first leases and RLQS assignments, and the deny keys' first (admitted)
/// requests.
const WARMUP: Duration = Duration::from_millis(500);
const WARMUP_RATE: u32 = 500;
/// Requests sent while MONITOR counts Redis commands.
const SAMPLE: u64 = 50;

/// One worker count's figures.
pub(crate) struct Matrix {
    pub(crate) workers: u16,
    /// For each fixed rate: each setup's median run.
    pub(crate) fixed: Vec<(u32, Vec<(Setup, Run)>)>,
    /// Each setup's median maximum-throughput run.
    pub(crate) max: Vec<(Setup, Run)>,
}

impl Matrix {
    /// `setup`'s median run at the `rate_index`th fixed rate, if measured.
    pub(crate) fn at(&self, rate_index: usize, setup: Setup) -> Option<&Run> {
        self.fixed.get(rate_index)?.1.iter().find(|(s, _)| *s == setup).map(|(_, run)| run)
    }

    pub(crate) fn max_of(&self, setup: Setup) -> Option<&Run> {
        self.max.iter().find(|(s, _)| *s == setup).map(|(_, run)| run)
    }
}

pub(crate) struct Gateway {
    /// One per worker count, in [`WORKERS`] order.
    pub(crate) matrices: Vec<Matrix>,
    /// The setups measured, in table order.
    pub(crate) setups: Vec<Setup>,
    /// Why the setups on Sluice's gRPC faces were skipped, if they were.
    pub(crate) skipped: Option<String>,
    /// Client commands Redis received per Sluice request: allow, deny.
    pub(crate) redis_per_request: (f64, f64),
    /// The names of those commands.
    pub(crate) redis_commands: Vec<String>,
}

pub(crate) fn run(rig: &Rig, plan: &Plan, tools: &Tools) -> Result<Gateway> {
    let setups = rig.setups();
    let pairs: Vec<(u16, Setup)> =
        WORKERS.iter().flat_map(|&w| setups.iter().map(move |&s| (w, s))).collect();
    let load = |(workers, setup): (u16, Setup), shape: &Shape| -> Result<Run> {
        let target = Target::get(rig.url(workers, setup)?);
        load::run(&tools.oha, &target, shape, plan.connections)
            .with_context(|| format!("{}, {workers} worker(s)", setup.label()))
    };
    for &pair in &pairs {
        load(pair, &Shape::Rate { rps: WARMUP_RATE, for_: WARMUP })?;
    }
    let mut fixed: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); pairs.len()]; plan.rates.len()];
    let mut max: Vec<Vec<Run>> = vec![Vec::new(); pairs.len()];
    for round in 0..plan.rounds {
        eprintln!("bench: gateway round {}/{} ({} setups)", round + 1, plan.rounds, pairs.len());
        for (r, &rps) in plan.rates.iter().enumerate() {
            for i in rotated(round, pairs.len()) {
                fixed[r][i].push(load(pairs[i], &Shape::Rate { rps, for_: plan.fixed })?);
            }
        }
        for i in rotated(round, pairs.len()) {
            max[i].push(load(pairs[i], &Shape::Max { for_: plan.max })?);
        }
    }
    let matrices = WORKERS
        .iter()
        .map(|&workers| {
            let of = |runs: &[Vec<Run>]| -> Vec<(Setup, Run)> {
                pairs
                    .iter()
                    .zip(runs)
                    .filter(|((w, _), _)| *w == workers)
                    .map(|((_, s), r)| (*s, Run::median(r)))
                    .collect()
            };
            Matrix {
                workers,
                fixed: plan.rates.iter().copied().zip(fixed.iter().map(|runs| of(runs))).collect(),
                max: of(&max),
            }
        })
        .collect();

    let (allow, mut names) = redis_per_request(rig, tools, Setup::SluiceAllow)?;
    let (deny, deny_names) = redis_per_request(rig, tools, Setup::SluiceDeny)?;
    names.extend(deny_names);
    names.sort();
    names.dedup();
    Ok(Gateway {
        matrices,
        setups,
        skipped: rig.skipped.clone(),
        redis_per_request: (allow, deny),
        redis_commands: names,
    })
}

/// Indices of `n` pairs, starting at a different one each round.
fn rotated(round: usize, n: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |i| (i + round) % n)
}

/// Client commands per request that Redis received while [`SAMPLE`]
/// requests went through `setup` (one worker), and their names.
fn redis_per_request(rig: &Rig, tools: &Tools, setup: Setup) -> Result<(f64, Vec<String>)> {
    let target = Target::get(rig.url(WORKERS[0], setup)?);
    let commands = monitor::client_commands(&tools.redis_cli, rig.redis.port, || {
        load::run(&tools.oha, &target, &Shape::Closed(SAMPLE), 1).map(drop)
    })?;
    let names = commands.iter().filter_map(|c| c.first()).map(|n| n.to_uppercase()).collect();
    Ok((commands.len() as f64 / SAMPLE as f64, names))
}
