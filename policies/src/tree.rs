//! The RLS face's descriptor tree: a policy whose `match` names a
//! `descriptor_tree` path is a node of its domain's tree, and a descriptor
//! reaches at most one node, found the way envoyproxy/ratelimit finds a
//! descriptor's limit:
//!
//! - the descriptor's entries are walked in order, one level of the tree
//!   each;
//! - at each level the most specific child wins: a `key` with that exact
//!   `value`, else the first child (in document order) whose wildcard
//!   value (`*` anywhere, any number of times) matches, else the bare
//!   `key`; no child: no node, the descriptor has no limit;
//! - the walk never goes back: a specific child without the next entry's
//!   child gives no limit, even if a bare sibling has one;
//! - the node reached at the descriptor's last entry is the one; a walk that
//!   stops at a node without children before the last entry gives none.
//!
//! Every policy at the node reached applies (and none of the tree's
//! others); a node with `"limits": []` limits nothing.

use serde::de::{self, Deserialize, Deserializer};

use crate::key::MAX_SOURCE_NAME_LEN;

/// The deepest path: the RLS face's most entries in one descriptor.
pub const MAX_DEPTH: usize = 32;
/// The most descriptors one RLS call may carry (the face refuses more):
/// a `descriptor_index` is below it.
pub const MAX_CALL_DESCRIPTORS: usize = 64;
/// The longest value of a step.
const MAX_VALUE_LEN: usize = 1024;

/// One level of a path: a key, and the value it needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Step {
    pub key: String,
    pub value: StepValue,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StepValue {
    /// No `value`: any value of the key (each value its own counter when the
    /// policy's key reads the entry).
    Any,
    /// A value without `*`, exact.
    Exact(String),
    /// A value with `*`: each `*` matches any run of bytes, empty included.
    Wildcard(String),
}

impl Step {
    /// Whether the step is a wildcard that `key`=`value` matches. As
    /// envoyproxy/ratelimit does, the pattern `KEY_VALUE` is matched against
    /// the entry's `KEY_VALUE`.
    fn wildcard_matches(&self, key: &str, value: &[u8]) -> bool {
        let StepValue::Wildcard(pattern) = &self.value else { return false };
        let whole = [self.key.as_bytes(), b"_", pattern.as_bytes()].concat();
        let entry = [key.as_bytes(), b"_", value].concat();
        let parts: Vec<&[u8]> = whole.split(|&b| b == b'*').collect();
        glob(&parts, &entry)
    }
}

/// Whether `value` matches the parts of a pattern split at its `*`s.
fn glob(parts: &[&[u8]], value: &[u8]) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else { return false };
    if parts.len() == 1 {
        return *first == value;
    }
    let fixed: usize = parts.iter().map(|p| p.len()).sum();
    if value.len() < fixed || !value.starts_with(first) || !value.ends_with(last) {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in parts[1..parts.len() - 1].iter().filter(|p| !p.is_empty()) {
        match rest.windows(part.len()).position(|w| w == *part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// The node a descriptor (its entries in order) reaches among `paths` (the
/// tree's paths, in document order), as its path; `None`: no node.
pub fn reach<'p>(paths: &[&'p [Step]], entries: &[(String, Vec<u8>)]) -> Option<Vec<&'p Step>> {
    let mut alive: Vec<&'p [Step]> = paths.to_vec();
    let mut chosen = Vec::with_capacity(entries.len());
    for (i, (key, value)) in entries.iter().enumerate() {
        let children = || alive.iter().filter_map(|p| p.get(i));
        let exact = |s: &&Step| {
            s.key == *key && matches!(&s.value, StepValue::Exact(v) if v.as_bytes() == value.as_slice())
        };
        let step = children()
            .find(exact)
            .or_else(|| children().find(|s| s.wildcard_matches(key, value)))
            .or_else(|| children().find(|s| s.key == *key && s.value == StepValue::Any))?;
        chosen.push(step);
        alive.retain(|p| p.get(i) == Some(step));
        if i + 1 == entries.len() {
            return Some(chosen);
        }
        if !alive.iter().any(|p| p.len() > i + 1) {
            return None;
        }
    }
    None
}

