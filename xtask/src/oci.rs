//! Writing OCI images without a container daemon: content-addressed blobs,
//! an image manifest over them, an image layout directory (`oci-layout`,
//! `index.json`, `blobs/sha256/…`) and the same layout as an `oci-archive`
//! tar. Knows nothing of Sluice: `images.rs` says what goes in.
//!
//! Everything is reproducible: tars carry fixed owners, modes and mtimes
//! (the epoch), gzip headers no time or name, and JSON is written from
//! `serde_json` maps, whose keys come out sorted. The same inputs give the
//! same digests.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub(crate) const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub(crate) const LAYER_TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The annotation that names an image's tag in `index.json`.
pub(crate) const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Bytes with their media type, named by their digest.
pub(crate) struct Blob {
    pub media_type: &'static str,
    pub bytes: Vec<u8>,
}

impl Blob {
    pub(crate) fn new(media_type: &'static str, bytes: Vec<u8>) -> Blob {
        Blob { media_type, bytes }
    }

    pub(crate) fn json(media_type: &'static str, value: &Value) -> Result<Blob> {
        Ok(Blob::new(media_type, serde_json::to_vec(value).context("cannot serialize OCI JSON")?))
    }

    pub(crate) fn digest(&self) -> String {
        sha256(&self.bytes)
    }

    /// The OCI descriptor that points at this blob.
    pub(crate) fn descriptor(&self) -> Value {
        json!({"mediaType": self.media_type, "digest": self.digest(), "size": self.bytes.len()})
    }
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// One image: a config, its layers and the manifest's annotations.
pub(crate) struct Image {
    pub config: Blob,
    pub layers: Vec<Blob>,
    pub annotations: BTreeMap<String, String>,
}

impl Image {
    pub(crate) fn manifest(&self) -> Result<Blob> {
        let mut manifest = json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": self.config.descriptor(),
            "layers": self.layers.iter().map(Blob::descriptor).collect::<Vec<_>>(),
        });
        if !self.annotations.is_empty() {
            manifest["annotations"] = json!(self.annotations);
        }
        Blob::json(MANIFEST, &manifest)
    }
}

/// A file to put in a tar: its path inside, mode and contents.
pub(crate) struct Entry<'a> {
    pub path: &'a str,
    pub mode: u32,
    pub bytes: &'a [u8],
}

/// A tar of `entries` in the order given: owner root, mtime the epoch. A
/// path ending in `/` is a directory.
pub(crate) fn tar(entries: &[Entry<'_>]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_ustar();
        let dir = entry.path.ends_with('/');
        header.set_entry_type(if dir { tar::EntryType::Directory } else { tar::EntryType::Regular });
        header.set_mode(entry.mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_size(if dir { 0 } else { entry.bytes.len() as u64 });
        builder
            .append_data(&mut header, entry.path, if dir { &[][..] } else { entry.bytes })
            .with_context(|| format!("cannot add {} to a tar", entry.path))?;
    }
    builder.into_inner().context("cannot finish a tar")
}

/// gzip with no name and a zero mtime in the header, so it is reproducible.
pub(crate) fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write;
    let mut encoder = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).context("cannot gzip")?;
    encoder.finish().context("cannot gzip")
}

/// The layout's files, by path inside it, for `image` tagged `tag`.
fn layout_files(image: &Image, tag: &str) -> Result<BTreeMap<String, Vec<u8>>> {
    let manifest = image.manifest()?;
    let mut descriptor = manifest.descriptor();
    descriptor["annotations"] = json!({ REF_NAME: tag });
    let index = json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [descriptor]});

    let mut files = BTreeMap::new();
    files.insert("oci-layout".to_owned(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec());
    files.insert("index.json".to_owned(), serde_json::to_vec(&index).context("cannot serialize index.json")?);
    for blob in image.layers.iter().chain([&image.config, &manifest]) {
        let hex = blob.digest().trim_start_matches("sha256:").to_owned();
        files.insert(format!("blobs/sha256/{hex}"), blob.bytes.clone());
    }
    Ok(files)
}

/// Write `image` as an OCI image layout in `dir` (replaced if present) and
/// as an `oci-archive` tar at `archive`. Returns the manifest's digest.
pub(crate) fn write(image: &Image, tag: &str, dir: &Path, archive: &Path) -> Result<String> {
    let files = layout_files(image, tag)?;
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("cannot remove the old {}", dir.display()))?;
    }
    fs::create_dir_all(dir.join("blobs/sha256"))
        .with_context(|| format!("cannot create {}", dir.display()))?;
    for (path, bytes) in &files {
        let out = dir.join(path);
        fs::write(&out, bytes).with_context(|| format!("cannot write {}", out.display()))?;
    }

    let mut entries = vec![
        Entry { path: "blobs/", mode: 0o755, bytes: &[] },
        Entry { path: "blobs/sha256/", mode: 0o755, bytes: &[] },
    ];
    entries.extend(files.iter().map(|(path, bytes)| Entry { path, mode: 0o644, bytes }));
    fs::write(archive, tar(&entries)?).with_context(|| format!("cannot write {}", archive.display()))?;
    Ok(image.manifest()?.digest())
}
