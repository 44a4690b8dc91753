//! `cargo xtask package`'s images and the manifests in `deploy/`, read back
//! by other tools than the ones that wrote them.
//!
//! - The images (written by xtask's own `images`/`oci` modules into a temp
//!   dir, from stand-in bytes: the format does not depend on them) are read
//!   by `skopeo inspect`, as a layout and as an `oci-archive`, and checked
//!   here too: every digest and size, the media types each platform needs,
//!   `plugin.wasm` in the filter's layer, the shim's entrypoint, user and
//!   port; writing twice gives the same digests.
//! - Every YAML document under `deploy/` parses; every Sluice policy inside
//!   (ConfigMap data, WasmPlugin `pluginConfig`, EnvoyExtensionPolicy wasm
//!   `config`) passes `sluice_policies::parse`; every Envoy cluster an
//!   EnvoyPatchPolicy adds passes `envoy --mode validate`.
//!
//! skopeo and Envoy are installed when missing (`deps.rs`); if they cannot
//! be, the test fails saying so.

#![allow(dead_code)]

#[path = "../src/apt.rs"]
mod apt;
#[path = "../src/cmd.rs"]
mod cmd;
#[path = "../src/deps.rs"]
mod deps;
#[path = "../src/images.rs"]
mod images;
#[path = "../src/oci.rs"]
mod oci;
#[path = "../src/paths.rs"]
mod paths;

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// A stand-in filter: the wasm magic and version, then padding.
const WASM: &[u8] = b"\0asm\x01\0\0\0stand-in filter for the image test";
const SHIM: &[u8] = b"\x7fELFstand-in shim for the image test";

fn skopeo_inspect(skopeo: &Path, reference: &str, raw: bool) -> Value {
    let mut cmd = Command::new(skopeo);
    cmd.arg("inspect");
    if raw {
        cmd.arg("--raw");
    }
    let out = cmd.arg(reference).output().expect("skopeo runs");
    assert!(
        out.status.success(),
        "skopeo inspect {reference} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("skopeo prints JSON")
}

fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    fs::read(layout.join("blobs/sha256").join(hex)).expect("the blob is in the layout")
}

/// Read a descriptor's blob and check its digest and size.
fn checked(layout: &Path, descriptor: &Value) -> Vec<u8> {
    let digest = descriptor["digest"].as_str().expect("a digest");
    let bytes = blob(layout, digest);
    assert_eq!(oci::sha256(&bytes), digest, "blob content matches its digest");
    assert_eq!(descriptor["size"].as_u64(), Some(bytes.len() as u64), "size of {digest}");
    bytes
}

/// The one file of a `tar+gzip` layer.
fn only_file(layer: &[u8]) -> (String, u32, Vec<u8>) {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(layer));
    let mut files = Vec::new();
    for entry in archive.entries().expect("a tar") {
        let mut entry = entry.expect("a tar entry");
        let path = entry.path().expect("a path").to_string_lossy().into_owned();
        let mode = entry.header().mode().expect("a mode");
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).expect("readable");
        files.push((path, mode, bytes));
    }
    assert_eq!(files.len(), 1, "one file in the layer: {:?}", files.iter().map(|f| &f.0).collect::<Vec<_>>());
    files.remove(0)
}

