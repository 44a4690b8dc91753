//! `cargo xtask docs`: draws `docs/architecture.svg` from the workspace itself,
//! so the picture cannot drift from the code.
//!
//! Two parts, both plain SVG (no graphviz): the workspace's crates in layers,
//! with an arrow from each crate to each crate it depends on by path (solid for
//! normal dependencies, dashed for dev-dependencies), read from
//! `cargo metadata`; and below them the phases of a request's flow in their
//! declared order, with their doc comment (where the transitions are
//! written), read from `enum Phase` under `core/src/`. Everything is sorted,
//! so the same workspace always gives the same bytes, and a test fails when
//! the committed file is stale.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::{cmd, paths};

/// Where the picture goes, from the workspace root.
const SVG: &str = "docs/architecture.svg";

/// The phases the flow is being built with, drawn until `core/` exists.
const PLANNED_PHASES: &[&str] =
    &["Matching", "Checking", "Waiting", "Admitted", "Streaming", "Settling", "Done", "Refused", "Failed"];
const PLANNED_SUMMARY: &str =
    "Matching → Checking → Waiting → Admitted → Streaming → Settling → Done, plus Refused and Failed.";

// Layout, in pixels.
const CHAR_W: usize = 7;
const BOX_H: usize = 40;
const GAP_X: usize = 24;
const ROW_H: usize = 90;
const MARGIN: usize = 20;

/// Write `docs/architecture.svg`.
pub(crate) fn run() -> Result<()> {
    let root = paths::workspace_root();
    let svg = render(&root)?;
    let path = root.join(SVG);
    fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// The whole picture for the workspace at `root`.
fn render(root: &Path) -> Result<String> {
    let graph = crate_graph(root)?;
    let phases = phases(root)?;
    Ok(draw(&graph, &phases))
}

/// A crate in the picture: its package name and its directory.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Crate {
    name: String,
    dir: String,
}

/// A path dependency: from the crate that depends to the one it depends on.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    from: String,
    to: String,
    dev: bool,
}

struct Graph {
    crates: Vec<Crate>,
    edges: Vec<Edge>,
}

