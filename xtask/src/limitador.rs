//! The bench's RLS peer (`bench/limitador-peer`), built in release: an Envoy
//! RLS v3 server on the `limitador` crate with its Redis storage.
//!
//! limitador 0.14.0 as published does not compile with `redis_storage`
//! alone: its key builders call `storage::keys::bin` and
//! `Counter::variables_for_key`, which it compiles only with
//! `disk_storage`, and that feature needs RocksDB (a C++ build of many
//! minutes, and libclang). So the peer is its own workspace, whose
//! `[patch.crates-io]` points at `target/limitador-peer/limitador-0.14.0`:
//! here the published crate, unpacked from cargo's registry cache (fetched
//! first if missing), with those two items' `cfg` widened to
//! `any(feature = "disk_storage", feature = "redis_storage")`. Nothing else
//! in the engine changes.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::cmd;
use crate::paths::workspace_root;

const VERSION: &str = "0.14.0";
const PACKAGE: &str = "sluice-bench-limitador";
/// The two items of the crate that its Redis storage uses but that compile
/// only with `disk_storage`: (file, the item's first line).
const FIXES: [(&str, &str); 2] =
    [("src/storage/keys.rs", "pub mod bin {"), ("src/counter.rs", "    pub(crate) fn variables_for_key(")];
const CFG_BEFORE: &str = "#[cfg(feature = \"disk_storage\")]\n";
const CFG_AFTER: &str = "#[cfg(any(feature = \"disk_storage\", feature = \"redis_storage\"))]\n";

/// Builds the peer; the path of its binary.
pub(crate) fn build() -> Result<PathBuf> {
    let dir = workspace_root().join("target/limitador-peer");
    let source = dir.join(format!("limitador-{VERSION}"));
    if !source.join("Cargo.toml").is_file() {
        unpack(&dir, &source)?;
    }
    let manifest = workspace_root().join("bench/limitador-peer/Cargo.toml");
    let target = dir.join("target");
    cmd::run(
        cmd::cargo()
            .args(["build", "--release", "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", &target),
    )?;
    let bin = target.join("release").join(PACKAGE);
    bin.is_file()
        .then_some(bin.clone())
        .with_context(|| format!("the build succeeded but {} is missing", bin.display()))
}

/// The published crate, unpacked into `source` with the one `cfg` widened.
fn unpack(dir: &Path, source: &Path) -> Result<()> {
    let crate_file = match cached()? {
        Some(file) => file,
        None => {
            fetch(dir)?;
            cached()?.context("cargo fetched limitador but its .crate is not in the registry cache")?
        }
    };
    let _ = std::fs::remove_dir_all(source);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    cmd::run(cmd::clean("tar").arg("xzf").arg(&crate_file).arg("-C").arg(dir))?;
    for (file, item) in FIXES {
        let path = source.join(file);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let indent = &item[..item.len() - item.trim_start().len()];
        let (before, after) = (format!("{indent}{CFG_BEFORE}{item}"), format!("{indent}{CFG_AFTER}{item}"));
        if !text.contains(&before) {
            bail!("{}: the `cfg` to widen is not there; was the crate changed?", path.display());
        }
        std::fs::write(&path, text.replacen(&before, &after, 1))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `limitador-VERSION.crate` in cargo's registry cache, if there.
fn cached() -> Result<Option<PathBuf>> {
    let cache = cargo_home().join("registry/cache");
    let Ok(registries) = std::fs::read_dir(&cache) else { return Ok(None) };
    Ok(registries
        .flatten()
        .map(|r| r.path().join(format!("limitador-{VERSION}.crate")))
        .find(|file| file.is_file()))
}

/// Downloads the crate with `cargo fetch` of a one-dependency manifest.
fn fetch(dir: &Path) -> Result<()> {
    let fetcher = dir.join("fetch");
    std::fs::create_dir_all(fetcher.join("src"))
        .with_context(|| format!("creating {}", fetcher.display()))?;
    let manifest = format!(
        "[package]\nname = \"fetch-limitador\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[dependencies]\n\
         limitador = {{ version = \"={VERSION}\", default-features = false }}\n\n[workspace]\n"
    );
    std::fs::write(fetcher.join("Cargo.toml"), manifest)?;
    std::fs::write(fetcher.join("src/lib.rs"), "")?;
    cmd::run(cmd::cargo().arg("fetch").arg("--manifest-path").arg(fetcher.join("Cargo.toml")))
}

fn cargo_home() -> PathBuf {
    match std::env::var_os("CARGO_HOME") {
        Some(home) => PathBuf::from(home),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo"),
    }
}
