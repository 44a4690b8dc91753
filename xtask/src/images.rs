//! What Sluice's two images hold, over `oci.rs`:
//!
//! - **`sluice-wasm`**: the filter in Istio's *compat* Wasm image format, which
//!   Istio's `WasmPlugin` and Envoy Gateway's `EnvoyExtensionPolicy` both
//!   pull: a standard OCI image whose one `tar+gzip` layer holds
//!   `plugin.wasm`, annotated `module.wasm.image/variant: compat`.
//! - **`sluice-shim`**: the static shim binary as the only layer of an image
//!   from scratch, run as `/sluice serve` by a non-root user, port 8181.
//!
//! Each is written as an OCI layout directory and an `oci-archive` tar under
//! one output directory, tagged with the workspace's version.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::json;

use crate::oci::{self, Blob, Entry, Image};

/// The shim's port, as the manifests in `deploy/` expect it.
pub(crate) const SHIM_PORT: u16 = 8181;
/// The user the shim runs as: the conventional "nonroot" uid and gid.
pub(crate) const SHIM_USER: &str = "65532:65532";
/// The annotation that marks Istio's compat Wasm variant.
pub(crate) const WASM_VARIANT: (&str, &str) = ("module.wasm.image/variant", "compat");

/// One image written: its name, tag, layout directory, archive and manifest digest.
pub(crate) struct Written {
    pub name: &'static str,
    pub tag: String,
    pub layout: PathBuf,
    pub archive: PathBuf,
    pub digest: String,
}

/// Write both images under `out`; `arch` is the shim's OCI architecture
/// (`amd64`, `arm64`).
pub(crate) fn write_all(wasm: &[u8], shim: &[u8], arch: &str, tag: &str, out: &Path) -> Result<Vec<Written>> {
    std::fs::create_dir_all(out)?;
    let images = [("sluice-wasm", filter_image(wasm)?), ("sluice-shim", shim_image(shim, arch)?)];
    let mut written = Vec::new();
    for (name, image) in images {
        let layout = out.join(name);
        let archive = out.join(format!("{name}.oci.tar"));
        let digest = oci::write(&image, tag, &layout, &archive)?;
        written.push(Written { name, tag: tag.to_owned(), layout, archive, digest });
    }
    Ok(written)
}

/// The filter as a compat Wasm image.
pub(crate) fn filter_image(wasm: &[u8]) -> Result<Image> {
    let layer = oci::tar(&[Entry { path: "plugin.wasm", mode: 0o644, bytes: wasm }])?;
    let config = json!({
        "architecture": "wasm",
        "os": "wasip1",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [oci::sha256(&layer)]},
    });
    Ok(Image {
        config: Blob::json(oci::CONFIG, &config)?,
        layers: vec![Blob::new(oci::LAYER_TAR_GZIP, oci::gzip(&layer)?)],
        annotations: BTreeMap::from([(WASM_VARIANT.0.to_owned(), WASM_VARIANT.1.to_owned())]),
    })
}

/// The shim from scratch: `/sluice` and nothing else.
pub(crate) fn shim_image(binary: &[u8], arch: &str) -> Result<Image> {
    let layer = oci::tar(&[Entry { path: "sluice", mode: 0o755, bytes: binary }])?;
    let port = format!("{SHIM_PORT}/tcp");
    let config = json!({
        "architecture": arch,
        "os": "linux",
        "config": {
            "User": SHIM_USER,
            "ExposedPorts": {port: {}},
            "Entrypoint": ["/sluice", "serve"],
            "Cmd": ["--listen", format!("0.0.0.0:{SHIM_PORT}")],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [oci::sha256(&layer)]},
    });
    Ok(Image {
        config: Blob::json(oci::CONFIG, &config)?,
        layers: vec![Blob::new(oci::LAYER_TAR_GZIP, oci::gzip(&layer)?)],
        annotations: BTreeMap::new(),
    })
}
