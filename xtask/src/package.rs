//! `cargo xtask package`: `dist/` as `cargo xtask build` makes it, then the
//! images under `dist/images/` (see `images.rs`): the filter as a Wasm
//! image, and the shim, linked statically, as an image from scratch.
//!
//! The static shim is the host's gnu target with `+crt-static` (the musl
//! std is not installable here). The flag goes through
//! `CARGO_TARGET_<TRIPLE>_RUSTFLAGS` with an explicit `--target`, so build
//! scripts and proc macros, which cannot be static, stay as they are.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::paths::{dist_dir, workspace_root};
use crate::{build, cmd, deps, images};

pub fn run() -> Result<()> {
    build::build()?;
    let dist = dist_dir();
    let out = dist.join("images");
    fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;

    let triple = host_triple()?;
    let shim = static_shim(&triple)?;
    let static_out = out.join("sluice");
    fs::copy(&shim, &static_out)
        .with_context(|| format!("cannot copy {} to {}", shim.display(), static_out.display()))?;

    let wasm = read(&dist.join("sluice.wasm"))?;
    let binary = read(&static_out)?;
    let tag = shim_version()?;
    let skopeo = deps::ensure_skopeo()?;
    for image in images::write_all(&wasm, &binary, oci_arch(&triple)?, &tag, &out)? {
        eprintln!("{}:{}  {}", image.name, image.tag, image.digest);
        // Read each back with another tool than the one that wrote it.
        for reference in [
            format!("oci:{}:{}", image.layout.display(), image.tag),
            format!("oci-archive:{}:{}", image.archive.display(), image.tag),
        ] {
            cmd::run(
                Command::new(&skopeo)
                    .args(["inspect", "--format", "{{.Digest}} {{.Os}}/{{.Architecture}}"])
                    .arg(&reference),
            )?;
        }
    }
    eprintln!("static shim  {}", static_out.display());
    Ok(())
}

/// The tag of both images: the shim crate's version, from its `Cargo.toml`.
fn shim_version() -> Result<String> {
    let manifest = workspace_root().join("host-shim/Cargo.toml");
    let text =
        fs::read_to_string(&manifest).with_context(|| format!("cannot read {}", manifest.display()))?;
    text.lines()
        .find_map(|line| line.strip_prefix("version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .map(str::to_owned)
        .with_context(|| format!("{} has no `version = \"…\"` line", manifest.display()))
}

fn host_triple() -> Result<String> {
    let verbose = cmd::probe(cmd::clean("rustc").arg("-vV")).context("`rustc -vV` failed")?;
    verbose
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .map(str::to_owned)
        .context("`rustc -vV` printed no `host:` line")
}

fn oci_arch(triple: &str) -> Result<&'static str> {
    match triple.split('-').next() {
        Some("x86_64") => Ok("amd64"),
        Some("aarch64") => Ok("arm64"),
        _ => bail!("no OCI architecture known for the host {triple}"),
    }
}

/// Build the shim statically linked and check that it is.
fn static_shim(triple: &str) -> Result<PathBuf> {
    let var = format!("CARGO_TARGET_{}_RUSTFLAGS", triple.to_uppercase().replace(['-', '.'], "_"));
    let mut build: Command = cmd::cargo();
    build.args(["build", "--release", "-p", "sluice-shim", "--target", triple]);
    build.env(var, "-C target-feature=+crt-static");
    cmd::run(&mut build)?;
    let binary = workspace_root().join("target").join(triple).join("release/sluice");
    if has_interpreter(&read(&binary)?)? {
        bail!("{} is dynamically linked (it names an ELF interpreter) despite +crt-static", binary.display());
    }
    Ok(binary)
}

/// Whether a 64-bit little-endian ELF file has a `PT_INTERP` program header,
/// i.e. needs the dynamic loader. A static (or static-pie) binary has none.
pub(crate) fn has_interpreter(elf: &[u8]) -> Result<bool> {
    const PT_INTERP: u32 = 3;
    let field = |at: usize, len: usize| -> Result<u64> {
        let bytes = elf.get(at..at + len).context("truncated ELF header")?;
        Ok(bytes.iter().rev().fold(0u64, |acc, b| acc << 8 | u64::from(*b)))
    };
    if elf.get(..6) != Some(&b"\x7fELF\x02\x01"[..]) {
        bail!("not a 64-bit little-endian ELF file");
    }
    let (phoff, phentsize, phnum) = (field(0x20, 8)?, field(0x36, 2)?, field(0x38, 2)?);
    for i in 0..phnum {
        let at = usize::try_from(phoff + i * phentsize).context("ELF offset out of range")?;
        if field(at, 4)? == u64::from(PT_INTERP) {
            return Ok(true);
        }
    }
    Ok(false)
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}
