//! `cargo xtask`: the one entry point for building, testing and demoing Sluice.
//!
//! # Layout
//!
//! - `paths`: where the workspace and `dist/` are.
//! - `build`: `dist/sluice.wasm` and `dist/sluice`, and the bench's own builds.
//! - `wasm`: the wasm32-wasip1 build of the filter, by the rustup or the Debian route.
//! - `deps`: find or install `redis-server` and `envoy` (shared with the demo).
//! - `apt`: non-interactive Debian installs.
//! - `cmd`: running external commands with clear errors and a clean environment.
//! - `test`: what CI runs.
//! - `browser`: Chromium, Node.js and playwright-core for the page tests, and running them.
//! - `demo`: the dual-window demo through real Envoy.
//! - `bench`: installs and builds what the bench needs, then runs the crate
//!   `sluice-bench` (`bench/`), which writes `bench/results/`.
//! - `fuzz`: the cargo-fuzz targets in `fuzz/`, for a given time each.
//! - `playground`: the policy playground, a static site in `dist/playground/`.
//! - `docs`: `docs/architecture.svg`, drawn from the workspace.
//! - `package`: `dist/` and then the images under `dist/images/`.
//! - `images`: what the filter's and the shim's OCI images hold.
//! - `oci`: writing OCI image layouts and archives, no daemon.
//!
//! The modules use each other one way: `paths` at the bottom, `cmd` over it,
//! `apt` over `cmd`, `deps` and `wasm` over `apt`, `build` over `wasm`, `images` over
//! `oci`, and the tasks (`test`, `demo`, `bench`, `playground`, `browser`, `fuzz`, `docs`,
//! `package`) on top.

mod apt;
mod bench;
mod browser;
mod build;
mod cmd;
mod demo;
mod deps;
mod docs;
mod fuzz;
mod images;
mod limitador;
mod oci;
mod package;
mod paths;
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
        /// Only the fast lane: every native test that needs no Envoy, Redis,
        /// built dist/ or browser (the edit-compile loop; installs nothing).
        #[arg(long)]
        fast: bool,
        /// Arguments for the test binaries, after `--` (e.g. `-- --nocapture`).
        #[arg(last = true)]
        test_args: Vec<String>,
    },
    /// Install what is missing, build, and run the dual-window demo through Envoy.
    Demo {
        /// Leave Envoy, Redis and the shim running after the demo's requests.
        #[arg(long)]
        keep_running: bool,
        /// The token-budget demo instead: teams streaming chat completions to a mock LLM provider.
        #[arg(long)]
        llm: bool,
    },
    /// Run every benchmark on loopback (the crate sluice-bench); writes bench/results/LATEST.md and a
    /// plot. Its flags (--quick, --egress, --shed, --feedback, --redis-cost, --callgrind, --leased)
    /// are the bench's: `cargo xtask bench --help` lists them.
    #[command(disable_help_flag = true)]
    Bench {
        /// The bench's flags, passed on as they are.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Steady mixed traffic through Envoy for N minutes, sampled and judged flat (the bench's
    /// `--soak-seconds`); writes bench/results/SOAK.md and soak.png. Fails on a leak.
    Soak {
        /// How long the traffic runs.
        #[arg(long, default_value_t = 20)]
        minutes: u64,
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
    /// Build dist/, then OCI images of the filter and of a static shim under dist/images/.
    Package,
    /// Draw docs/architecture.svg from the workspace (crates, path dependencies, the flow's phases).
    Docs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Build => build::build().map(drop),
        Task::Test { fast: true, test_args } => test::fast(&test_args),
        Task::Test { fast: false, test_args } => test::run(&test_args),
        Task::Demo { keep_running, llm } => run_demo(keep_running, llm),
        Task::Bench { args } => bench::run(&args),
        Task::Soak { minutes } => bench::run(&["--soak-seconds".to_string(), (minutes * 60).to_string()]),
        Task::Playground => playground::build().map(drop),
        Task::Fuzz { seconds, target } => fuzz::run(seconds, target.as_deref()),
        Task::Docs => docs::run(),
        Task::Package => package::run(),
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
fn run_demo(keep_running: bool, llm: bool) -> Result<()> {
    let redis = deps::ensure_redis()?;
    let envoy = deps::ensure_envoy()?;
    build::build()?;
    std::env::set_var("SLUICE_REDIS_SERVER", redis);
    std::env::set_var("SLUICE_ENVOY", envoy);
    std::env::set_var("SLUICE_DIST", paths::dist_dir());
    if llm {
        return demo::run_llm(keep_running);
    }
    demo::run(keep_running)
}
