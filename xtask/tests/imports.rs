//! In every crate of the workspace, imports between sibling modules run one
//! way: no module reaches, through `crate::` or `super::` paths, a sibling
//! that reaches back to it, directly or around a loop. A parent and its own
//! children may use each other (a `mod.rs` that dispatches to its children,
//! which use the parent's types); siblings may not. Read from disk, code
//! only: comments and each file's `#[cfg(test)]` tail are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `src/` directory of the workspace's crates (any folder holding a
/// `Cargo.toml` and a `src/`, outside `target/` and `node_modules/`).
fn crate_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
        out.push(dir.join("src"));
    }
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let skip = matches!(name.to_str(), Some("target" | "node_modules" | ".git" | "src"));
        if path.is_dir() && !skip {
            crate_sources(&path, out);
        }
    }
}

/// Each module of a crate and its code.
fn modules(src: &Path) -> BTreeMap<Module, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<Module, String>) {
        let Ok(entries) = fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let Ok(rel) = path.strip_prefix(root) else { continue };
            let mut module: Module =
                rel.with_extension("").iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                module.pop();
            }
            let text = fs::read_to_string(&path).unwrap_or_default();
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let code: Vec<&str> = code.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
            out.insert(module, code.join("\n"));
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// The paths one `use`-like text names, from its start: `a::b::C` is one,
/// and a group `a::{b::C, d::{e, f}}` is expanded to each path in it, so a
/// grouped import of a sibling counts like a plain one.
fn paths_from(rest: &str) -> Vec<Module> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut prefix = Vec::new();
    let mut rest = rest.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let Some(inner) = group_body(group) else { return vec![prefix] };
            return split_top_level(inner)
                .into_iter()
                .flat_map(|item| {
                    paths_from(item).into_iter().map(|tail| {
                        let tail: Module = tail.into_iter().filter(|s| s != "self").collect();
                        prefix.iter().cloned().chain(tail).collect()
                    })
                })
                .collect();
        }
        let name = ident(rest);
        if name.is_empty() {
            return vec![prefix];
        }
        rest = &rest[name.len()..];
        prefix.push(name);
        match rest.strip_prefix("::") {
            Some(r) => rest = r.trim_start(),
            None => return vec![prefix],
        }
    }
}

/// The text of a group up to its matching `}` (the opening `{` already taken).
fn group_body(text: &str) -> Option<&str> {
    let mut depth = 1;
    for (at, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[..at]);
                }
            }
            _ => {}
        }
    }
    None
}

/// A group's items, split at its own commas (not at those of nested groups).
fn split_top_level(text: &str) -> Vec<&str> {
    let (mut items, mut depth, mut from) = (Vec::new(), 0, 0);
    for (at, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&text[from..at]);
                from = at + 1;
            }
            _ => {}
        }
    }
    items.push(&text[from..]);
    items.into_iter().filter(|i| !i.trim().is_empty()).collect()
}

/// The module paths `code` in `module` names: `crate::a::b…` and `super::…`,
/// groups expanded.
fn paths_named(module: &Module, code: &str) -> Vec<Module> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `sluice_crate::`, not `crate::`
        }
        found.extend(paths_from(&code[at + "crate::".len()..]));
    }
    for (at, _) in code.match_indices("super::") {
        if code[..at].ends_with("super::") {
            continue; // counted from the first `super::`
        }
        let mut rest = &code[at..];
        let mut base = module.clone();
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        found.extend(paths_from(rest).into_iter().map(|tail| base.iter().cloned().chain(tail).collect()));
    }
    found
}

/// Edges between sibling modules: `(parent, from, to)`.
fn sibling_edges(modules: &BTreeMap<Module, String>) -> BTreeSet<(Module, String, String)> {
    let mut edges = BTreeSet::new();
    for (module, code) in modules {
        for named in paths_named(module, code) {
            let Some(target) =
                (1..=named.len()).rev().map(|n| named[..n].to_vec()).find(|m| modules.contains_key(m))
            else {
                continue;
            };
            let common = module.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common >= module.len() || common >= target.len() {
                continue; // the module itself, an ancestor or a descendant
            }
            edges.insert((module[..common].to_vec(), module[common].clone(), target[common].clone()));
        }
    }
    edges
}