/// Check one written image with skopeo and by hand; returns its config.
fn inspect(skopeo: &Path, image: &images::Written) -> (Value, Value, Vec<u8>) {
    let layout = &image.layout;
    for reference in [
        format!("oci:{}:{}", layout.display(), image.tag),
        format!("oci-archive:{}:{}", image.archive.display(), image.tag),
    ] {
        let seen = skopeo_inspect(skopeo, &reference, false);
        println!(
            "{reference}: Digest {} Os {} Architecture {} Layers {}",
            seen["Digest"], seen["Os"], seen["Architecture"], seen["Layers"]
        );
        assert_eq!(seen["Digest"].as_str(), Some(image.digest.as_str()), "{reference}");
        assert_eq!(seen["Layers"].as_array().map(Vec::len), Some(1), "{reference}");
    }

    let index: Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).expect("index.json")).expect("JSON");
    assert_eq!(index["mediaType"], oci::INDEX);
    let oci_layout: Value =
        serde_json::from_slice(&fs::read(layout.join("oci-layout")).expect("oci-layout")).expect("JSON");
    assert_eq!(oci_layout["imageLayoutVersion"], "1.0.0");
    let entry = &index["manifests"][0];
    assert_eq!(entry["mediaType"], oci::MANIFEST);
    assert_eq!(entry["annotations"][oci::REF_NAME].as_str(), Some(image.tag.as_str()));
    assert_eq!(entry["digest"].as_str(), Some(image.digest.as_str()));
    let manifest: Value = serde_json::from_slice(&checked(layout, entry)).expect("manifest JSON");
    let raw = skopeo_inspect(skopeo, &format!("oci:{}:{}", layout.display(), image.tag), true);
    assert_eq!(raw, manifest, "skopeo reads the manifest we wrote");

    assert_eq!(manifest["mediaType"], oci::MANIFEST);
    assert_eq!(manifest["config"]["mediaType"], oci::CONFIG);
    let config: Value = serde_json::from_slice(&checked(layout, &manifest["config"])).expect("config JSON");
    let layer_desc = &manifest["layers"][0];
    assert_eq!(layer_desc["mediaType"], oci::LAYER_TAR_GZIP);
    let layer = checked(layout, layer_desc);
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(&layer[..]).read_to_end(&mut tar).expect("gzip");
    assert_eq!(config["rootfs"]["diff_ids"][0].as_str(), Some(oci::sha256(&tar).as_str()), "diff_id");

    // The archive holds the layout's files, byte for byte.
    let mut archive = tar::Archive::new(fs::File::open(&image.archive).expect("archive"));
    let mut in_archive = BTreeMap::new();
    for entry in archive.entries().expect("a tar") {
        let mut entry = entry.expect("entry");
        if entry.header().entry_type().is_file() {
            let path = entry.path().expect("path").to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).expect("readable");
            in_archive.insert(path, bytes);
        }
    }
    assert_eq!(in_archive.get("index.json"), Some(&fs::read(layout.join("index.json")).expect("index")));
    assert!(in_archive.contains_key(&format!("blobs/sha256/{}", image.digest.trim_start_matches("sha256:"))));
    (manifest, config, layer)
}

/// Both images, through skopeo and by hand; and reproducible.
#[test]
fn images_are_valid_oci_and_reproducible() {
    let skopeo = deps::ensure_skopeo().unwrap_or_else(|err| {
        panic!("skopeo is needed to read the images back and could not be installed: {err:#}")
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let written =
        images::write_all(WASM, SHIM, "amd64", "0.1.0", &dir.path().join("a")).expect("images written");
    let again =
        images::write_all(WASM, SHIM, "amd64", "0.1.0", &dir.path().join("b")).expect("images written");
    for (one, two) in written.iter().zip(&again) {
        assert_eq!(one.digest, two.digest, "{} is reproducible", one.name);
        assert_eq!(
            fs::read(&one.archive).ok(),
            fs::read(&two.archive).ok(),
            "{}'s archive is reproducible",
            one.name
        );
    }

    let wasm = written.iter().find(|w| w.name == "sluice-wasm").expect("the filter image");
    let (manifest, config, layer) = inspect(&skopeo, wasm);
    assert_eq!(
        manifest["annotations"][images::WASM_VARIANT.0],
        images::WASM_VARIANT.1,
        "Istio's compat variant"
    );
    assert_eq!(config["architecture"], "wasm");
    let (path, _, bytes) = only_file(&layer);
    assert_eq!((path.as_str(), bytes.as_slice()), ("plugin.wasm", WASM));

    let shim = written.iter().find(|w| w.name == "sluice-shim").expect("the shim image");
    let (_, config, layer) = inspect(&skopeo, shim);
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/sluice", "serve"]));
    assert_eq!(config["config"]["User"], images::SHIM_USER);
    assert!(!config["config"]["User"].as_str().unwrap_or("0").starts_with("0"), "not root");
    assert!(config["config"]["ExposedPorts"].get(format!("{}/tcp", images::SHIM_PORT)).is_some());
    let (path, mode, bytes) = only_file(&layer);
    assert_eq!((path.as_str(), mode & 0o777, bytes.as_slice()), ("sluice", 0o755, SHIM));
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|err| panic!("cannot read {}: {err}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(path);
        }
    }
}

/// Every YAML document of every file under `deploy/`, as JSON values.
fn documents() -> Vec<(PathBuf, Value)> {
    let mut files = Vec::new();
    yaml_files(&paths::workspace_root().join("deploy"), &mut files);
    files.sort();
    assert!(!files.is_empty(), "deploy/ holds manifests");
    let mut docs = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).expect("readable");
        for doc in serde_norway::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|err| panic!("{} does not parse as YAML: {err}", file.display()));
            if !value.is_null() {
                docs.push((file.clone(), value));
            }
        }
    }
    docs
}

