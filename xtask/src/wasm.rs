//! Building the proxy-wasm filters for wasm32-wasip1 (Sluice's, and the
//! bench's callout floor and Wasm deny floor, in one cargo call), by one of
//! two routes:
//!
//! - rustup: the active toolchain has the wasm32-wasip1 std installed, so a
//!   plain `cargo build --target wasm32-wasip1` works.
//! - Debian: no prebuilt wasm std (rustup cannot download one offline), so
//!   Debian's `rustc-web` builds std from `rust-web-src` (`-Zbuild-std`) and
//!   links with `wasm-ld` against Debian's wasi-libc. See shared/TOOLCHAIN.md.
//!
//! Each route keeps its own target dir so the two compilers never rebuild
//! each other's host artifacts.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::paths::workspace_root;
use crate::{apt, cmd};

const TARGET: &str = "wasm32-wasip1";
/// The packages built, and the `.wasm` each produces.
const PLUGIN: (&str, &str) = ("sluice-plugin", "sluice_plugin.wasm");
const FLOOR: (&str, &str) = ("sluice-callout-floor", "sluice_callout_floor.wasm");
const DENY_FLOOR: (&str, &str) = ("sluice-deny-floor", "sluice_deny_floor.wasm");

const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
const DEBIAN_STD_SRC: &str = "/usr/lib/rustlib/src/rust/library";
const WASM_LD: &str = "/usr/lib/llvm-22/bin/wasm-ld";
const WASI_LIBC: &str = "/usr/lib/wasm32-wasi";
const DEBIAN_PACKAGES: &[&str] = &["rustc-web", "cargo-web", "rust-web-src", "lld-22", "wasi-libc"];

/// The `.wasm` files one build produced.
pub(crate) struct Artifacts {
    /// Sluice's filter.
    pub(crate) plugin: PathBuf,
    /// The bench's callout floor (`bench/callout-floor`).
    pub(crate) floor: PathBuf,
    /// The bench's Wasm deny floor (`bench/deny-floor`).
    pub(crate) deny_floor: PathBuf,
}

/// Build the filters and return the paths of the `.wasm` files.
pub(crate) fn build() -> Result<Artifacts> {
    let started = Instant::now();
    let target_dir = match rustup_wasm_std() {
        Some(lib) => {
            eprintln!("wasm toolchain: rustup ({TARGET} std found at {})", lib.display());
            build_rustup()?
        }
        None => {
            eprintln!("wasm toolchain: debian rustc-web + build-std");
            build_debian()?
        }
    };
    eprintln!("xtask: wasm build took {:.1}s", started.elapsed().as_secs_f64());
    Ok(Artifacts {
        plugin: artifact_in(&target_dir, PLUGIN.1)?,
        floor: artifact_in(&target_dir, FLOOR.1)?,
        deny_floor: artifact_in(&target_dir, DENY_FLOOR.1)?,
    })
}

/// The browser target, for the playground (wasm-bindgen).
const BROWSER: &str = "wasm32-unknown-unknown";

/// Builds `package` for the browser (wasm32-unknown-unknown) by the same
/// two routes; the path of its `.wasm` (named `artifact`).
pub(crate) fn build_browser(package: &str, artifact: &str) -> Result<PathBuf> {
    let started = Instant::now();
    let target_dir = match rustup_std(BROWSER) {
        Some(_) => {
            let dir = workspace_root().join("target/wasm-rustup");
            cmd::run(
                cmd::cargo()
                    .args(["build", "--profile", "wasm", "--target", BROWSER, "-p", package])
                    .env("CARGO_TARGET_DIR", &dir),
            )?;
            dir
        }
        None => {
            ensure_debian()?;
            let dir = workspace_root().join("target/wasm");
            cmd::run(
                cmd::clean(DEBIAN_CARGO)
                    .current_dir(workspace_root())
                    .args(["build", "--profile", "wasm", "-Zbuild-std=std,panic_abort", "--target", BROWSER])
                    .args(["-p", package])
                    .env("RUSTC", DEBIAN_RUSTC)
                    .env("RUSTC_BOOTSTRAP", "1")
                    .env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", WASM_LD)
                    .env("CARGO_TARGET_DIR", &dir),
            )?;
            dir
        }
    };
    eprintln!("xtask: {package} for the browser took {:.1}s", started.elapsed().as_secs_f64());
    let path = target_dir.join(BROWSER).join("wasm").join(artifact);
    path.is_file()
        .then(|| path.clone())
        .with_context(|| format!("the build succeeded but {} is missing", path.display()))
}

