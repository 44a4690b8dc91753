//! The size bounds of one request to the shim, in one place: the document
//! parser refuses a document whose worst request could exceed them, and the
//! shim refuses a request that does. A request the shim refuses is a shim
//! failure, which `failure_mode: allow` lets through unlimited, so no valid
//! document may be able to produce one.
//!
//! The worst request is the one to which the most policies apply at once.
//! Policies whose `match` paths exclude each other (`/a/` and `/b/`) never
//! apply together, so a document may hold many more than [`MAX_CHECKS`]
//! policies as long as no one path reaches too many; every other condition
//! (methods, host, headers, a `path_regex`) is assumed to hold, which can
//! only overestimate. Each policy is weighed by building its largest check:
//! a key as long as its key sources can make one, the largest number every
//! field can hold, serialized as the filter serializes it.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use crate::condition::PathCondition;
pub use crate::condition::MAX_CONDITION_ENTRIES;
use crate::key::MAX_PART_LEN;
pub use crate::key::{MAX_KEY_LEN, MAX_KEY_SOURCES};
use crate::units::{Micros, Millis};
use crate::wire::{AdjustRequest, Adjustment, Check, CheckLevel, CheckRequest, LevelKey, WireLimit};
use crate::Policy;

/// The most checks one request to the shim may carry: one per policy that
/// applies, so also the most policies that may apply to one request.
pub const MAX_CHECKS: usize = 64;
/// The most policies one document may hold. Matching is a scan of the
/// policies for each request, in every worker of every gateway; a document
/// that needs more is better written with keys (one policy, a key per
/// tenant) than with a policy per tenant.
pub const MAX_POLICIES: usize = 1024;
/// The longest policy document, in bytes.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;
/// The most limits one policy, and so one check, may have.
pub const MAX_LIMITS: usize = 32;
/// The most adjustments one `/v1/adjust` request may carry: one per limit.
pub const MAX_ADJUSTMENTS: usize = MAX_CHECKS * MAX_LIMITS;
/// The largest request body the shim reads.
pub const MAX_BODY: usize = 64 * 1024;
/// The most checks one `/v1/checks` batch carries.
pub const MAX_BATCH: usize = 64;
/// The largest `/v1/checks` body the shim reads; a filter fills a batch up
/// to it (and [`MAX_BATCH`]), and leaves the rest for the next.
pub const MAX_BATCH_BODY: usize = 256 * 1024;
/// The longest request id or lease the filter sends.
pub const MAX_ID_LEN: usize = 64;

/// A worst case: the largest total over the policies that can apply to one
/// request, and a path that reaches it (`None`: any path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worst {
    pub total: usize,
    pub path: Option<String>,
}

impl Worst {
    /// ` (for paths like "/a/b")`, or nothing when any path reaches it.
    pub fn path_hint(&self) -> String {
        self.path.as_ref().map(|p| format!(" (for paths like {p:?})")).unwrap_or_default()
    }
}

/// The most policies that can apply to one request.
pub fn worst_case_checks(policies: &[Policy]) -> Worst {
    worst_set(policies, |_| 1)
}

/// The largest body, in bytes, that any request for `policies` can make the
/// filter send: a check (or the smaller release) carrying every policy that
/// applies, or the adjustment of every points limit with an
/// `actual_cost_header` among them.
pub fn worst_case_body(policies: &[Policy]) -> Worst {
    let check = worst_set(policies, |p| json_len(&worst_case_check(p)) + 1);
    let adjust =
        worst_set(policies, |p| worst_case_adjustments(p).iter().map(|a| json_len(a) + 1).sum::<usize>());
    let id = "x".repeat(MAX_ID_LEN);
    let empty_check = CheckRequest {
        checks: Cow::Borrowed(&[]),
        id: Some(Cow::Borrowed(&id)),
        now_us: Some(Micros(u64::MAX)),
        wait_ms: Some(Millis(u64::MAX)),
        views: Default::default(),
    };
    let empty_adjust = AdjustRequest { adjustments: Vec::new(), now_us: Some(Micros(u64::MAX)) };
    let check = Worst { total: check.total + json_len(&empty_check), ..check };
    let adjust = Worst { total: adjust.total + json_len(&empty_adjust), ..adjust };
    if check.total >= adjust.total {
        check
    } else {
        adjust
    }
}

