//! `sluice-bench`: every benchmark scenario on loopback with real
//! processes, side by side in one run, written to `bench/results/LATEST.md`
//! and `bench/results/latency.png`, and scenario 6 also to `SHED.md` and
//! `shed.png` (with `--quick`, to `target/bench-quick/`, so a smoke run
//! never overwrites the committed results).
//!
//! Run it with `cargo xtask bench [FLAGS]`: xtask installs the tools and
//! builds `dist/` and the bench's own artifacts, then runs this binary with
//! their paths in the environment (see `tools`). The bench installs and
//! builds nothing itself.
//!
//! # Layout
//!
//! - `plan`: how long and how often each scenario runs, full or quick.
//! - `tools`: oha, redis-benchmark, redis-cli, the plot's font and the
//!   bench's own builds, found where xtask put them; bounded runs of outside
//!   programs.
//! - `setups`: the gateway setups (Envoy alone, native, the callout and
//!   Wasm deny floors, Sluice, the Limitador peer, Sluice's RLS and RLQS
//!   faces), each at one and two Envoy workers, and the processes behind
//!   them.
//! - `load`: one oha run, reduced to percentiles, throughput and statuses.
//! - `monitor`: the commands clients send Redis, seen with MONITOR.
//! - `redis_bench`: the shim's EVALSHA replayed with redis-benchmark; INFO.
//! - `gateway`: scenario 1, gateway overhead, every setup at both worker
//!   counts, interleaved.
//! - `shim_alone`: scenario 2, the shim against raw EVALSHA.
//! - `redis_cost`: scenario 3, Redis CPU and memory per limit type, beside
//!   the hand-written scripts of `bench/handwritten/`.
//! - `scale`: scenario 4, latency and memory from 1k to 1M keys.
//! - `egress`: scenario 5, egress waits (S0, S1, S2a) against a strict mock
//!   partner, Sluice's `wait` beside `egress_clients`, the hand-written
//!   callers.
//! - `shed`: scenario 6, load shedding with the shedder on and off;
//!   `overloaded`, the mock service it overloads; `shed_load`, the
//!   open-loop mix of classes; `shed_report` and `shed_plot`, its section
//!   of the report and its PNG.
//! - `leased`: scenario 7, leased mode: its allow path beside the exact
//!   mode and native `local_ratelimit`, and its under-admission against
//!   exact on the same traffic; LEASED.md.
//! - `simulate`: `--simulate` alone, `sluice simulate` on a generated
//!   1M-line access log, in lines per second.
//! - `soak`: `--soak-seconds N` alone (`cargo xtask soak --minutes N`):
//!   steady mixed traffic for N seconds, sampled and judged flat; SOAK.md
//!   and soak.png.
//! - `noise`: how busy the machine was while the bench ran.
//! - `report`: LATEST.md. `plot`: the PNG.
//!

mod budget;
mod egress;
mod egress_clients;
mod egress_jitter;
mod footprint;
mod gateway;
mod goals;
mod leased;
mod load;
mod monitor;
mod noise;
mod overloaded;
mod plan;
mod plot;
mod ratio;
mod redis_bench;
mod redis_cost;
mod report;
mod scale;
mod setups;
mod shed;
mod shed_load;
mod shed_plot;
mod shed_report;
mod shim_alone;
mod simulate;
mod soak;
mod tools;

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use sluice_harness::workspace_root;

use crate::tools::probe;