/// The rustup toolchain's wasm32-wasip1 lib dir, if it holds a libstd.
fn rustup_wasm_std() -> Option<PathBuf> {
    rustup_std(TARGET)
}

/// The rustup toolchain's lib dir for `target`, if it holds a libstd.
fn rustup_std(target: &str) -> Option<PathBuf> {
    let sysroot = cmd::probe(cmd::clean("rustc").args(["--print", "sysroot"]))?;
    std_in(Path::new(&sysroot), target)
}

fn std_in(sysroot: &Path, target: &str) -> Option<PathBuf> {
    let lib = sysroot.join("lib/rustlib").join(target).join("lib");
    let has_std = std::fs::read_dir(&lib).ok()?.flatten().any(|entry| {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        name.starts_with("libstd-") && name.ends_with(".rlib")
    });
    has_std.then_some(lib)
}

/// Builds the filters' packages; the target dir they are in.
fn build_rustup() -> Result<PathBuf> {
    let target_dir = workspace_root().join("target/wasm-rustup");
    cmd::run(
        cmd::cargo()
            .args([
                "build",
                "--profile",
                "wasm",
                "--target",
                TARGET,
                "-p",
                PLUGIN.0,
                "-p",
                FLOOR.0,
                "-p",
                DENY_FLOOR.0,
            ])
            .env("CARGO_TARGET_DIR", &target_dir),
    )?;
    Ok(target_dir)
}

/// Debian's rustc-web, its std source, wasm-ld and wasi-libc, installed if missing.
fn ensure_debian() -> Result<()> {
    let needed = [DEBIAN_RUSTC, DEBIAN_CARGO, DEBIAN_STD_SRC, WASM_LD, WASI_LIBC];
    if needed.iter().any(|p| !Path::new(p).exists()) {
        apt::install(DEBIAN_PACKAGES, "building wasm without rustup's wasm std")?;
    }
    Ok(())
}

fn build_debian() -> Result<PathBuf> {
    ensure_debian()?;
    let target_dir = workspace_root().join("target/wasm");
    cmd::run(
        cmd::clean(DEBIAN_CARGO)
            .current_dir(workspace_root())
            .args(["build", "--profile", "wasm", "-Zbuild-std=std,panic_abort"])
            .args(["--target", TARGET, "-p", PLUGIN.0, "-p", FLOOR.0, "-p", DENY_FLOOR.0])
            .env("RUSTC", DEBIAN_RUSTC)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("CARGO_TARGET_WASM32_WASIP1_LINKER", WASM_LD)
            .env("CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS", format!("-L native={WASI_LIBC}"))
            .env("CARGO_TARGET_DIR", &target_dir),
    )?;
    Ok(target_dir)
}

fn artifact_in(target_dir: &Path, artifact: &str) -> Result<PathBuf> {
    let path = target_dir.join(TARGET).join("wasm").join(artifact);
    path.is_file()
        .then(|| path.clone())
        .with_context(|| format!("the wasm build succeeded but {} is missing", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The route choice: only a wasm32-wasip1 lib dir holding a libstd rlib
    /// selects the rustup route.
    #[test]
    fn rustup_route_needs_a_wasm_libstd() {
        let sysroot = std::env::temp_dir().join(format!("xtask-sysroot-{}", std::process::id()));
        let lib = sysroot.join("lib/rustlib/wasm32-wasip1/lib");
        std::fs::create_dir_all(&lib).expect("create fake sysroot");
        assert_eq!(std_in(&sysroot, TARGET), None, "an empty lib dir is not a std");

        std::fs::write(lib.join("libstd-0123abcd.rlib"), b"").expect("write fake libstd");
        assert_eq!(std_in(&sysroot, TARGET), Some(lib));
        std::fs::remove_dir_all(&sysroot).expect("clean up fake sysroot");
    }
}
