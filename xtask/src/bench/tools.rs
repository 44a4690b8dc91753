//! The bench's outside programs, found or installed (as the tests install
//! Redis and Envoy), and a bounded way to run them.
//!
//! - `oha` (load with a fixed rate, latency percentiles, JSON): `SLUICE_OHA`,
//!   else PATH or cargo's bin dir, else `cargo install oha --locked`.
//! - `redis-benchmark` and `redis-cli`: Debian's `redis-tools`.
//! - a TrueType font for the plot: Debian's `fonts-dejavu-core`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{apt, cmd, deps};

/// The oha release the bench was written against.
const OHA_VERSION: &str = "1.16.0";
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

pub(crate) struct Tools {
    pub(crate) redis_server: PathBuf,
    pub(crate) envoy: PathBuf,
    pub(crate) oha: PathBuf,
    pub(crate) redis_benchmark: PathBuf,
    pub(crate) redis_cli: PathBuf,
    pub(crate) font: PathBuf,
}

pub(crate) fn ensure() -> Result<Tools> {
    let redis_server = deps::ensure_redis()?;
    let envoy = deps::ensure_envoy()?;
    if cmd::which("redis-benchmark").is_none() || cmd::which("redis-cli").is_none() {
        apt::install(&["redis-tools"], "redis-benchmark for the bench")?;
    }
    if !Path::new(FONT).is_file() {
        apt::install(&["fonts-dejavu-core"], "a font for the bench's plot")?;
    }
    Ok(Tools {
        redis_server,
        envoy,
        oha: ensure_oha()?,
        redis_benchmark: cmd::which("redis-benchmark").context("redis-benchmark is not on PATH")?,
        redis_cli: cmd::which("redis-cli").context("redis-cli is not on PATH")?,
        font: PathBuf::from(FONT),
    })
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

/// Runs `cmd` to completion and returns its stdout; kills it and fails if it
/// runs longer than `limit` or exits non-zero. Stderr goes to ours.
pub(crate) fn output_within(cmd: &mut Command, limit: Duration) -> Result<String> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {name}"))?;
    let mut stdout = child.stdout.take().context("no stdout pipe")?;
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{name} ran longer than {limit:?} and was killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = reader.join().unwrap_or_default();
    if !status.success() {
        bail!("{name} failed ({status}): {}", out.trim());
    }
    Ok(out)
}