/// The workspace's crates and their path dependencies, from `cargo metadata`.
fn crate_graph(root: &Path) -> Result<Graph> {
    let out = cmd::cargo()
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("could not start `cargo metadata`")?;
    if !out.status.success() {
        bail!("`cargo metadata` failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let meta: Value = serde_json::from_slice(&out.stdout).context("reading `cargo metadata`")?;
    let root_dir = meta["workspace_root"].as_str().map(PathBuf::from).unwrap_or_else(|| root.to_path_buf());
    let packages = meta["packages"].as_array().context("`cargo metadata` has no packages")?;

    let mut crates = Vec::new();
    for package in packages {
        let name = package["name"].as_str().unwrap_or_default().to_owned();
        let manifest = Path::new(package["manifest_path"].as_str().unwrap_or_default());
        let dir = manifest.parent().and_then(|d| d.strip_prefix(&root_dir).ok()).unwrap_or(Path::new(""));
        crates.push(Crate { name, dir: format!("{}/", dir.display()) });
    }
    let names: BTreeSet<&str> = crates.iter().map(|c| c.name.as_str()).collect();

    // One edge per pair: a crate that is both a normal and a dev-dependency is drawn solid.
    let mut kinds: BTreeMap<(String, String), bool> = BTreeMap::new();
    for package in packages {
        let from = package["name"].as_str().unwrap_or_default();
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let to = dep["name"].as_str().unwrap_or_default();
            if dep["path"].is_null() || to == from || !names.contains(to) {
                continue;
            }
            let dev = dep["kind"].as_str() == Some("dev");
            let entry = kinds.entry((from.to_owned(), to.to_owned())).or_insert(dev);
            *entry &= dev;
        }
    }
    let edges = kinds.into_iter().map(|((from, to), dev)| Edge { from, to, dev }).collect();
    crates.sort();
    Ok(Graph { crates, edges })
}

/// The flow's phases as the picture shows them.
struct Phases {
    /// The variants, in declaration order.
    names: Vec<String>,
    /// Where they were read.
    source: String,
    /// The enum's doc comment, where the transitions are written.
    summary: String,
}

/// The flow's phases from `enum Phase` under `core/src/`, or the planned ones
/// while there is no `core/`.
fn phases(root: &Path) -> Result<Phases> {
    let core = root.join("core/src");
    if !core.is_dir() {
        return Ok(Phases {
            names: PLANNED_PHASES.iter().map(|p| p.to_string()).collect(),
            source: "planned: core/ does not exist yet".to_owned(),
            summary: PLANNED_SUMMARY.to_owned(),
        });
    }
    for file in rust_files(&core)? {
        let text = fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        if let Some(names) = enum_variants(&text, "Phase") {
            let source = file.strip_prefix(root).unwrap_or(&file).display().to_string();
            return Ok(Phases { names, source, summary: enum_summary(&text, "Phase") });
        }
    }
    bail!("no `enum Phase` in any file under {}", core.display())
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut entries: Vec<PathBuf> =
        fs::read_dir(dir)?.map(|entry| entry.map(|e| e.path())).collect::<Result<_, _>>()?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files.extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    Ok(files)
}

/// The variant names of `enum NAME { ... }` in `source`: the identifiers that
/// start each item at the enum's own brace depth, skipping comments,
/// attributes and any fields a variant carries.
fn enum_variants(source: &str, name: &str) -> Option<Vec<String>> {
    let code: String =
        source.lines().map(|line| line.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let start = code.find(&format!("enum {name} "))?;
    let body = &code[start + code[start..].find('{')? + 1..];
    let mut variants = Vec::new();
    let (mut depth, mut expecting) = (0usize, true);
    let mut ident = String::new();
    for c in body.chars() {
        let word = c.is_alphanumeric() || c == '_';
        if depth == 0 && !word && !ident.is_empty() {
            variants.push(std::mem::take(&mut ident));
            expecting = false;
        }
        match c {
            '{' | '(' | '[' => depth += 1,
            '}' if depth == 0 => break,
            '}' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => expecting = true,
            '#' if depth == 0 => {} // an attribute: its `[...]` is skipped by depth
            c if depth == 0 && expecting && word => ident.push(c),
            _ => {}
        }
    }
    if !ident.is_empty() {
        variants.push(ident);
    }
    Some(variants)
}

/// The doc comment above `enum NAME` on one line, without backticks;
/// attributes between the two are skipped.
fn enum_summary(source: &str, name: &str) -> String {
    let lines: Vec<&str> = source.lines().map(str::trim).collect();
    let Some(at) = lines.iter().position(|l| l.contains(&format!("enum {name} "))) else {
        return String::new();
    };
    let mut doc: Vec<&str> = lines[..at]
        .iter()
        .rev()
        .skip_while(|l| l.starts_with("#["))
        .take_while(|l| l.starts_with("///"))
        .map(|l| l.trim_start_matches('/').trim())
        .collect();
    doc.reverse();
    doc.join(" ").split_whitespace().collect::<Vec<_>>().join(" ").replace('`', "")
}

/// `text` cut into lines of at most `width` characters, at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    lines
}

/// A box's top-left corner and size.
#[derive(Clone, Copy)]
struct Rect {
    x: usize,
    y: usize,
    w: usize,
}

impl Rect {
    fn top(self) -> (usize, usize) {
        (self.x + self.w / 2, self.y)
    }
    fn bottom(self) -> (usize, usize) {
        (self.x + self.w / 2, self.y + BOX_H)
    }
}

fn box_width(label: &str) -> usize {
    label.chars().count() * CHAR_W + 20
}

/// Each crate's layer: one more than its deepest dependency's, dev ones
/// included, so a test crate sits above what it tests. Cargo allows a cycle
/// through a dev-dependency: the crate being placed counts as layer 0 to the
/// crates it reaches, and the back edge points up.
fn layers(graph: &Graph) -> BTreeMap<&str, usize> {
    fn depth<'a>(name: &'a str, graph: &'a Graph, layer: &mut BTreeMap<&'a str, usize>) -> usize {
        if let Some(&d) = layer.get(name) {
            return d;
        }
        layer.insert(name, 0);
        let d = graph
            .edges
            .iter()
            .filter(|e| e.from == name)
            .map(|e| depth(&e.to, graph, layer) + 1)
            .max()
            .unwrap_or(0);
        layer.insert(name, d);
        d
    }
    let mut layer = BTreeMap::new();
    for c in &graph.crates {
        depth(&c.name, graph, &mut layer);
    }
    layer
}

