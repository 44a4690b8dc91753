//! `cargo xtask build`: the two shipped artifacts, copied into `dist/`.
//!
//! - `dist/sluice.wasm`: the proxy-wasm filter (see `wasm.rs` for the route).
//! - `dist/sluice`: the native shim, a plain release build.
//!
//! The same two cargo calls also build what `cargo xtask bench` runs: the
//! callout floor filter (`bench/callout-floor`), the Wasm deny floor
//! (`bench/deny-floor`) and the bench responder
//! (`bench/responder`). They stay in `target/`, as they ship nowhere. Building
//! the responder in the shim's cargo call gives both one feature set, so
//! their shared dependencies are compiled once.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::paths::{dist_dir, workspace_root};
use crate::{cmd, wasm};

/// The bench's own builds, in `target/`.
pub struct BenchArtifacts {
    pub floor_wasm: PathBuf,
    pub deny_floor_wasm: PathBuf,
    pub responder: PathBuf,
}

const SHIM: &str = "sluice-shim";
const RESPONDER: &str = "sluice-bench-responder";

/// Build the filter and the shim and copy both into `dist/`; also build the
/// bench's artifacts and return where they are.
pub fn build() -> Result<BenchArtifacts> {
    let dist = dist_dir();
    fs::create_dir_all(&dist).with_context(|| format!("cannot create {}", dist.display()))?;

    let wasm = wasm::build()?;
    let wasm_out = copy(&wasm.plugin, &dist.join("sluice.wasm"))?;

    cmd::run(cmd::cargo().args(["build", "--release", "-p", SHIM, "-p", RESPONDER]))?;
    let release = workspace_root().join("target/release");
    let shim = release.join("sluice");
    let shim_out = copy(&shim, &dist.join("sluice"))?;

    for out in [wasm_out, shim_out] {
        let bytes = fs::metadata(&out).with_context(|| format!("cannot stat {}", out.display()))?.len();
        eprintln!("{:>12}  {}", human(bytes), out.display());
    }
    Ok(BenchArtifacts {
        floor_wasm: wasm.floor,
        deny_floor_wasm: wasm.deny_floor,
        responder: release.join(RESPONDER),
    })
}

fn human(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    match bytes as f64 {
        b if b >= MIB => format!("{:.1} MiB", b / MIB),
        b => format!("{:.1} KiB", b / 1024.0),
    }
}

/// Copy then rename, so a `dist/sluice` that is running (the demo, a test)
/// is replaced rather than written over ("text file busy").
fn copy(from: &Path, to: &Path) -> Result<PathBuf> {
    let tmp = to.with_extension("partial");
    fs::copy(from, &tmp).with_context(|| format!("cannot copy {} to {}", from.display(), tmp.display()))?;
    fs::rename(&tmp, to).with_context(|| format!("cannot rename {} to {}", tmp.display(), to.display()))?;
    Ok(to.to_path_buf())
}
