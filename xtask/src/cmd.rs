//! Running external commands: echo them, stream their output, and turn a
//! failure into an error that names the command.
//!
//! Also the environment scrubbing that every child cargo needs: `cargo run`
//! hands xtask variables (`RUSTUP_TOOLCHAIN`, `CARGO_PKG_*`, a longer
//! `LD_LIBRARY_PATH`, ...) that describe *this* build, not the ones we start.

use std::env;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Variables that `cargo run`, rustup or the caller may have set and that
/// would steer a child build away from what its route asks for.
const LEAKY: &[&str] = &[
    "RUSTUP_TOOLCHAIN",
    "RUSTUP_TOOLCHAIN_SOURCE",
    "RUST_RECURSION_COUNT",
    "CARGO",
    "CARGO_TARGET_DIR",
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_MAKEFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_BUILD_RUSTC",
    "CARGO_BUILD_RUSTC_WRAPPER",
    "CARGO_BUILD_RUSTFLAGS",
    "RUSTC",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTFLAGS",
];

/// A command for a child cargo or rustc with the leaky variables removed.
pub(crate) fn clean(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for name in LEAKY {
        cmd.env_remove(name);
    }
    for (name, _) in env::vars_os() {
        if name.to_string_lossy().starts_with("CARGO_PKG_") {
            cmd.env_remove(name);
        }
    }
    // `cargo run` prepends the rustup toolchain's and our target dir's
    // libraries; keep only what the caller had.
    if let Some(paths) = env::var_os("LD_LIBRARY_PATH") {
        let rustup_home = env::var_os("RUSTUP_HOME").map(PathBuf::from);
        let target = crate::paths::workspace_root().join("target");
        let kept: Vec<PathBuf> = env::split_paths(&paths)
            .filter(|p| !p.starts_with(&target))
            .filter(|p| rustup_home.as_ref().is_none_or(|home| !p.starts_with(home)))
            .collect();
        if kept.is_empty() {
            cmd.env_remove("LD_LIBRARY_PATH");
        } else if let Ok(joined) = env::join_paths(kept) {
            cmd.env("LD_LIBRARY_PATH", joined);
        }
    }
    cmd
}

/// The rustup (or plain) cargo for native builds and tests.
pub(crate) fn cargo() -> Command {
    let mut cmd = clean("cargo");
    cmd.current_dir(crate::paths::workspace_root());
    cmd
}

/// Run `cmd` with inherited stdio; fail naming the command if it fails.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let line = describe(cmd);
    eprintln!("$ {line}");
    let status = cmd.status().with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
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

/// The first executable file called `name` on PATH.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    let paths = env::var_os("PATH")?;
    env::split_paths(&paths).map(|dir| dir.join(name)).find(|p| is_executable(p))
}

pub(crate) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}