fn policy(what: &str, text: &str) -> sluice_policies::Document {
    sluice_policies::parse(text).unwrap_or_else(|err| panic!("{what}: the policy does not parse: {err}"))
}

/// `envoy --mode validate` on a bootstrap holding just `cluster`.
fn validate_cluster(envoy: &Path, what: &str, cluster: &Value) {
    let dir = tempfile::tempdir().expect("temp dir");
    let bootstrap = serde_json::json!({"static_resources": {"clusters": [cluster]}});
    let file = dir.path().join("envoy.json");
    fs::write(&file, serde_json::to_vec(&bootstrap).expect("JSON")).expect("write");
    let out = Command::new(envoy)
        .args(["--mode", "validate", "--log-level", "error", "-c"])
        .arg(&file)
        .output()
        .expect("envoy runs");
    assert!(
        out.status.success(),
        "{what}: envoy --mode validate refused the cluster: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every manifest parses, every policy inside is valid and names a cluster
/// the platform has, every Envoy cluster added is valid Envoy config.
#[test]
fn deploy_manifests_parse_and_their_policies_validate() {
    let envoy =
        deps::ensure_envoy().unwrap_or_else(|err| panic!("Envoy is needed to validate clusters: {err:#}"));
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut added_clusters = Vec::new();
    let mut eg_clusters = Vec::new();
    for (file, doc) in documents() {
        let kind =
            doc["kind"].as_str().unwrap_or_else(|| panic!("{}: a document without kind", file.display()));
        let what = format!("{} ({kind} {})", file.display(), doc["metadata"]["name"]);
        match kind {
            "ConfigMap" => {
                for (key, text) in doc["data"].as_object().into_iter().flatten() {
                    if key.ends_with(".json") {
                        policy(&what, text.as_str().expect("a string"));
                        *seen.entry("ConfigMap policy").or_default() += 1;
                    }
                }
            }
            "WasmPlugin" => {
                assert!(
                    doc["spec"]["url"].as_str().is_some_and(|u| u.starts_with("oci://")),
                    "{what}: an OCI url"
                );
                let document = policy(&what, &doc["spec"]["pluginConfig"].to_string());
                let cluster = &document.shim.cluster;
                assert!(
                    cluster.starts_with("outbound|8181||"),
                    "{what}: Istio's cluster for the shim, not {cluster}"
                );
                *seen.entry("WasmPlugin").or_default() += 1;
            }
            "EnvoyExtensionPolicy" => {
                for wasm in doc["spec"]["wasm"].as_array().into_iter().flatten() {
                    assert_eq!(wasm["code"]["type"], "Image", "{what}: loads the image");
                    let document = policy(&what, &wasm["config"].to_string());
                    eg_clusters.push((what.clone(), document.shim.cluster.clone()));
                    *seen.entry("EnvoyExtensionPolicy").or_default() += 1;
                }
            }
            "EnvoyPatchPolicy" => {
                for patch in doc["spec"]["jsonPatches"].as_array().into_iter().flatten() {
                    if patch["type"] == "type.googleapis.com/envoy.config.cluster.v3.Cluster" {
                        let cluster = &patch["operation"]["value"];
                        validate_cluster(&envoy, &what, cluster);
                        added_clusters.push(cluster["name"].as_str().unwrap_or_default().to_owned());
                    }
                }
            }
            "Deployment" => {
                let container = &doc["spec"]["template"]["spec"]["containers"][0];
                assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/healthz", "{what}: readiness");
                assert!(container["resources"]["limits"].is_object(), "{what}: limits");
                assert!(container["resources"]["requests"].is_object(), "{what}: requests");
                let args: Vec<&str> =
                    container["args"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                assert!(args.contains(&"--policy"), "{what}: passes the policy to the shim");
                *seen.entry("Deployment").or_default() += 1;
            }
            _ => {}
        }
    }
    for (what, cluster) in &eg_clusters {
        assert!(
            added_clusters.contains(cluster),
            "{what}: the policy names {cluster}, which no EnvoyPatchPolicy adds"
        );
    }
    for kind in ["ConfigMap policy", "WasmPlugin", "EnvoyExtensionPolicy", "Deployment"] {
        assert!(seen.contains_key(kind), "deploy/ has a {kind}: {seen:?}");
    }
}
