//! Documents written to hurt, or by mistake: too many policies, lists too
//! long, a document too large. Each is refused with a message that says
//! which bound and why; the largest accepted document parses in one pass.

use proptest::prelude::*;
use sluice_policies::bounds::{worst_case_checks, MAX_CONDITION_ENTRIES, MAX_DOCUMENT_BYTES, MAX_POLICIES};
use sluice_policies::condition::PathCondition;
use sluice_policies::{parse, Policy};

fn policy(i: usize, matcher: &str) -> String {
    format!(
        r#"{{"name": "p{i}", "match": {{{matcher}}}, "key": ["ip"], "limits": [{{"type": "fixed_window", "limit": 10, "window": "1s"}}]}}"#
    )
}

fn document(policies: &[String]) -> String {
    format!(r#"{{"policies": [{}]}}"#, policies.join(",\n"))
}

fn error_of(text: &str) -> String {
    match parse(text) {
        Ok(_) => panic!("expected an error"),
        Err(err) => err.to_string(),
    }
}

/// One policy per tenant path: the shape that grows a document past any sane size.
fn per_tenant(n: usize) -> String {
    document(&(0..n).map(|i| policy(i, &format!(r#""path_prefix": "/tenant/{i}/""#))).collect::<Vec<_>>())
}

#[test]
fn the_most_policies_are_accepted_and_one_more_is_refused() {
    let started = std::time::Instant::now();
    let doc = parse(&per_tenant(MAX_POLICIES)).expect("the largest document parses");
    eprintln!("{} policies parsed in {:?}", doc.policies.len(), started.elapsed());
    assert_eq!(doc.policies.len(), MAX_POLICIES);

    let error = error_of(&per_tenant(MAX_POLICIES + 1));
    assert!(
        error.starts_with(&format!("policies: more than {MAX_POLICIES} policies: matching scans them")),
        "{error}"
    );
}

#[test]
fn a_document_over_the_size_bound_is_refused_before_it_is_read() {
    let padding = " ".repeat(MAX_DOCUMENT_BYTES);
    let text = format!("{}{padding}", per_tenant(1));
    assert_eq!(
        error_of(&text),
        format!(
            ".: the document is {} bytes, more than the {MAX_DOCUMENT_BYTES} accepted at 1:1",
            text.len()
        )
    );
}

#[test]
fn a_condition_list_over_its_bound_is_refused() {
    let keys: Vec<String> = (0..=MAX_CONDITION_ENTRIES).map(|i| format!("\"k{i}\"")).collect();
    let text = document(&[policy(0, &format!(r#""keys": [{}]"#, keys.join(",")))]);
    let error = error_of(&text);
    assert!(
        error.starts_with(&format!(
            "policies[0].match: `keys` has {} entries, more than the {MAX_CONDITION_ENTRIES} a condition may hold",
            MAX_CONDITION_ENTRIES + 1
        )),
        "{error}"
    );

    let headers: Vec<String> =
        (0..=MAX_CONDITION_ENTRIES).map(|i| format!(r#""x-h{i}": {{"present": true}}"#)).collect();
    let text = document(&[policy(0, &format!(r#""headers": {{{}}}"#, headers.join(",")))]);
    assert!(error_of(&text).contains("`headers` has 257 entries"), "{}", error_of(&text));
}

#[test]
fn a_bypass_list_over_its_bound_is_refused() {
    let bypass: Vec<String> =
        (0..=MAX_CONDITION_ENTRIES).map(|i| format!(r#"{{"path_prefix": "/health{i}"}}"#)).collect();
    let text = format!(
        r#"{{"policies": [{{"name": "p", "bypass": [{}], "limits": [{{"type": "fixed_window", "limit": 1, "window": "1s"}}]}}]}}"#,
        bypass.join(",")
    );
    let error = error_of(&text);
    assert!(
        error.starts_with(&format!(
            "policies[0]: `bypass` has {} entries, more than the {MAX_CONDITION_ENTRIES} a policy may hold",
            MAX_CONDITION_ENTRIES + 1
        )),
        "{error}"
    );
}

/// The worst case by its definition: for each anchor (a policy's prefix or
/// exact path), the policies whose path condition that path satisfies.
fn worst_by_definition(policies: &[Policy]) -> usize {
    let mut always = 0;
    let mut anchored = Vec::new();
    for p in policies {
        match &p.matcher.path {
            Some(c @ (PathCondition::Prefix(_) | PathCondition::Exact(_))) => anchored.push(c),
            _ => always += 1,
        }
    }
    let best = anchored
        .iter()
        .map(|anchor| {
            let (text, exact) = match anchor {
                PathCondition::Prefix(p) => (p.as_str(), false),
                PathCondition::Exact(e) => (e.as_str(), true),
                PathCondition::Regex(_) => unreachable!(),
            };
            anchored
                .iter()
                .filter(|other| match other {
                    PathCondition::Prefix(p) => text.starts_with(p.as_str()),
                    PathCondition::Exact(e) => exact && e == text,
                    PathCondition::Regex(_) => false,
                })
                .count()
        })
        .max()
        .unwrap_or(0);
    always + best
}

proptest! {
    /// The one-pass worst case equals the definition's, on paths from a small
    /// alphabet so that prefixes nest and repeat.
    #[test]
    fn the_worst_case_is_the_definitions(paths in prop::collection::vec((0..3u8, "[/ab]{0,4}"), 0..40)) {
        let policies: Vec<String> = paths
            .iter()
            .enumerate()
            .map(|(i, (kind, path))| match kind {
                0 => policy(i, &format!(r#""path_prefix": "{path}""#)),
                1 => policy(i, &format!(r#""path_exact": "{path}""#)),
                _ => policy(i, r#""methods": ["GET"]"#),
            })
            .collect();
        // At most 40 policies, under every bound: each document parses.
        let doc = parse(&document(&policies)).map_err(|err| TestCaseError::fail(err.to_string()))?;
        prop_assert_eq!(worst_case_checks(&doc.policies).total, worst_by_definition(&doc.policies));
    }
}
