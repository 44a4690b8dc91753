//! The imports of `src/` run one way, as the crate root's `# Layout` draws
//! them: a module names only modules of its own layer or of the layers
//! before it (model, algorithm, wire, document, tools). Read from disk:
//! every `crate::<module>` path, and every name the root re-exports
//! (`crate::Limit` is `limit`'s), in code and in doc links alike, tests
//! included.

use std::fs;
use std::path::Path;

/// The layers, first to last, and their modules.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "model",
        &[
            "invalid",
            "units",
            "calendar",
            "body",
            "request",
            "cost",
            "response",
            "load",
            "condition",
            "tree",
            "key",
            "class",
            "limit",
            "llm",
            "wait",
            "leased",
            "shed",
            "feedback",
            "face",
        ],
    ),
    ("algorithm", &["algorithm"]),
    ("wire", &["wire"]),
    ("document", &["document", "bounds", "error", "plan", "rlqs", "descriptor_limit", "descriptor_metric"]),
    ("tools", &["replay", "schema"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, modules)| modules.contains(&module))
}

/// The names the root re-exports, each with its module: `pub use m::{A, B};`.
fn root_names(lib: &str) -> Vec<(String, String)> {
    let mut names = Vec::new();
    for line in lib.lines() {
        let Some(rest) = line.strip_prefix("pub use ") else { continue };
        let rest = rest.trim_end_matches(';');
        let Some((module, items)) = rest.split_once("::") else { continue };
        let items = items.trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            names.push((item.to_string(), module.to_string()));
        }
    }
    names
}

/// The identifier at the start of `text`.
fn ident(text: &str) -> &str {
    let end = text.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(text.len());
    &text[..end]
}

/// The modules `source` names through `crate::`.
fn modules_named(source: &str, roots: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in source.match_indices("crate::") {
        let rest = &source[at + "crate::".len()..];
        let mut names = Vec::new();
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            names.extend(group.split(',').map(|n| ident(n.trim())));
        } else {
            names.push(ident(rest));
        }
        for name in names.into_iter().filter(|n| !n.is_empty()) {
            if layer_of(name).is_some() {
                found.push(name.to_string());
            } else if let Some((_, module)) = roots.iter().find(|(n, _)| n == name) {
                found.push(module.clone());
            }
        }
    }
    found
}

/// The file's module: `src/algorithm/gcra.rs` is `algorithm`'s.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a path").as_os_str().to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).expect("a readable src") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every module is in a layer, and none names a module of a later layer.
#[test]
fn imports_run_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let roots = root_names(&fs::read_to_string(src.join("lib.rs")).expect("lib.rs"));
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in files.iter().filter(|f| !f.ends_with("lib.rs")) {
        let module = module_of(&src, file);
        let Some(own) = layer_of(&module) else {
            panic!("src/{module} is in no layer of tests/layers.rs (and of lib.rs's # Layout)");
        };
        let text = fs::read_to_string(file).expect("a source file");
        for named in modules_named(&text, &roots) {
            let layer = layer_of(&named).expect("a known module");
            if layer > own {
                wrong.push(format!(
                    "{} ({}) names {named} ({})",
                    file.strip_prefix(&src).expect("under src").display(),
                    LAYERS[own].0,
                    LAYERS[layer].0
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the layers:\n{}", wrong.join("\n"));
}