const PLOT: &str = "latency.png";
const SHED_PLOT: &str = "shed.png";

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    about = "Run every benchmark on loopback; writes bench/results/LATEST.md and a plot. Run it with `cargo xtask bench`."
)]
struct Cli {
    /// Every scenario once with short runs (about 4 minutes): the goals' ratios, rough, in target/bench-quick/.
    #[arg(long)]
    quick: bool,
    /// Only scenario 5, the egress waits (S0, S1, S2a); writes EGRESS.md instead of LATEST.md.
    #[arg(long)]
    egress: bool,
    /// Only scenario 6, load shedding with the shedder on and off; writes SHED.md and shed.png.
    #[arg(long, conflicts_with = "egress")]
    shed: bool,
    /// Only scenario 5's upstream feedback case (the policy states twice the partner's limit);
    /// writes FEEDBACK.md.
    #[arg(long, conflicts_with_all = ["egress", "shed"])]
    feedback: bool,
    /// Only scenario 3, Redis cost per limit type (seconds); prints its table.
    #[arg(long, conflicts_with_all = ["egress", "shed", "feedback"])]
    redis_cost: bool,
    /// With --redis-cost: run Redis under valgrind's callgrind and count its instructions per decision.
    #[arg(long, requires = "redis_cost")]
    callgrind: bool,
    /// Only scenario 7, leased mode against exact and native; writes LEASED.md.
    #[arg(long, conflicts_with_all = ["egress", "shed", "feedback", "redis_cost"])]
    leased: bool,
    /// Only `sluice simulate` on a generated access log (1M lines; 100k with --quick); prints lines/s.
    #[arg(long, conflicts_with_all = ["egress", "shed", "feedback", "redis_cost", "leased"])]
    simulate: bool,
    /// Only the soak, for this many seconds of traffic; writes SOAK.md and soak.png (with --quick,
    /// to target/bench-quick/, and latency reported but not judged). `cargo xtask soak --minutes N` runs it.
    #[arg(long, value_name = "SECONDS", conflicts_with_all = ["egress", "shed", "feedback", "redis_cost", "leased", "simulate"])]
    soak_seconds: Option<u64>,
    /// Only wait precision at the partner: each held call's slot to its arrival, idle and busy;
    /// writes JITTER.md (`--quick`: the 20 ms case only, under a minute).
    #[arg(long, conflicts_with_all = ["egress", "shed", "feedback", "redis_cost", "leased", "simulate", "soak_seconds"])]
    jitter: bool,
    /// With --jitter: the policy's `wait.margin` in ms (default: the policy's default margin).
    #[arg(long, requires = "jitter")]
    margin_ms: Option<u64>,
    /// Only the key footprint: bytes per Redis key for every limit kind, 100k client keys
    /// (1M with --million); writes FOOTPRINT.md.
    #[arg(long, conflicts_with_all = ["egress", "shed", "feedback", "redis_cost", "leased", "simulate", "soak_seconds", "jitter"])]
    footprint: bool,
    /// With --footprint: 1M client keys.
    #[arg(long, requires = "footprint")]
    million: bool,
    /// Only one decision's CPU, part by part: each process's CPU per request in scenario 1's
    /// setups (Envoy alone, the callout floor, the allow path, the deny floor, the deny path);
    /// writes BUDGET.md.
    #[arg(long, conflicts_with_all = ["egress", "shed", "feedback", "redis_cost", "leased", "simulate", "soak_seconds", "jitter", "footprint"])]
    budget: bool,
}