/// Whether `path` is the node `reached`.
pub fn is_reached(path: &[Step], reached: &[&Step]) -> bool {
    path.len() == reached.len() && path.iter().zip(reached).all(|(a, b)| a == *b)
}

#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStep {
    /// The entry's key.
    key: String,
    /// The entry's value: exact, or with `*` a wildcard (any run of bytes
    /// per `*`); none: any value.
    value: Option<String>,
}

impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawStep::deserialize(d)?;
        if raw.key.is_empty() || raw.key.len() > MAX_SOURCE_NAME_LEN {
            return Err(de::Error::custom(format!(
                "invalid descriptor key {:?} (expected 1 to {MAX_SOURCE_NAME_LEN} bytes)",
                raw.key
            )));
        }
        let value = match raw.value {
            None => StepValue::Any,
            Some(v) if v.is_empty() => {
                return Err(de::Error::custom("an empty `value`: leave `value` out for any value"))
            }
            Some(v) if v.len() > MAX_VALUE_LEN => {
                return Err(de::Error::custom(format!("a `value` longer than {MAX_VALUE_LEN} bytes")))
            }
            Some(v) if v.contains('*') => StepValue::Wildcard(v),
            Some(v) => StepValue::Exact(v),
        };
        Ok(Step { key: raw.key, value })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(key: &str, value: Option<&str>) -> Step {
        let value = match value {
            None => StepValue::Any,
            Some(v) if v.contains('*') => StepValue::Wildcard(v.into()),
            Some(v) => StepValue::Exact(v.into()),
        };
        Step { key: key.into(), value }
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect()
    }

    #[test]
    fn wildcards_match_anywhere_and_many_times() {
        let s = step("path", Some("/api/*/action"));
        assert!(s.wildcard_matches("path", b"/api/v1/action"));
        assert!(s.wildcard_matches("path", b"/api//action"));
        assert!(!s.wildcard_matches("path", b"/api/v1/other"));
        let many = step("path", Some("/a/*/b/*"));
        assert!(many.wildcard_matches("path", b"/a/x/b/y/z"));
        assert!(!many.wildcard_matches("path", b"/a/x/c/y"));
        let trailing = step("k", Some("foo*"));
        assert!(trailing.wildcard_matches("k", b"foo"));
        assert!(trailing.wildcard_matches("k", b"foobar"));
        assert!(!trailing.wildcard_matches("other", b"foobar"));
        let double = step("k", Some("a**b"));
        assert!(double.wildcard_matches("k", b"ab"));
        let overlap = step("k", Some("ab*ba"));
        assert!(!overlap.wildcard_matches("k", b"aba"));
    }

    #[test]
    fn the_most_specific_child_wins_and_the_walk_never_goes_back() {
        let pro = [step("plan", Some("pro"))];
        let bare = [step("plan", None)];
        let deep = [step("plan", Some("free")), step("user", Some("u1"))];
        let bare_user = [step("plan", None), step("user", None)];
        let paths: Vec<&[Step]> = vec![&bare, &pro, &deep, &bare_user];
        assert_eq!(reach(&paths, &entries(&[("plan", "pro")])), Some(vec![&pro[0]]));
        assert_eq!(reach(&paths, &entries(&[("plan", "basic")])), Some(vec![&bare[0]]));
        // plan=free exists: no fallback to the bare plan -> user path.
        assert_eq!(reach(&paths, &entries(&[("plan", "free"), ("user", "u2")])), None);
        assert_eq!(
            reach(&paths, &entries(&[("plan", "free"), ("user", "u1")])),
            Some(vec![&deep[0], &deep[1]])
        );
        assert_eq!(
            reach(&paths, &entries(&[("plan", "basic"), ("user", "u9")])),
            Some(vec![&bare_user[0], &bare_user[1]])
        );
        // Deeper than the tree: nothing.
        assert_eq!(reach(&[&pro[..]], &entries(&[("plan", "pro"), ("x", "y")])), None);
        assert_eq!(reach(&paths, &entries(&[("other", "x")])), None);
    }

    #[test]
    fn the_first_wildcard_in_document_order_wins_after_exact() {
        let a = [step("p", Some("/a/*"))];
        let b = [step("p", Some("/a/b*"))];
        let exact = [step("p", Some("/a/bc"))];
        let paths: Vec<&[Step]> = vec![&a, &b, &exact];
        assert_eq!(reach(&paths, &entries(&[("p", "/a/bd")])), Some(vec![&a[0]]));
        assert_eq!(reach(&paths, &entries(&[("p", "/a/bc")])), Some(vec![&exact[0]]));
    }

    /// A tree as envoyproxy/ratelimit holds it: nodes, each with its children.
    #[derive(Debug, Clone)]
    struct Node {
        step: Step,
        children: Vec<Node>,
    }

    fn arb_tree(depth: u32) -> proptest::strategy::BoxedStrategy<Vec<Node>> {
        use proptest::prelude::*;
        let key = prop_oneof![Just("a"), Just("b")];
        let value =
            prop_oneof![Just(None), Just(Some("x")), Just(Some("y")), Just(Some("x*")), Just(Some("*y"))];
        let children = if depth == 0 { Just(Vec::new()).boxed() } else { arb_tree(depth - 1) };
        proptest::collection::vec((key, value, children), 0..4)
            .prop_map(|nodes| {
                let mut out: Vec<Node> = Vec::new();
                for (k, v, children) in nodes {
                    let step = step(k, v);
                    // One node per key and value at a level.
                    if !out.iter().any(|n| n.step == step) {
                        out.push(Node { step, children });
                    }
                }
                out
            })
            .boxed()
    }

    /// Every node's path, depth first, parents before children.
    fn paths(nodes: &[Node], above: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
        for n in nodes {
            above.push(n.step.clone());
            out.push(above.clone());
            paths(&n.children, above, out);
            above.pop();
        }
    }

    /// The reference walk, level by level on the nested tree.
    fn walk(mut level: &[Node], entries: &[(String, Vec<u8>)]) -> Option<Vec<Step>> {
        let mut chosen = Vec::new();
        for (i, (k, v)) in entries.iter().enumerate() {
            let exact = level.iter().find(|n| {
                n.step.key == *k && n.step.value == StepValue::Exact(String::from_utf8_lossy(v).into())
            });
            let node = exact
                .or_else(|| level.iter().find(|n| n.step.wildcard_matches(k, v)))
                .or_else(|| level.iter().find(|n| n.step.key == *k && n.step.value == StepValue::Any))?;
            chosen.push(node.step.clone());
            if i + 1 == entries.len() {
                return Some(chosen);
            }
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }

    proptest::proptest! {
        #[test]
        fn reach_walks_as_the_nested_tree(
            tree in arb_tree(2),
            entries in proptest::collection::vec(
                (proptest::sample::select(vec!["a", "b"]), proptest::sample::select(vec!["x", "y", "xy", "z"])),
                1..4,
            ),
        ) {
            let entries: Vec<(String, Vec<u8>)> =
                entries.into_iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect();
            let mut all = Vec::new();
            paths(&tree, &mut Vec::new(), &mut all);
            let refs: Vec<&[Step]> = all.iter().map(Vec::as_slice).collect();
            let got = reach(&refs, &entries).map(|p| p.into_iter().cloned().collect::<Vec<_>>());
            proptest::prop_assert_eq!(got, walk(&tree, &entries));
        }
    }
}
