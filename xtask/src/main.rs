//! `cargo xtask`: the one entry point for building, testing and demoing Sluice.
//!
//! # Layout
//!
//! - `build`: `dist/sluice.wasm` and `dist/sluice`, and where the workspace is.
//! - `wasm`: the wasm32-wasip1 build of the filter, by the rustup or the Debian route.
//! - `deps`: find or install `redis-server` and `envoy` (shared with the demo).
//! - `apt`: non-interactive Debian installs.
//! - `cmd`: running external commands with clear errors and a clean environment.
//! - `test`: what CI runs.
//! - `browser`: Chromium, Node.js and playwright-core for the page tests, and running them.
//! - `demo`: the dual-window demo through real Envoy.
//! - `bench`: every benchmark scenario on loopback, written to `bench/results/`.
//! - `fuzz`: the cargo-fuzz targets in `fuzz/`, for a given time each.
//! - `playground`: the policy playground, a static site in `dist/playground/`.

mod apt;
mod bench;
mod browser;
mod build;
mod cmd;
mod demo;
mod deps;
mod fuzz;
mod playground;
mod test;
mod wasm;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", about = "Build, test and demo Sluice.")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build dist/sluice.wasm (the filter) and dist/sluice (the native shim).
    Build,
    /// Install what is missing, build, and run every test (what CI runs).
    Test {
        /// Arguments for the test binaries, after `--` (e.g. `-- --nocapture`).
        #[arg(last = true)]
        test_args: Vec<String>,
    },
    /// Install what is missing, build, and run the dual-window demo through Envoy.
    Demo {
        /// Leave Envoy, Redis and the shim running after the demo's requests.
        #[arg(long)]
        keep_running: bool,
    },
    /// Run every benchmark on loopback; writes bench/results/LATEST.md and a plot.
    Bench {
        /// A short smoke run (about a minute) that proves the bench works; its numbers mean little.
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
    },
    /// Build the policy playground into dist/playground/ (the shim serves it at /playground).
    Playground,
    /// Run the fuzz targets (nightly, libFuzzer, ASan); not part of `test`.
    Fuzz {
        /// How long each target runs.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Only this target (parse, wire, evaluate, key, answer).
        target: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Build => build::build().map(drop),
        Task::Test { test_args } => test::run(&test_args),
        Task::Demo { keep_running } => run_demo(keep_running),
        Task::Bench { quick, egress, shed, feedback, redis_cost, callgrind, leased } => {
            bench::run(quick, bench::Only { egress, shed, feedback, redis_cost, callgrind, leased })
        }
        Task::Playground => playground::build().map(drop),
        Task::Fuzz { seconds, target } => fuzz::run(seconds, target.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// The demo uses the `sluice-harness` helpers, which read the `SLUICE_*`
/// variables; set them here, before the demo starts any thread.
fn run_demo(keep_running: bool) -> Result<()> {
    let redis = deps::ensure_redis()?;
    let envoy = deps::ensure_envoy()?;
    build::build()?;
    std::env::set_var("SLUICE_REDIS_SERVER", redis);
    std::env::set_var("SLUICE_ENVOY", envoy);
    std::env::set_var("SLUICE_DIST", build::dist_dir());
    demo::run(keep_running)
}
