//! Where things are: the workspace, the built artifacts in `dist/`, the
//! envoy and redis-server binaries, and free loopback ports.
//!
//! `cargo xtask test` and `cargo xtask demo` set `SLUICE_DIST`, `SLUICE_ENVOY`
//! and `SLUICE_REDIS_SERVER`; without them we fall back to `<workspace>/dist`
//! and `PATH`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

const HINT: &str = "run the tests with `cargo xtask test` (it installs and builds everything)";

/// The workspace root: this crate lives in `tests/harness/`.
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors().nth(2).unwrap_or(here).to_path_buf()
}

/// The path of a built artifact in `SLUICE_DIST` (or `<workspace>/dist`),
/// checked to exist.
pub fn dist(file: &str) -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("SLUICE_DIST") {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join("dist"),
    };
    let path = dir.join(file);
    if !path.is_file() {
        bail!("{} not found; {HINT}", path.display());
    }
    Ok(path)
}

/// A binary named by `env_var`, or else found on `PATH` as `name`.
pub(crate) fn binary(env_var: &str, name: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(env_var) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("{env_var}={} does not exist; {HINT}", path.display());
        }
        return Ok(path);
    }
    let found = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file());
    found.with_context(|| format!("`{name}` not found: {env_var} is unset and it is not on PATH; {HINT}"))
}

/// A loopback port that was free a moment ago (bind port 0, read it, drop it).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
