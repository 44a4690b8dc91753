//! `cargo xtask playground`: the policy playground as a static site in
//! `dist/playground/`: the `sluice-playground` crate built for the browser,
//! its JS glue from wasm-bindgen (`pkg/`), and the page from
//! `playground/www/`. The shim serves it at `/playground`.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::cmd::{self, clean};
use crate::paths::{dist_dir, workspace_root};
use crate::wasm;

/// Must equal the `wasm-bindgen` crate's pinned version (playground/Cargo.toml).
const WASM_BINDGEN: &str = "0.2.130";

/// Builds the site; its directory.
pub fn build() -> Result<PathBuf> {
    let module = wasm::build_browser("sluice-playground", "sluice_playground.wasm")?;
    let bindgen = ensure_wasm_bindgen()?;
    let site = dist_dir().join("playground");
    if site.exists() {
        fs::remove_dir_all(&site).with_context(|| format!("clearing {}", site.display()))?;
    }
    fs::create_dir_all(&site).with_context(|| format!("creating {}", site.display()))?;
    cmd::run(
        clean(&bindgen)
            .args(["--target", "web", "--no-typescript", "--out-dir"])
            .arg(site.join("pkg"))
            .arg(&module),
    )?;
    let www = workspace_root().join("playground/www");
    for entry in fs::read_dir(&www).with_context(|| format!("reading {}", www.display()))? {
        let path = entry?.path();
        if let Some(name) = path.file_name() {
            fs::copy(&path, site.join(name)).with_context(|| format!("copying {}", path.display()))?;
        }
    }
    eprintln!("xtask: playground written to {}", site.display());
    Ok(site)
}

/// `wasm-bindgen` of the pinned version: on PATH, in ~/.cargo/bin, or installed.
fn ensure_wasm_bindgen() -> Result<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let candidates = cmd::which("wasm-bindgen").into_iter().chain(home.map(|h| h.join("bin/wasm-bindgen")));
    for path in candidates {
        let version = cmd::probe(clean(&path).arg("--version")).unwrap_or_default();
        if version.split_whitespace().nth(1) == Some(WASM_BINDGEN) {
            return Ok(path);
        }
    }
    eprintln!("xtask: installing wasm-bindgen-cli {WASM_BINDGEN} (crates.io; a few minutes)");
    cmd::run(clean("cargo").args(["install", "wasm-bindgen-cli", "--version", WASM_BINDGEN]))?;
    cmd::which("wasm-bindgen").context("wasm-bindgen installed but not on PATH")
}
