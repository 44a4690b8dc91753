//! The bench's outside programs and its own builds, found where `cargo
//! xtask bench` put them (it installs and builds; the bench does neither),
//! and a bounded way to run outside programs.
//!
//! - `SLUICE_REDIS_SERVER`, `SLUICE_ENVOY`: redis-server and Envoy, as for
//!   the harness (else PATH).
//! - `SLUICE_OHA`: oha (load with a fixed rate, latency percentiles, JSON).
//! - `redis-benchmark` and `redis-cli`: on PATH (Debian's `redis-tools`).
//! - `SLUICE_BENCH_FONT`: a TrueType font for the plots.
//! - `SLUICE_BENCH_FLOOR_WASM`, `SLUICE_BENCH_DENY_FLOOR_WASM`,
//!   `SLUICE_BENCH_RESPONDER`, `SLUICE_BENCH_LIMITADOR`: the callout floor
//!   filter (`bench/callout-floor`), the Wasm deny floor
//!   (`bench/deny-floor`), the responder (`bench/responder`) and the RLS
//!   peer on the limitador crate (`bench/limitador-peer`).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

const HINT: &str = "run the bench with `cargo xtask bench` (it installs and builds what the bench needs)";

pub(crate) struct Tools {
    pub(crate) redis_server: PathBuf,
    pub(crate) envoy: PathBuf,
    pub(crate) oha: PathBuf,
    pub(crate) redis_benchmark: PathBuf,
    pub(crate) redis_cli: PathBuf,
    pub(crate) font: PathBuf,
}

pub(crate) fn find() -> Result<Tools> {
    Ok(Tools {
        redis_server: given("SLUICE_REDIS_SERVER").or_else(|_| on_path("redis-server"))?,
        envoy: given("SLUICE_ENVOY").or_else(|_| on_path("envoy"))?,
        oha: given("SLUICE_OHA")?,
        redis_benchmark: on_path("redis-benchmark")?,
        redis_cli: on_path("redis-cli")?,
        font: given("SLUICE_BENCH_FONT")?,
    })
}

/// The bench's own builds, in `target/`.
pub(crate) struct BenchArtifacts {
    pub(crate) floor_wasm: PathBuf,
    pub(crate) deny_floor_wasm: PathBuf,
    pub(crate) responder: PathBuf,
    pub(crate) limitador: PathBuf,
}

impl BenchArtifacts {
    pub(crate) fn find() -> Result<BenchArtifacts> {
        Ok(BenchArtifacts {
            floor_wasm: given("SLUICE_BENCH_FLOOR_WASM")?,
            deny_floor_wasm: given("SLUICE_BENCH_DENY_FLOOR_WASM")?,
            responder: given("SLUICE_BENCH_RESPONDER")?,
            limitador: given("SLUICE_BENCH_LIMITADOR")?,
        })
    }
}

/// The existing file that `var` names.
fn given(var: &str) -> Result<PathBuf> {
    let path = PathBuf::from(std::env::var_os(var).with_context(|| format!("{var} is not set; {HINT}"))?);
    if !path.is_file() {
        bail!("{var}={} does not exist; {HINT}", path.display());
    }
    Ok(path)
}

/// The first file called `name` on PATH.
fn on_path(name: &str) -> Result<PathBuf> {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .with_context(|| format!("`{name}` is not on PATH; {HINT}"))
}

/// Run `cmd` quietly and return its trimmed stdout, or `None` if it could not
/// start or failed. For probes, where "no" is an answer and not an error.
pub(crate) fn probe(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
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