/// The SVG: crates in layers (a crate above everything it depends on), then the phases.
fn draw(graph: &Graph, phases: &Phases) -> String {
    let layer = layers(graph);
    let top = layer.values().copied().max().unwrap_or(0);
    let rows: Vec<Vec<&Crate>> = (0..=top)
        .rev()
        .map(|l| graph.crates.iter().filter(|c| layer[c.name.as_str()] == l).collect())
        .collect();

    let row_width = |labels: &[usize]| labels.iter().sum::<usize>() + GAP_X * labels.len().saturating_sub(1);
    let label = |c: &Crate| format!("{} ({})", c.name, c.dir);
    let phase_widths: Vec<usize> = phases.names.iter().map(|p| box_width(p)).collect();
    let width = rows
        .iter()
        .map(|row| row_width(&row.iter().map(|c| box_width(&label(c))).collect::<Vec<_>>()))
        .chain([row_width(&phase_widths)])
        .max()
        .unwrap_or(0)
        + 2 * MARGIN;

    let mut rects: BTreeMap<&str, Rect> = BTreeMap::new();
    let mut boxes = String::new();
    let mut y = MARGIN + 20;
    for row in &rows {
        let widths: Vec<usize> = row.iter().map(|c| box_width(&label(c))).collect();
        let mut x = (width - row_width(&widths)) / 2;
        for (c, w) in row.iter().zip(widths) {
            let rect = Rect { x, y, w };
            rects.insert(&c.name, rect);
            push_box(&mut boxes, rect, &label(c), "#eef3fb");
            x += w + GAP_X;
        }
        y += ROW_H;
    }

    let mut arrows = String::new();
    for e in &graph.edges {
        let (Some(&from), Some(&to)) = (rects.get(e.from.as_str()), rects.get(e.to.as_str())) else {
            continue;
        };
        let dash = if e.dev { r#" stroke-dasharray="5,4""# } else { "" };
        // A dev-dependency may point up a layer: leave and enter on the facing sides.
        let ((x1, y1), (x2, y2)) =
            if to.y < from.y { (from.top(), to.bottom()) } else { (from.bottom(), to.top()) };
        let _ = writeln!(
            arrows,
            r##"<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#556"{dash} marker-end="url(#arrow)"/>"##
        );
    }

    // The phases in declared order; their doc comment says how they follow each other.
    let phases_y = y + 30;
    let mut text = String::new();
    let _ = writeln!(
        text,
        r#"<text x="{MARGIN}" y="{}" font-weight="bold">Workspace crates (solid: dependency, dashed: dev-dependency)</text>"#,
        MARGIN + 5
    );
    let _ = writeln!(
        text,
        r#"<text x="{MARGIN}" y="{}" font-weight="bold">A request's flow: its phases ({})</text>"#,
        phases_y - 10,
        escape(&phases.source)
    );
    let mut x = (width - row_width(&phase_widths)) / 2;
    for (phase, w) in phases.names.iter().zip(phase_widths) {
        push_box(&mut boxes, Rect { x, y: phases_y, w }, phase, "#eefbf0");
        x += w + GAP_X;
    }
    let mut caption_y = phases_y + BOX_H + 20;
    for line in wrap(&phases.summary, (width - 2 * MARGIN) / CHAR_W) {
        let _ = writeln!(text, r#"<text x="{MARGIN}" y="{caption_y}">{}</text>"#, escape(&line));
        caption_y += 16;
    }
    let height = caption_y + MARGIN;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    svg.push_str(concat!(
        "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\">",
        "<path d=\"M0,0 L10,5 L0,10 z\" fill=\"#556\"/></marker></defs>\n"
    ));
    let _ = writeln!(svg, r#"<rect width="{width}" height="{height}" fill="white"/>"#);
    svg.push_str(&text);
    svg.push_str(&arrows);
    svg.push_str(&boxes);
    svg.push_str("</svg>\n");
    svg
}

fn push_box(out: &mut String, r: Rect, label: &str, fill: &str) {
    let _ = writeln!(
        out,
        r##"<rect x="{}" y="{}" width="{}" height="{BOX_H}" rx="6" fill="{fill}" stroke="#334"/><text x="{}" y="{}" text-anchor="middle">{}</text>"##,
        r.x,
        r.y,
        r.w,
        r.x + r.w / 2,
        r.y + BOX_H / 2 + 4,
        escape(label)
    );
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed picture is the one the workspace draws now: a crate,
    /// a dependency or a phase added without `cargo xtask docs` fails here.
    #[test]
    fn architecture_svg_is_fresh() {
        let root = paths::workspace_root();
        let drawn = render(&root).expect("drawing the architecture");
        let committed = fs::read_to_string(root.join(SVG)).unwrap_or_default();
        assert!(drawn == committed, "docs/architecture.svg is stale: run cargo xtask docs");
    }

    /// Variants are read at the enum's own depth: comments, attributes and a
    /// variant's fields do not become phases.
    #[test]
    fn reads_the_variants_of_an_enum() {
        let source = "/// doc\n#[derive(Debug)]\npub enum Phase {\n    // the start\n    Matching,\n    \
                      #[allow(dead_code)]\n    Waiting { until: Instant, slot: (u64, u64) },\n    Refused(Reply),\n    Done,\n}\n\
                      enum Other { A }";
        assert_eq!(enum_variants(source, "Phase").unwrap(), ["Matching", "Waiting", "Refused", "Done"]);
    }

    /// The caption is the enum's doc comment on one line: the transitions
    /// its authors wrote down, kept beside the code.
    #[test]
    fn reads_the_enum_doc() {
        let source = "/// Where it stands.\n///\n/// `A → B`, then\n/// `→ C`.\n#[derive(Debug)]\npub enum Phase {\n A,\n}";
        assert_eq!(enum_summary(source, "Phase"), "Where it stands. A → B, then → C.");
    }
}