fn main() -> std::process::ExitCode {
    let Cli {
        quick,
        egress,
        shed,
        feedback,
        redis_cost,
        callgrind,
        leased,
        simulate,
        soak_seconds,
        jitter,
        margin_ms,
        footprint,
        million,
        budget,
    } = Cli::parse();
    let result = if footprint {
        run_footprint(if million { 1_000_000 } else { 100_000 })
    } else if jitter {
        run_jitter(quick, margin_ms)
    } else {
        run(
            quick,
            Only { egress, shed, feedback, redis_cost, callgrind, leased, simulate, soak_seconds, budget },
        )
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("bench: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Which part of the bench alone, if any.
#[derive(Debug, Default)]
struct Only {
    /// Scenario 5, to EGRESS.md.
    egress: bool,
    /// Scenario 6, to SHED.md and shed.png.
    shed: bool,
    /// Scenario 5's feedback case, to FEEDBACK.md.
    feedback: bool,
    /// Scenario 3, printed.
    redis_cost: bool,
    /// With `redis_cost`: Redis under callgrind, counting instructions.
    callgrind: bool,
    /// Scenario 7, to LEASED.md.
    leased: bool,
    /// `sluice simulate` on a generated log, printed.
    simulate: bool,
    /// The soak, for this many seconds, to SOAK.md and soak.png.
    soak_seconds: Option<u64>,
    /// One decision's CPU, part by part, to BUDGET.md.
    budget: bool,
}

/// The whole bench, or one part of it alone.
fn run(quick: bool, only: Only) -> Result<()> {
    let started = Instant::now();
    if only.simulate {
        let lines = if quick { 100_000 } else { 1_000_000 };
        let dir = workspace_root().join("target/bench-simulate");
        return simulate::run(&sluice_harness::dist("sluice")?, &dir, lines).map(drop);
    }
    let mut plan = plan::Plan::new(quick);
    // The sluice-harness guards find their binaries through the same
    // `SLUICE_*` variables.
    let tools = tools::find()?;
    if let Some(seconds) = only.soak_seconds {
        let dir = out_dir(quick);
        let about = |ran: f64| {
            let mut about = about(&tools, &plan, ran);
            about.retain(|(what, _)| !matches!(*what, "oha" | "measuring"));
            about
        };
        return soak::run(seconds as f64, !quick, &dir, &tools.font, about);
    }
    let built = tools::BenchArtifacts::find()?;
    if only.redis_cost {
        return run_redis_cost(&plan, &tools.redis_server, only.callgrind);
    }
    if only.egress {
        return run_egress(&plan, &tools, started, "EGRESS.md");
    }
    if only.feedback {
        plan.egress.retain(|e| e.feedback);
        return run_egress(&plan, &tools, started, "FEEDBACK.md");
    }
    if only.shed {
        return run_shed(&plan, &tools, started);
    }
    if only.leased {
        return run_leased(&plan, &tools, &built, started);
    }
    if only.budget {
        return run_budget(&plan, &tools, &built, started);
    }

    let sampler = noise::Sampler::start();
    let measured = Instant::now();
    let done = |what: &str| eprintln!("bench: {what} done at {:.0} s", measured.elapsed().as_secs_f64());
    let rig = setups::Rig::start(&built)?;
    done("starting the processes");
    let gateway = gateway::run(&rig, &plan, &tools)?;
    done("scenario 1, gateway overhead,");
    let budget = budget::run(&rig, &plan, &tools)?;
    done("scenario 1, one decision's CPU part by part,");
    let shim = shim_alone::run(&rig, &plan, &tools)?;
    done("scenario 2, the shim alone,");
    let scale = scale::run(&rig, &plan, &tools)?;
    done("scenario 4, scale,");
    drop(rig);
    let cost = {
        let redis = sluice_harness::Redis::start()?;
        redis_cost::run(&mut redis.connection()?, plan.cost_calls, None)?
    };
    done("scenario 3, Redis cost per limit type,");
    let egress = egress::run(&plan, &tools)?;
    done("scenario 5, egress waits,");
    let shed = shed::run(&plan.shed)?;
    done("scenario 6, load shedding,");
    let leased = leased::run(&plan, &tools, &built)?;
    done("scenario 7, leased mode,");
    let noise = sampler.finish();

    let about = about(&tools, &plan, measured.elapsed().as_secs_f64());
    let results = report::Results {
        plan,
        about,
        noise,
        seconds: started.elapsed().as_secs_f64(),
        gateway,
        shim,
        scale,
        cost,
        egress,
        shed,
        budget,
    };
    let dir = out_dir(quick);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let title = format!("Sluice gateway latency by setup ({})", if quick { "quick run" } else { "full run" });
    let one_worker = results.gateway.matrices.first().map_or(&[][..], |m| &m.fixed[..]);
    plot::draw(&dir.join(PLOT), &tools.font, &title, one_worker)?;
    let md = dir.join("LATEST.md");
    std::fs::write(&md, report::markdown(&results, PLOT, SHED_PLOT))
        .with_context(|| format!("writing {}", md.display()))?;
    write_shed(&results.plan, &results.about, &results.noise, results.seconds, &results.shed, &tools.font)?;
    write_leased(&results.plan, &results.about, &results.noise, results.seconds, &leased)?;
    eprintln!("bench: wrote {} and {PLOT} in {:.0} s", md.display(), started.elapsed().as_secs_f64());
    Ok(())
}

/// Scenario 3 alone (`--redis-cost`), its table printed; with `callgrind`,
/// redis-server runs under valgrind's callgrind and each case also reports
/// the instructions Redis ran per decision (2,000 decisions a case).
/// The key footprint at `clients` client keys, to bench/results/FOOTPRINT.md.
fn run_footprint(clients: usize) -> Result<()> {
    let redis = sluice_harness::Redis::start()?;
    let rows = footprint::run(&mut redis.connection()?, clients)?;
    let version: String = redis::cmd("INFO")
        .arg("server")
        .query::<String>(&mut redis.connection()?)?
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_string();
    let text = format!(
        "# Key footprint\n\nWritten by `cargo xtask bench --footprint{}` (Redis {version}). Each limit kind \
         fills a fresh Redis through the real check library, one admitted decision per client key; \
         bytes are Redis's `used_memory` after minus before, per client and per Redis key (`DBSIZE`), \
         allocator overhead and the keyspace dictionary included. See `bench/src/footprint.rs`.\n\n{}",
        if clients >= 1_000_000 { " --million" } else { "" },
        footprint::table(&rows)
    );
    let path = workspace_root().join("bench/results/FOOTPRINT.md");
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    println!("{text}");
    Ok(())
}

fn run_redis_cost(plan: &plan::Plan, redis_server: &std::path::Path, callgrind: bool) -> Result<()> {
    let counter = if callgrind {
        let dir = workspace_root().join("target/bench-callgrind");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let wrapper = dir.join("redis-server");
        let script = format!(
            "#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file={}/callgrind.%p {} \"$@\"\n",
            dir.display(),
            redis_server.display()
        );
        std::fs::write(&wrapper, script).with_context(|| format!("writing {}", wrapper.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        std::env::set_var("SLUICE_REDIS_SERVER", &wrapper);
        Some(redis_cost::Callgrind { dir })
    } else {
        None
    };
    let calls = if callgrind { 2_000 } else { plan.cost_calls };
    let redis = sluice_harness::Redis::start()?;
    let cost = redis_cost::run(&mut redis.connection()?, calls, counter.as_ref())?;
    println!("{}", redis_cost::table(&cost));
    Ok(())
}

/// Wait precision at the partner alone (`--jitter`, to `JITTER.md`).
fn run_jitter(quick: bool, margin_ms: Option<u64>) -> Result<()> {
    let started = Instant::now();
    let measured = egress_jitter::run(&egress_jitter::cases(quick, margin_ms))?;
    let dir = out_dir(quick);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let md = dir.join("JITTER.md");
    let commit = Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok();
    let commit = commit.map_or(String::new(), |o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let rows: Vec<String> = measured.iter().map(egress_jitter::row).collect();
    let handovers = egress_jitter::handover_cases(quick)
        .iter()
        .map(egress_jitter::handover)
        .collect::<Result<Vec<String>>>()?;
    let text = format!(
        "# Sluice bench: wait precision at the partner (`--jitter`)\n\nWritten by `cargo xtask bench --jitter{}`; \
         see `bench/src/egress_jitter.rs`. Commit {commit}; took {:.0} s; 2 cores shared with other work \
         (the load column is the 1-minute load average at the end of each run). \
         \"late\": a held call's slot (Redis TIME) to its arrival at the partner (same host's wall clock); \
         the jitter columns are above the smallest lateness. Gaps are between admitted arrivals.\n\n{}\n{}\n\n\
         ## Concurrency hand-over\n\nA freed slot's emptiness at the partner: its answer finishing to the next \
         call arriving, while callers queue at the gateway.\n\n{}\n{}\n",
        if quick { " --quick" } else { "" },
        started.elapsed().as_secs_f64(),
        egress_jitter::HEADER,
        rows.join("\n"),
        egress_jitter::HANDOVER_HEADER,
        handovers.join("\n")
    );
    std::fs::write(&md, text).with_context(|| format!("writing {}", md.display()))?;
    eprintln!("bench: wrote {}", md.display());
    Ok(())
}

/// Scenario 5 alone (`--egress`, to `EGRESS.md`) or its feedback case
/// (`--feedback`, to `FEEDBACK.md`), beside LATEST.md.
fn run_egress(plan: &plan::Plan, tools: &tools::Tools, started: Instant, file: &str) -> Result<()> {
    let sampler = noise::Sampler::start();
    let measured = Instant::now();
    let egress = egress::run(plan, tools)?;
    let noise = sampler.finish();
    let about = about(tools, plan, measured.elapsed().as_secs_f64());
    let dir = out_dir(plan.quick);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let md = dir.join(file);
    let seconds = started.elapsed().as_secs_f64();
    std::fs::write(&md, report::egress_markdown(plan, &about, &noise, seconds, &egress))
        .with_context(|| format!("writing {}", md.display()))?;
    eprintln!("bench: wrote {} in {seconds:.0} s", md.display());
    Ok(())
}

/// Scenario 6 alone (`--shed`), written to `SHED.md` and `shed.png`.
fn run_shed(plan: &plan::Plan, tools: &tools::Tools, started: Instant) -> Result<()> {
    let (shed, about, noise) = measure(plan, tools, || shed::run(&plan.shed))?;
    write_shed(plan, &about, &noise, started.elapsed().as_secs_f64(), &shed, &tools.font)
}

/// One decision's CPU, part by part (`--budget`), written to `BUDGET.md`.
fn run_budget(
    plan: &plan::Plan,
    tools: &tools::Tools,
    built: &tools::BenchArtifacts,
    started: Instant,
) -> Result<()> {
    let (budget, about, noise) =
        measure(plan, tools, || budget::run(&setups::Rig::start(built)?, plan, tools))?;
    let seconds = started.elapsed().as_secs_f64();
    let title = "one decision's CPU, part by part (`--budget`)";
    let text = report::page(title, plan, &about, &noise, seconds, &budget::markdown(&budget));
    write_page(plan, "BUDGET.md", &text, seconds)
}

/// What a part measured, the run's description (name, value) and the noise.
type Measured<T> = (T, Vec<(&'static str, String)>, noise::Noise);

/// Runs one part of the bench alone, with the machine's noise sampled
/// around it.
fn measure<T>(
    plan: &plan::Plan,
    tools: &tools::Tools,
    part: impl FnOnce() -> Result<T>,
) -> Result<Measured<T>> {
    let sampler = noise::Sampler::start();
    let measured = Instant::now();
    let out = part()?;
    let noise = sampler.finish();
    Ok((out, about(tools, plan, measured.elapsed().as_secs_f64()), noise))
}

/// Writes one page of results into the run's directory.
fn write_page(plan: &plan::Plan, name: &str, text: &str, seconds: f64) -> Result<()> {
    let dir = out_dir(plan.quick);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let md = dir.join(name);
    std::fs::write(&md, text).with_context(|| format!("writing {}", md.display()))?;
    eprintln!("bench: wrote {} in {seconds:.0} s", md.display());
    Ok(())
}

/// Scenario 7 alone (`--leased`), written to `LEASED.md`.
fn run_leased(
    plan: &plan::Plan,
    tools: &tools::Tools,
    built: &tools::BenchArtifacts,
    started: Instant,
) -> Result<()> {
    let (leased, about, noise) = measure(plan, tools, || leased::run(plan, tools, built))?;
    write_leased(plan, &about, &noise, started.elapsed().as_secs_f64(), &leased)
}

fn write_leased(
    plan: &plan::Plan,
    about: &[(&'static str, String)],
    noise: &noise::Noise,
    seconds: f64,
    leased: &leased::LeasedRun,
) -> Result<()> {
    let text = report::page(
        "leased mode (`--leased`)",
        plan,
        about,
        noise,
        seconds,
        &leased::markdown(leased, plan),
    );
    write_page(plan, "LEASED.md", &text, seconds)
}

fn write_shed(
    plan: &plan::Plan,
    about: &[(&'static str, String)],
    noise: &noise::Noise,
    seconds: f64,
    shed: &shed::Shedding,
    font: &std::path::Path,
) -> Result<()> {
    let dir = out_dir(plan.quick);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let title = format!("Sluice load shedding ({})", if plan.quick { "quick run" } else { "full run" });
    shed_plot::draw(&dir.join(SHED_PLOT), font, &title, shed)?;
    let md = dir.join("SHED.md");
    std::fs::write(&md, report::shed_markdown(plan, about, noise, seconds, shed, SHED_PLOT))
        .with_context(|| format!("writing {}", md.display()))?;
    eprintln!("bench: wrote {} and {SHED_PLOT} in {seconds:.0} s", md.display());
    Ok(())
}

fn out_dir(quick: bool) -> PathBuf {
    let root = workspace_root();
    if quick {
        root.join("target/bench-quick")
    } else {
        root.join("bench/results")
    }
}

/// What ran, for the report's header.
fn about(tools: &tools::Tools, plan: &plan::Plan, measuring: f64) -> Vec<(&'static str, String)> {
    let first_line = |program: &std::path::Path, arg: &str| {
        probe(Command::new(program).arg(arg))
            .and_then(|out| out.lines().next().map(str::to_owned))
            .unwrap_or_else(|| "unknown".into())
    };
    let commit = probe(
        Command::new("git").args(["-C"]).arg(workspace_root()).args(["describe", "--always", "--dirty"]),
    )
    .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    vec![
        ("commit", commit),
        ("machine", format!("{cores} cores; everything on loopback")),
        ("envoy", first_line(&tools.envoy, "--version")),
        ("oha", first_line(&tools.oha, "--version")),
        ("redis", first_line(&tools.redis_server, "--version")),
        ("measuring", format!("{measuring:.0} s after the builds; {} round(s)", plan.rounds)),
    ]
}