/// The largest sum of `weight` over a set of policies that can apply to one
/// request. A path matches the prefixes that are prefixes of it and the
/// exact path equal to it, so the policies that apply together, of those
/// with a prefix or exact path, all sit on the path of one of them, the
/// anchor: the sum over each anchor bounds every such set. Policies without
/// either are counted always.
///
/// The prefixes go into a byte trie holding each one's weight, so an
/// anchor's sum is one walk down its own bytes: linear in the document's
/// paths, where comparing every anchor with every policy took minutes for
/// tens of thousands of policies.
fn worst_set(policies: &[Policy], weight: impl Fn(&Policy) -> usize) -> Worst {
    let mut always = 0;
    let mut prefixes = PrefixTrie::default();
    let mut exact: HashMap<&str, usize> = HashMap::new();
    // A descriptor reaches one node of one domain's tree: only the
    // heaviest node's policies can apply together.
    let mut nodes: HashMap<(Option<&str>, &[crate::tree::Step]), usize> = HashMap::new();
    for policy in policies {
        let w = weight(policy);
        if let Some(path) = &policy.matcher.descriptor_tree {
            *nodes.entry((policy.matcher.domain.as_deref(), path)).or_default() += w;
            continue;
        }
        match &policy.matcher.path {
            Some(PathCondition::Prefix(p)) => prefixes.add(p, w),
            Some(PathCondition::Exact(e)) => *exact.entry(e.as_str()).or_default() += w,
            _ => always += w,
        }
    }
    always += nodes.values().max().copied().unwrap_or(0);
    let anchors = policies.iter().filter_map(|policy| match &policy.matcher.path {
        Some(PathCondition::Prefix(p)) => Some((prefixes.sum_along(p), p.as_str())),
        Some(PathCondition::Exact(e)) => {
            Some((prefixes.sum_along(e) + exact.get(e.as_str()).copied().unwrap_or(0), e.as_str()))
        }
        _ => None,
    });
    match anchors.max_by_key(|(sum, _)| *sum) {
        Some((sum, path)) => Worst { total: always + sum, path: Some(path.to_string()) },
        None => Worst { total: always, path: None },
    }
}

/// Path prefixes by their bytes, each node holding the weight of the
/// prefixes that end there.
#[derive(Default)]
struct PrefixTrie {
    nodes: Vec<TrieNode>,
}

#[derive(Default)]
struct TrieNode {
    weight: usize,
    children: BTreeMap<u8, usize>,
}

impl PrefixTrie {
    fn add(&mut self, prefix: &str, weight: usize) {
        if self.nodes.is_empty() {
            self.nodes.push(TrieNode::default());
        }
        let mut at = 0;
        for &byte in prefix.as_bytes() {
            at = match self.nodes[at].children.get(&byte) {
                Some(&next) => next,
                None => {
                    self.nodes.push(TrieNode::default());
                    let next = self.nodes.len() - 1;
                    self.nodes[at].children.insert(byte, next);
                    next
                }
            };
        }
        self.nodes[at].weight += weight;
    }

    /// The weight of every prefix of `path` (itself included).
    fn sum_along(&self, path: &str) -> usize {
        let Some(root) = self.nodes.first() else { return 0 };
        let mut sum = root.weight;
        let mut at = 0;
        for byte in path.as_bytes() {
            match self.nodes[at].children.get(byte) {
                Some(&next) => {
                    at = next;
                    sum += self.nodes[at].weight;
                }
                None => break,
            }
        }
        sum
    }
}

