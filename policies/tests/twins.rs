//! Every entry script in `lua/scripts/` has its Rust twin in this crate and
//! a test that runs it, named in one table: a script added without a row, a
//! row naming a twin or a test that is not there, or a test that never
//! mentions its script, fails here before it can drift unseen.
//!
//! The `lua/` tree and the test files are read from disk. A test file is
//! looked for in the `tests/` of each crate that holds script tests, under
//! its old and new names, so the table survives the crates moving.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// One entry script, its Rust twins (files of this crate) and the test that
/// holds the two to the same answers (a file in some crate's `tests/`).
struct Twin {
    script: &'static str,
    /// Empty only with a reason in `why_none`.
    twins: &'static [&'static str],
    test: &'static str,
    why_none: &'static str,
}

const TWINS: &[Twin] = &[
    Twin { script: "check", twins: &["src/algorithm/mod.rs"], test: "differential.rs", why_none: "" },
    Twin { script: "release", twins: &["src/algorithm/queue.rs"], test: "differential.rs", why_none: "" },
    Twin { script: "renew", twins: &["src/algorithm/queue.rs"], test: "differential.rs", why_none: "" },
    Twin {
        script: "adjust",
        twins: &["src/algorithm/gcra.rs", "src/algorithm/settle.rs"],
        test: "differential.rs",
        why_none: "",
    },
    Twin { script: "cancel", twins: &["src/algorithm/cancel.rs"], test: "differential.rs", why_none: "" },
    Twin { script: "confirm", twins: &["src/algorithm/confirm.rs"], test: "differential.rs", why_none: "" },
    Twin { script: "acquire", twins: &["src/algorithm/queue.rs"], test: "differential.rs", why_none: "" },
    Twin { script: "leave", twins: &["src/algorithm/queue.rs"], test: "differential.rs", why_none: "" },
    Twin { script: "reclaim", twins: &["src/algorithm/queue.rs"], test: "differential.rs", why_none: "" },
    Twin { script: "take", twins: &["src/algorithm/queue.rs"], test: "differential.rs", why_none: "" },
    Twin {
        script: "lease",
        twins: &["src/algorithm/mod.rs", "src/algorithm/fixed_window.rs"],
        test: "differential.rs",
        why_none: "",
    },
    Twin {
        script: "lease_bucket",
        twins: &["src/algorithm/mod.rs", "src/algorithm/gcra.rs"],
        test: "differential.rs",
        why_none: "",
    },
    Twin {
        script: "upstream",
        twins: &["src/algorithm/pause.rs", "src/algorithm/rate.rs"],
        test: "pause_script.rs",
        why_none: "",
    },
    Twin { script: "paused", twins: &["src/algorithm/pause.rs"], test: "pause_script.rs", why_none: "" },
    Twin { script: "shed", twins: &["src/shed.rs"], test: "shed_script.rs", why_none: "" },
    Twin {
        script: "refund",
        twins: &[],
        test: "cluster.rs",
        why_none: "it takes back what check.lua charged when another Redis Cluster slot denied the \
                   request; the model is one store and never splits a check",
    },
];

/// The crates whose `tests/` may hold a script's test.
const TEST_CRATES: &[&str] = &["host-shim", "policies", "tests/e2e", "tests/harness"];

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn entry_scripts() -> BTreeSet<String> {
    let dir = crate_dir().join("../lua/scripts");
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "lua"))
        .map(|p| p.file_stem().expect("a file name").to_string_lossy().into_owned())
        .collect()
}

fn find_test(file: &str) -> Option<PathBuf> {
    TEST_CRATES.iter().map(|c| crate_dir().join("..").join(c).join("tests").join(file)).find(|p| p.is_file())
}

/// Whether `text` holds `word` with no letter, digit or `_` on either side.
fn mentions(text: &str, word: &str) -> bool {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back().is_none_or(|c| !is_word(c));
        let after = text[at + word.len()..].chars().next().is_none_or(|c| !is_word(c));
        before && after
    })
}

/// Each `.lua` file in `lua/scripts/` has a row, and each row a script.
#[test]
fn every_entry_script_has_a_row() {
    let on_disk = entry_scripts();
    let in_table: BTreeSet<String> = TWINS.iter().map(|t| t.script.to_string()).collect();
    assert_eq!(in_table.len(), TWINS.len(), "a script has two rows");
    let missing: Vec<_> = on_disk.difference(&in_table).collect();
    assert!(missing.is_empty(), "lua/scripts/ holds {missing:?}, which tests/twins.rs does not list");
    let gone: Vec<_> = in_table.difference(&on_disk).collect();
    assert!(gone.is_empty(), "tests/twins.rs lists {gone:?}, which lua/scripts/ does not hold");
}

/// Every twin a row names is a file of this crate; a row without one says why.
#[test]
fn every_twin_exists() {
    for t in TWINS {
        assert!(t.twins.is_empty() != t.why_none.is_empty(), "{}: a twin, or a reason for none", t.script);
        for twin in t.twins {
            assert!(
                crate_dir().join(twin).is_file(),
                "{}.lua: its twin policies/{twin} does not exist",
                t.script
            );
        }
    }
}

/// Every test a row names exists in some crate's `tests/` and mentions its
/// script by name.
#[test]
fn every_test_exists_and_mentions_its_script() {
    for t in TWINS {
        let Some(path) = find_test(t.test) else {
            panic!("{}.lua: its test {} is in none of {TEST_CRATES:?}/tests/", t.script, t.test);
        };
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(mentions(&text, t.script), "{} never mentions {}", path.display(), t.script);
    }
}

/// The word match finds whole words only.
#[test]
fn mentions_is_by_whole_word() {
    assert!(mentions("runs take.lua", "take"));
    assert!(mentions("take", "take"));
    assert!(!mentions("mistaken", "take"));
    assert!(!mentions("take_all", "take"));
}
