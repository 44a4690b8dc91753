//! `cargo xtask fuzz`: the fuzz targets in `fuzz/`, each for a given time,
//! with cargo-fuzz (libFuzzer and the address sanitizer) on the nightly
//! toolchain. Not part of `cargo xtask test`.
//!
//! Each target starts from its committed seeds (`fuzz/seeds/<target>/`) and
//! grows a corpus in `fuzz/corpus/<target>/` (not committed). A crash stops
//! the run with the input libFuzzer saved in `fuzz/artifacts/<target>/`;
//! replay it with `cargo +nightly fuzz run <target> <file>`, then pin it as a
//! plain test in the crate it concerns.

use std::fs;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cmd::{self, clean};
use crate::paths::workspace_root;

/// Every target, in the order they run.
pub const TARGETS: &[&str] = &["parse", "wire", "evaluate", "key", "answer", "rls", "rlqs"];

pub fn run(seconds: u64, only: Option<&str>) -> Result<()> {
    let targets: Vec<&str> = match only {
        Some(name) if TARGETS.contains(&name) => vec![name],
        Some(name) => bail!("no fuzz target {name:?}; the targets are {}", TARGETS.join(", ")),
        None => TARGETS.to_vec(),
    };
    ensure_cargo_fuzz()?;
    let fuzz = workspace_root().join("fuzz");
    for target in targets {
        let corpus = fuzz.join("corpus").join(target);
        fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
        let seeds = fuzz.join("seeds").join(target);
        eprintln!("xtask: fuzzing {target} for {seconds} s");
        let mut run = fuzz_cargo();
        run.args(["fuzz", "run", target])
            .arg(&corpus)
            .arg(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .arg("-print_final_stats=1");
        cmd::run(&mut run)?;
    }
    Ok(())
}

/// The nightly cargo, run from `fuzz/`.
fn fuzz_cargo() -> Command {
    let mut cargo = clean("cargo");
    cargo.arg("+nightly").current_dir(workspace_root().join("fuzz"));
    cargo
}

fn ensure_cargo_fuzz() -> Result<()> {
    if cmd::probe(clean("cargo").args(["fuzz", "--version"])).is_some() {
        return Ok(());
    }
    eprintln!("xtask: installing cargo-fuzz (crates.io)");
    cmd::run(clean("cargo").args(["install", "cargo-fuzz", "--locked"]))
}
