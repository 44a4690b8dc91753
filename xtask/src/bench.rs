//! `cargo xtask bench [FLAGS]`: installs and builds what the bench needs,
//! then runs the bench, the crate `sluice-bench` (`bench/`), as a child:
//! `cargo run -p sluice-bench -- FLAGS`, in the dev profile, as when the bench
//! ran inside xtask. The flags are the bench's own (`--quick`, `--egress`,
//! `--shed`, `--feedback`, `--redis-cost`, `--callgrind`, `--leased`); see
//! `cargo xtask bench --help`.
//!
//! What it hands over, in the environment (the bench installs nothing):
//!
//! - `SLUICE_REDIS_SERVER`, `SLUICE_ENVOY`, `SLUICE_DIST`: as for the tests.
//! - `SLUICE_OHA`: oha (load with a fixed rate, latency percentiles, JSON),
//!   from `SLUICE_OHA`, PATH or cargo's bin dir, else `cargo install oha --locked`.
//! - `SLUICE_BENCH_FONT`: a TrueType font for the plots (Debian's `fonts-dejavu-core`).
//! - `SLUICE_BENCH_FLOOR_WASM`, `SLUICE_BENCH_RESPONDER`: the callout floor
//!   filter and the responder, and `SLUICE_BENCH_DENY_FLOOR_WASM`, the Wasm
//!   deny floor, built beside `dist/` (see `build.rs`).
//! - `SLUICE_BENCH_LIMITADOR`: the bench's RLS peer on the limitador crate
//!   (`bench/limitador-peer`), built here in release: only the bench runs it
//!   (see `limitador.rs`).
//!
//! `redis-benchmark` and `redis-cli` (Debian's `redis-tools`) are installed
//! here and found on PATH by the bench.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::paths::dist_dir;
use crate::{apt, build, cmd, deps, limitador};

/// The oha release the bench was written against.
const OHA_VERSION: &str = "1.16.0";
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const BENCH: &str = "sluice-bench";

/// `args` go to the bench as they are.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut bench = cmd::cargo();
    bench.args(["run", "-p", BENCH, "--"]).args(args);
    // Help needs nothing installed or built.
    if args.iter().any(|arg| arg == "-h" || arg == "--help") {
        return cmd::run(&mut bench);
    }
    let redis_server = deps::ensure_redis()?;
    let envoy = deps::ensure_envoy()?;
    if cmd::which("redis-benchmark").is_none() || cmd::which("redis-cli").is_none() {
        apt::install(&["redis-tools"], "redis-benchmark for the bench")?;
    }
    if !Path::new(FONT).is_file() {
        apt::install(&["fonts-dejavu-core"], "a font for the bench's plot")?;
    }
    let oha = ensure_oha()?;
    let built = build::build()?;
    let limitador = limitador::build()?;
    bench
        .env("SLUICE_REDIS_SERVER", redis_server)
        .env("SLUICE_ENVOY", envoy)
        .env("SLUICE_DIST", dist_dir())
        .env("SLUICE_OHA", oha)
        .env("SLUICE_BENCH_FONT", FONT)
        .env("SLUICE_BENCH_FLOOR_WASM", built.floor_wasm)
        .env("SLUICE_BENCH_DENY_FLOOR_WASM", built.deny_floor_wasm)
        .env("SLUICE_BENCH_RESPONDER", built.responder)
        .env("SLUICE_BENCH_LIMITADOR", limitador);
    cmd::run(&mut bench)
}

fn ensure_oha() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("SLUICE_OHA") {
        return Ok(PathBuf::from(path));
    }
    let cargo_bin = cargo_home().join("bin/oha");
    if let Some(path) =
        cmd::which("oha").or_else(|| cmd::is_executable(&cargo_bin).then(|| cargo_bin.clone()))
    {
        return Ok(path);
    }
    eprintln!("xtask: installing oha {OHA_VERSION} with cargo install (a few minutes, once)");
    cmd::run(cmd::clean("cargo").args(["install", "oha", "--locked", "--version", OHA_VERSION]))?;
    cmd::is_executable(&cargo_bin)
        .then_some(cargo_bin)
        .context("cargo install oha succeeded but its binary is not in cargo's bin dir")
}

fn cargo_home() -> PathBuf {
    match std::env::var_os("CARGO_HOME") {
        Some(home) => PathBuf::from(home),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo"),
    }
}