/// `policy`'s check at its largest: the longest key its sources can make,
/// the largest cost, the largest margin.
fn worst_case_check(policy: &Policy) -> Check {
    let longest = |sources: usize| match sources {
        0 => crate::key::MISSING.to_string(),
        n => vec!["%".repeat(MAX_PART_LEN); n].join(":"),
    };
    let key = longest(policy.key.len());
    let levels = (policy.levels.iter())
        .map(|level| CheckLevel {
            level: LevelKey {
                name: level.name.as_str().to_string(),
                key: longest(level.key.len() - policy.key.len()),
            },
            from: level.from,
        })
        .collect();
    let limits = policy
        .limits
        .iter()
        .map(|limit| {
            // A points limit at its largest cost, its capacity; no other kind has a cost.
            WireLimit::with_cost(limit, WireLimit::with_cost(limit, 1).capacity())
        })
        .collect();
    Check {
        policy: policy.state_name().to_string(),
        key,
        limits,
        margin_ms: Some(Millis(u64::MAX)),
        upstream: true,
        levels,
    }
}

/// The adjustments of `policy`'s points limits with an `actual_cost_header`, at their largest.
fn worst_case_adjustments(policy: &Policy) -> Vec<Adjustment> {
    let check = worst_case_check(policy);
    let adjusted = (policy.limits.iter().zip(&check.limits).enumerate())
        .filter(|(_, (limit, _))| limit.actual_cost_header().is_some());
    adjusted
        .map(|(j, (_, wire))| Adjustment {
            policy: check.policy.clone(),
            key: check.key.clone(),
            id: Some("-".repeat(64)),
            limit: *wire,
            actual: u32::MAX,
            held_until_us: Some(Micros(u64::MAX)),
            refunded_us: Micros(u64::MAX),
            level: check.level_of(j).cloned(),
        })
        .collect()
}

fn json_len(value: &impl serde::Serialize) -> usize {
    // Serializing plain structs into memory cannot fail; count the worst if it did.
    serde_json::to_vec(value).map_or(usize::MAX / 2, |json| json.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(policies: &[(&str, &str)]) -> Vec<Policy> {
        let policies: Vec<String> = policies
            .iter()
            .enumerate()
            .map(|(i, (kind, path))| {
                let matcher = if kind.is_empty() {
                    String::new()
                } else {
                    format!(r#""match": {{"{kind}": "{path}"}},"#)
                };
                format!(r#"{{"name": "p{i}", {matcher} "limits": [{{"type": "interval", "every": "1s"}}]}}"#)
            })
            .collect();
        let text = format!(r#"{{"policies": [{}]}}"#, policies.join(","));
        match crate::parse(&text) {
            Ok(doc) => doc.policies.0,
            Err(err) => panic!("{err}"),
        }
    }

    #[test]
    fn the_longest_key_is_every_source_at_its_longest() {
        assert_eq!(MAX_KEY_LEN, 8 * 257);
        assert!(vec!["%".repeat(MAX_PART_LEN); MAX_KEY_SOURCES].join(":").len() <= MAX_KEY_LEN);
    }

    #[test]
    fn disjoint_paths_never_apply_together() {
        let policies = doc(&[("path_prefix", "/a/"), ("path_prefix", "/b/"), ("path_exact", "/c")]);
        assert_eq!(worst_case_checks(&policies).total, 1);
    }

    #[test]
    fn nested_prefixes_and_unconditioned_policies_add_up() {
        let policies = doc(&[
            ("path_prefix", "/"),
            ("path_prefix", "/a/"),
            ("path_exact", "/a/b"),
            ("path_exact", "/a/b"),
            ("path_prefix", "/b/"),
            ("path_regex", "^/z"),
            ("", ""),
        ]);
        let worst = worst_case_checks(&policies);
        assert_eq!(worst.total, 6, "/, /a/, /a/b twice, the regex and the unconditioned one");
        assert_eq!(worst.path.as_deref(), Some("/a/b"));
    }

    #[test]
    fn an_exact_path_does_not_reach_a_longer_prefix() {
        let policies = doc(&[("path_exact", "/a"), ("path_prefix", "/a/")]);
        assert_eq!(worst_case_checks(&policies).total, 1);
    }
}