/// A loop among the siblings of one parent, if any.
fn a_loop(edges: &BTreeSet<(Module, String, String)>) -> Option<(Module, Vec<String>)> {
    let parents: BTreeSet<&Module> = edges.iter().map(|(p, ..)| p).collect();
    for parent in parents {
        let next: BTreeMap<&str, Vec<&str>> =
            edges.iter().filter(|(p, ..)| p == parent).fold(BTreeMap::new(), |mut map, (_, from, to)| {
                map.entry(from.as_str()).or_default().push(to.as_str());
                map
            });
        // Depth-first search for a back edge, keeping the path for the message.
        fn visit<'a>(
            node: &'a str,
            next: &BTreeMap<&'a str, Vec<&'a str>>,
            path: &mut Vec<&'a str>,
            done: &mut BTreeSet<&'a str>,
        ) -> Option<Vec<String>> {
            if let Some(at) = path.iter().position(|n| *n == node) {
                let mut cycle: Vec<String> = path[at..].iter().map(|s| s.to_string()).collect();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            if !done.insert(node) {
                return None;
            }
            path.push(node);
            for &to in next.get(node).into_iter().flatten() {
                if let Some(cycle) = visit(to, next, path, done) {
                    return Some(cycle);
                }
            }
            path.pop();
            None
        }
        let mut done = BTreeSet::new();
        for &start in next.keys() {
            if let Some(cycle) = visit(start, &next, &mut Vec::new(), &mut done) {
                return Some((parent.clone(), cycle));
            }
        }
    }
    None
}

#[test]
fn sibling_modules_import_one_way() {
    let mut sources = Vec::new();
    crate_sources(&workspace(), &mut sources);
    assert!(sources.len() >= 10, "found only {} crates under {}", sources.len(), workspace().display());
    let mut loops = Vec::new();
    for src in &sources {
        if let Some((parent, cycle)) = a_loop(&sibling_edges(&modules(src))) {
            let inside = if parent.is_empty() { "the crate root".to_string() } else { parent.join("::") };
            loops.push(format!("{}: in {inside}: {}", src.display(), cycle.join(" -> ")));
        }
    }
    assert!(loops.is_empty(), "modules that import each other:\n{}", loops.join("\n"));
}

/// The reader itself: a loop through `crate::` and one through `super::`
/// are found, and a parent using its child is not a loop.
#[test]
fn finds_a_loop_between_siblings_only() {
    let module =
        |path: &str, code: &str| (path.split("::").map(String::from).collect::<Module>(), code.to_string());
    let looped: BTreeMap<Module, String> = [
        module("a", "use crate::b::X;"),
        module("b", "use crate::c::Y;"),
        module("c", "fn f() { crate::a::g() }"),
    ]
    .into();
    assert!(a_loop(&sibling_edges(&looped)).is_some());
    let nested: BTreeMap<Module, String> = [
        module("w", "use self::q::A;"),
        module("w::q", "use super::t::B;"),
        module("w::t", "use super::q::A;"),
    ]
    .into();
    assert_eq!(a_loop(&sibling_edges(&nested)).map(|(p, _)| p), Some(vec!["w".to_string()]));
    // A loop hidden in groups: each side names the other inside `super::{…}`.
    let grouped: BTreeMap<Module, String> = [
        module("alg", "mod reserve; mod gcra;"),
        module("alg::reserve", "use super::{\n    gcra, Algorithm,\n};"),
        module("alg::gcra", "use super::{reserve::{Committed, Slot}, State};"),
    ]
    .into();
    assert_eq!(a_loop(&sibling_edges(&grouped)).map(|(p, _)| p), Some(vec!["alg".to_string()]));
    let family: BTreeMap<Module, String> =
        [module("w", "fn f() { q::go() }"), module("w::q", "use super::Waiting;")].into();
    assert!(a_loop(&sibling_edges(&family)).is_none());
}
