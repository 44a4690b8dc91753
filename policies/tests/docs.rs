//! The documentation (`README.md` and `docs/*.md`) against the code: the
//! policy reference names every field and limit type of the schema, every JSON
//! example parses, and every relative link resolves.
//!
//! The rules, kept simple so that a writer can follow them:
//!
//! - **Fields.** A field of the JSON Schema (`policies/schema.json`, the copy
//!   of `sluice schema` that `sluice-shim`'s `cli` test keeps up to date) is
//!   documented when `docs/policy-reference.md` has it as a code span
//!   (`` `ttl` ``), as the last part of a dotted one (`` `leased.ttl` ``), or as
//!   a JSON key (`"ttl":`). A limit type is documented when it appears as a
//!   code span (`` `fixed_window` ``).
//! - **Examples.** Every fenced block whose info string is exactly `json` is a
//!   policy document (an object with `policies`) or one policy (an object with
//!   `limits`, checked as `{"policies": [it]}`), and must parse with
//!   [`sluice_policies::parse`]. A fragment, a deliberately wrong document or
//!   any other JSON takes another info string: `jsonc` or `text`.
//! - **Links.** A link `[text](target)` whose target is not a URL names a file
//!   that exists, relative to the page; a `#fragment` on a Markdown page (or
//!   on its own page) names one of its headings, slugged as GitHub does.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// `README.md` and every page in `docs/`, sorted.
fn pages() -> Vec<PathBuf> {
    let root = workspace();
    let mut pages: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    pages.insert(0, root.join("README.md"));
    pages
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fenced code block: its info string, its first line number (1-based) and its text.
struct Block {
    info: String,
    line: usize,
    text: String,
}

/// The page split into fenced blocks and the prose between them (with line numbers).
fn split(page: &str) -> (Vec<Block>, Vec<(usize, &str)>) {
    let (mut blocks, mut prose) = (Vec::new(), Vec::new());
    let mut open: Option<Block> = None;
    for (i, line) in page.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                open = Some(Block { info: info.trim().to_owned(), line: i + 2, text: String::new() })
            }
            (Some(_), Some(_)) => blocks.extend(open.take()),
            (Some(block), None) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => prose.push((i + 1, line)),
        }
    }
    (blocks, prose)
}

/// Every property name and every limit type (`"type": {"const": ...}`) in the schema.
fn schema_names() -> (BTreeSet<String>, BTreeSet<String>) {
    fn walk(value: &Value, fields: &mut BTreeSet<String>, kinds: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::Object(props)) = map.get("properties") {
                    fields.extend(props.keys().cloned());
                    if let Some(kind) = props.get("type").and_then(|t| t.get("const")).and_then(Value::as_str)
                    {
                        kinds.insert(kind.to_owned());
                    }
                }
                map.values().for_each(|v| walk(v, fields, kinds));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, fields, kinds)),
            _ => {}
        }
    }
    let path = workspace().join("policies/schema.json");
    let schema: Value = serde_json::from_str(&read(&path)).expect("policies/schema.json is JSON");
    let (mut fields, mut kinds) = (BTreeSet::new(), BTreeSet::new());
    walk(&schema, &mut fields, &mut kinds);
    (fields, kinds)
}

/// Every field and limit type the schema accepts is named in the policy
/// reference, so a new field cannot ship undocumented.
#[test]
fn the_policy_reference_names_every_field_and_limit_type() {
    let reference = read(&workspace().join("docs/policy-reference.md"));
    let (fields, kinds) = schema_names();
    assert!(fields.len() > 50 && kinds.len() >= 7, "the schema walk found too little: {fields:?} {kinds:?}");
    let missing: Vec<&String> = fields
        .iter()
        .filter(|f| {
            ![format!("`{f}`"), format!(".{f}`"), format!("\"{f}\":")]
                .iter()
                .any(|form| reference.contains(form))
        })
        .chain(kinds.iter().filter(|k| !reference.contains(&format!("`{k}`"))))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/policy-reference.md does not name these schema fields or limit types: {missing:?}"
    );
}

/// Every ```json block of the README and docs/ is a document or a policy that
/// the real parser accepts, so no example teaches a field that does not exist.
#[test]
fn every_json_example_parses() {
    let mut checked = 0;
    for page in pages() {
        for block in split(&read(&page)).0.into_iter().filter(|b| b.info == "json") {
            let at = format!("{}:{}", page.display(), block.line);
            let value: Value =
                serde_json::from_str(&block.text).unwrap_or_else(|e| panic!("{at}: not JSON: {e}"));
            let document = if value.get("policies").is_some() {
                block.text.clone()
            } else if value.get("limits").is_some() {
                format!("{{\"policies\": [{}]}}", block.text)
            } else {
                panic!("{at}: a ```json block must be a document or a policy; mark fragments ```jsonc")
            };
            if let Err(err) = sluice_policies::parse(&document) {
                panic!("{at}: the example does not parse: {err}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} JSON examples found");
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(page: &str) -> BTreeSet<String> {
    split(page)
        .1
        .iter()
        .filter_map(|(_, line)| line.strip_prefix('#'))
        .map(|h| slug(h.trim_start_matches('#')))
        .collect()
}

/// Every relative link and image between the pages points at a file that
/// exists, and at a heading that exists, so moving a section breaks a test,
/// not a reader's click.
#[test]
fn relative_links_resolve() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = read(&page);
        for (line, prose) in split(&text).1 {
            for target in prose.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
                let path = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
                let ok = path.exists()
                    && (fragment.is_empty()
                        || !file.is_empty() && !file.ends_with(".md")
                        || anchors(&read(&path)).contains(fragment));
                if !ok {
                    broken.push(format!("{}:{line}: {target}", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "links that do not resolve:\n{}", broken.join("\n"));
}
