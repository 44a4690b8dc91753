//! One way to plan a call: what the policy document makes of each of its
//! requests (an RLS call's descriptors), as the checks to enforce, the
//! shadow checks, the missing keys, the policies decided without a check
//! (`unlimited`, `blocked`, a descriptor tree's node that limits nothing,
//! `replaces`), how the checks are charged ([`Charge`]), and when the
//! RateLimit headers are sent ([`sends_headers`]). A face sends the checks
//! and answers with a view of the plan and the outcomes.
//!
//! Every face plans here: the filter's `Flow` (through `sluice_core::plan`),
//! the RLS face, the RLQS face ([`crate::rlqs::govern`]), and `sluice
//! simulate` and the playground (the replay); a check's keys, the
//! hierarchy's levels among them, are the ones the dashboard reads. It
//! lives in this crate, under the replay, so that one definition serves all.
//!
//! The planning is a plain function of the document and the requests: no
//! clock, no I/O.

use std::borrow::Cow;
use std::ops::Range;

use crate::bounds::MAX_CHECKS;
use crate::descriptor_limit::{self, Planned as Override};
use crate::document::Charge;
use crate::invalid::Invalid;
use crate::request::SimpleRequest;
use crate::wire::{Check, CheckRequest, Views};
use crate::{Applied, Document, Evaluation, HeadersMode, Policy, Request};

/// One request of a call and its cost (an RLS descriptor and its
/// `hits_addend`, 0 read as 1).
#[derive(Debug, Clone)]
pub struct Descriptor {
    pub request: SimpleRequest,
    pub hits: u32,
}

/// What the document makes of one request.
#[derive(Debug, Clone, Default)]
pub struct Planned<'d> {
    /// Indexes into [`Plan::enforced`]'s checks.
    pub enforced: Vec<usize>,
    /// Indexes into [`Plan::shadow`]'s checks.
    pub shadow: Vec<usize>,
    /// `blocked` policies: each refuses (a shadow one only would).
    pub blocked: Vec<&'d Policy>,
    /// The `unlimited` policies that apply.
    pub unlimited: Vec<&'d Policy>,
    /// Policies that apply but another of the call `replaces`.
    pub replaced: Vec<&'d Policy>,
    /// A descriptor tree's node that limits nothing was reached.
    pub limits_nothing: bool,
    /// The enforced policy that refuses the request for a missing key.
    pub missing_key: Option<&'d Policy>,
    /// Shadow policies whose key the request lacks (`on_missing_key:
    /// deny`): each a would-deny, none refusing.
    pub shadow_missing_key: Vec<&'d Policy>,
}

impl<'d> Planned<'d> {
    /// Whether any policy applied.
    pub fn matched(&self) -> bool {
        !self.enforced.is_empty()
            || !self.shadow.is_empty()
            || !self.blocked.is_empty()
            || !self.unlimited.is_empty()
            || !self.replaced.is_empty()
            || self.limits_nothing
            || self.missing_key.is_some()
    }

    /// Whether it is refused without a check: a missing key, or an enforced
    /// `blocked` policy.
    pub fn refused(&self) -> bool {
        self.missing_key.is_some() || self.blocked.iter().any(|p| !p.shadow)
    }

    /// The `blocked` policy an answer shows: an enforced one first.
    pub fn blocked_shown(&self) -> Option<&'d Policy> {
        self.blocked.iter().find(|p| !p.shadow).or(self.blocked.first()).copied()
    }
}

/// Checks, each with its policy, in groups each decided and charged as one.
#[derive(Debug, Clone, Default)]
pub struct Checks<'d> {
    pub checks: Vec<Check>,
    pub policies: Vec<&'d Policy>,
    /// Consecutive ranges of `checks`, in order: each one request to the
    /// limiter, all or none of it charged.
    pub groups: Vec<Range<usize>>,
}

impl<'d> Checks<'d> {
    /// The index of `check`; within the open group, a policy and key that
    /// two requests reach is one check, charged once.
    fn add(&mut self, policy: &'d Policy, check: Check) -> usize {
        let open = self.groups.last().map_or(0, |g| g.end)..self.checks.len();
        let same = |c: &Check| c.policy == check.policy && c.key == check.key;
        match self.checks[open.clone()].iter().position(same) {
            Some(i) => open.start + i,
            None => {
                self.checks.push(check);
                self.policies.push(policy);
                self.checks.len() - 1
            }
        }
    }

    /// Closes the open group, if it has checks.
    fn close(&mut self) {
        let start = self.groups.last().map_or(0, |g| g.end);
        if start < self.checks.len() {
            self.groups.push(start..self.checks.len());
        }
    }

    /// Each group's request to the limiter, in order.
    pub fn requests(&self) -> impl Iterator<Item = CheckRequest<'_>> {
        self.groups.iter().map(|g| CheckRequest {
            checks: Cow::Borrowed(&self.checks[g.clone()]),
            id: None,
            now_us: None,
            wait_ms: None,
            // Every descriptor's answer carries its `duration_until_reset`.
            views: Views::All,
        })
    }
}

/// A call's plan: one entry per request, and the checks of all.
#[derive(Debug, Clone, Default)]
pub struct Plan<'d> {
    pub descriptors: Vec<Planned<'d>>,
    pub enforced: Checks<'d>,
    pub shadow: Checks<'d>,
}

impl<'d> Plan<'d> {
    /// Whether the descriptor at `i` is a quota descriptor: every policy
    /// that decides it, enforced or shadow, is `quota` (one at least). A
    /// descriptor that a quota and another policy decide is not one: its
    /// refusal refuses the call, as the other policy's would.
    pub fn quota(&self, i: usize) -> bool {
        let Some(planned) = self.descriptors.get(i) else { return false };
        let enforced = planned.enforced.iter().filter_map(|&c| self.enforced.policies.get(c));
        let shadow = planned.shadow.iter().filter_map(|&c| self.shadow.policies.get(c));
        let mut deciding = enforced
            .chain(shadow)
            .copied()
            .chain(planned.blocked.iter().copied())
            .chain(planned.missing_key)
            .peekable();
        deciding.peek().is_some() && deciding.all(|p| p.quota)
    }

    /// The call's overall decision from each descriptor's (`over[i]`: the
    /// descriptor at `i` is answered over the limit), as envoyproxy/ratelimit
    /// decides it: refused when a descriptor that is not a quota one is
    /// over, or when the call has quota descriptors and every one is over.
    /// Without quota policies, refused when any descriptor is over.
    pub fn refuses(&self, over: &[bool]) -> bool {
        let (mut quotas, mut quotas_over) = (0, 0);
        for (i, &over) in over.iter().enumerate() {
            match (self.quota(i), over) {
                (false, true) => return true,
                (false, false) => {}
                (true, over) => {
                    quotas += 1;
                    quotas_over += usize::from(over);
                }
            }
        }
        quotas > 0 && quotas == quotas_over
    }
}

/// Plans a call: evaluates each request, drops the policies another one of
/// the call `replaces`, and groups the checks as the document's `charge`
/// says; a descriptor's own `limit` decides it alone when the document
/// honours it ([`crate::descriptor_limit`]). `Err` (the call is invalid)
/// when a cost cannot be charged as asked, an override's unit is unknown,
/// or a group has more checks than the shim decides at once.
pub fn plan<'d>(doc: &'d Document, descriptors: &[Descriptor]) -> Result<Plan<'d>, Invalid> {
    let evaluations: Vec<_> = descriptors.iter().map(|d| doc.evaluate(&d.request)).collect();
    let mut overrides = Vec::with_capacity(descriptors.len());
    for (i, (d, evaluation)) in descriptors.iter().zip(&evaluations).enumerate() {
        let applied = evaluation.as_ref().map(|e| e.applied.as_slice()).unwrap_or_default();
        let planned = descriptor_limit::plan(doc, &d.request, d.request.limit, applied, d.hits)
            .map_err(|e| e.within(&format!("descriptors[{i}]")))?;
        overrides.push(planned);
    }
    let calls = descriptors.iter().zip(&evaluations).zip(overrides);
    plan_calls(doc, calls.map(|((d, e), o)| (&d.request, Some(d.hits), e, o)))
}

/// [`plan`] for requests already evaluated, each with its cost (an RLS
/// descriptor's hits; `None`: what the request itself says, a cost header
/// or a limit's own cost): a replay evaluates a logged request from what
/// its record holds (`Document::evaluate_recorded`), the RLQS face a bucket.
pub fn plan_evaluated<'d, 'a, R: Request + 'a>(
    doc: &'d Document,
    calls: impl IntoIterator<Item = (&'a R, Option<u32>, &'a Result<Evaluation<'d>, &'d Policy>)>,
) -> Result<Plan<'d>, Invalid>
where
    'd: 'a,
{
    plan_calls(doc, calls.into_iter().map(|(r, hits, e)| (r, hits, e, None)))
}

/// One request of a call: the request, its cost, its evaluation, and what
/// its own honoured `limit` makes of it (then its evaluation counts for
/// nothing).
type Call<'a, 'd, R> = (&'a R, Option<u32>, &'a Result<Evaluation<'d>, &'d Policy>, Option<Override<'d>>);

fn plan_calls<'d, 'a, R: Request + 'a>(
    doc: &'d Document,
    calls: impl IntoIterator<Item = Call<'a, 'd, R>>,
) -> Result<Plan<'d>, Invalid>
where
    'd: 'a,
{
    let calls: Vec<_> = calls.into_iter().collect();
    // envoyproxy/ratelimit: the names every applied limit of the call
    // replaces, whatever its kind (an override replaces nothing).
    let replacing: Vec<&str> = calls
        .iter()
        .filter(|(_, _, _, o)| o.is_none())
        .filter_map(|(_, _, e, _)| e.as_ref().ok())
        .flat_map(|e| e.iter())
        .flat_map(|a| a.policy.replaces.iter().map(String::as_str))
        .collect();
    let replaced = |p: &Policy| !p.answer_name().is_empty() && replacing.contains(&p.answer_name());
    let mut plan = Plan::default();
    for (i, (request, hits, evaluation, own)) in calls.into_iter().enumerate() {
        let mut planned = Planned::default();
        match (own, evaluation) {
            (Some(Override::Blocked(policy)), _) => planned.blocked.push(policy),
            (Some(Override::Check(policy, check)), _) => {
                planned.enforced.push(plan.enforced.add(policy, check));
            }
            (None, Err(policy)) => planned.missing_key = Some(policy),
            (None, Ok(evaluation)) => {
                planned.shadow_missing_key =
                    evaluation.shadow_missing_key.iter().filter_map(|&i| doc.policies.get(i)).collect();
                let roles =
                    enforced(evaluation).map(|a| (a, false)).chain(shadow(evaluation).map(|a| (a, true)));
                for (applied, in_shadow) in roles {
                    let policy = applied.policy;
                    if replaced(policy) {
                        planned.replaced.push(policy);
                    } else if policy.unlimited {
                        planned.unlimited.push(policy);
                    } else if policy.blocked.is_some() {
                        planned.blocked.push(policy);
                    } else if policy.limits_nothing() {
                        planned.limits_nothing = true;
                    } else {
                        let check = match hits {
                            Some(hits) => charged(applied.check(request), policy, hits)
                                .map_err(|e| e.within(&format!("descriptors[{i}]")))?,
                            None => applied.check(request),
                        };
                        if in_shadow {
                            planned.shadow.push(plan.shadow.add(policy, check));
                        } else {
                            planned.enforced.push(plan.enforced.add(policy, check));
                        }
                    }
                }
            }
        }
        if doc.charge != Charge::AllOrNone {
            plan.enforced.close();
            plan.shadow.close();
        }
        plan.descriptors.push(planned);
    }
    for checks in [&mut plan.enforced, &mut plan.shadow] {
        checks.close();
        if let Some(g) = checks.groups.iter().find(|g| g.len() > MAX_CHECKS) {
            return Err(Invalid::new(format!(
                "the descriptors reach {} checks, more than the {MAX_CHECKS} the shim decides at once",
                g.len()
            )));
        }
    }
    Ok(plan)
}

/// `check` with a cost of `hits`: a `fixed_window`'s (epoch, first hit or
/// calendar; a cost above its limit is never admitted, as
/// envoyproxy/ratelimit counts it) and a `points`
/// limit's (at most its capacity, as every cost). The other limits count
/// requests one by one (sliding windows, buckets): a cost above 1 on them
/// is refused rather than under-counted.
fn charged(mut check: Check, policy: &Policy, hits: u32) -> Result<Check, Invalid> {
    for limit in &mut check.limits {
        let capacity = limit.points_cost().map(|_| limit.capacity());
        let kind = limit.kind().name();
        match (limit.cost_mut(), capacity) {
            (Some(cost), Some(capacity)) => *cost = hits.min(capacity),
            (Some(cost), None) => *cost = hits,
            (None, _) if hits > 1 => {
                return Err(Invalid::new(format!(
                    "hits_addend {hits} reaches policy {}, whose {kind} limit counts requests one by one: only a fixed_window or a points limit charges a cost",
                    policy.name,
                )))
            }
            (None, _) => {}
        }
    }
    Ok(check)
}

/// The enforced policies of an evaluation: with [`shadow`], the one place
/// a decision splits them (this plan, and the filter's `Flow`).
pub fn enforced<'e, 'd>(applied: &'e [Applied<'d>]) -> impl Iterator<Item = &'e Applied<'d>> + Clone {
    applied.iter().filter(|a| !a.policy.shadow)
}

/// The shadow policies of an evaluation: decided and counted, never refusing.
pub fn shadow<'e, 'd>(applied: &'e [Applied<'d>]) -> impl Iterator<Item = &'e Applied<'d>> + Clone {
    applied.iter().filter(|a| a.policy.shadow)
}

/// The headers rule: whether the `RateLimit` headers go with an answer
/// that `denied` (or admitted) the request.
pub fn sends_headers(mode: HeadersMode, denied: bool) -> bool {
    match mode {
        HeadersMode::Off => false,
        HeadersMode::OnDeny => denied,
        HeadersMode::Always => true,
    }
}

/// A `blocked` policy's window at `now_ms`: until it ends, in ms (its
/// windows aligned to the epoch, as a fixed window's).
pub fn blocked_reset_ms(policy: &Policy, now_ms: u64) -> Option<u64> {
    let window = policy.blocked?.as_millis();
    Some(window - now_ms % window)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor_limit::DescriptorLimit;
    use crate::units::Millis;
    use crate::wire::WireLimit;

    fn doc(json: &str) -> Document {
        serde_json::from_str(json).expect("a valid document")
    }

    fn descriptor(entries: &[(&str, &str)]) -> Descriptor {
        let mut request = SimpleRequest::default().domain("edge");
        for (k, v) in entries {
            request = request.entry(k, v);
        }
        Descriptor { request, hits: 1 }
    }

    const TWO: &str = r#"{"charge": "CHARGE", "policies": [
        {"name": "a", "match": {"domain": "edge", "entries": {"a": {"present": true}}},
         "key": ["entry:a"], "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]},
        {"name": "b", "match": {"domain": "edge", "entries": {"b": {"present": true}}},
         "key": ["entry:b"], "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]},
        {"name": "s", "shadow": true, "match": {"domain": "edge", "entries": {"b": {"present": true}}},
         "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]}
    ]}"#;

    #[test]
    fn all_or_none_is_one_group_and_each_descriptor_one_group_per_descriptor() {
        let calls = [descriptor(&[("a", "1")]), descriptor(&[("b", "2")]), descriptor(&[("a", "1")])];
        let all = doc(&TWO.replace("CHARGE", "all_or_none"));
        let p = plan(&all, &calls).expect("plans");
        assert_eq!(p.enforced.groups, vec![0..2]);
        assert_eq!(p.descriptors[2].enforced, vec![0], "one check for a key two descriptors reach");
        assert_eq!(p.shadow.groups, vec![0..1]);
        assert_eq!(p.descriptors[1].shadow, vec![0]);
        let each = doc(&TWO.replace("CHARGE", "each_descriptor"));
        let p = plan(&each, &calls).expect("plans");
        assert_eq!(p.enforced.groups, vec![0..1, 1..2, 2..3], "each descriptor charged on its own");
        assert_eq!(p.descriptors[2].enforced, vec![2]);
    }

    #[test]
    fn quota_descriptors_refuse_the_call_only_all_together() {
        let d = doc(r#"{"charge": "every_hit", "policies": [
            {"name": "q1", "quota": true, "match": {"domain": "edge", "entries": {"q1": {"present": true}}},
             "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]},
            {"name": "q2", "quota": true, "match": {"domain": "edge", "entries": {"q2": {"present": true}}},
             "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]},
            {"name": "qs", "quota": true, "shadow": true, "match": {"domain": "edge", "entries": {"qs": {"present": true}}},
             "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]},
            {"name": "r", "match": {"domain": "edge", "entries": {"r": {"present": true}}},
             "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]},
            {"name": "free", "unlimited": true, "match": {"domain": "edge", "entries": {"free": {"present": true}}}}
        ]}"#);
        let call = [("q1", "x"), ("q2", "x"), ("r", "x"), ("free", "x"), ("qs", "x")]
            .map(|(k, v)| descriptor(&[(k, v)]));
        let p = plan(&d, &call).expect("plans");
        assert_eq!((0..5).map(|i| p.quota(i)).collect::<Vec<_>>(), [true, true, false, false, true]);
        let q = plan(&d, &call[..2]).expect("plans");
        assert!(!q.refuses(&[true, false]), "one quota descriptor of two over");
        assert!(q.refuses(&[true, true]), "every quota descriptor over");
        assert!(p.refuses(&[false, false, true, false, false]), "a rate-limit descriptor over");
        assert!(!p.refuses(&[true, true, false, false, false]), "a shadow quota descriptor never over");
        let plain = plan(&d, &call[2..4]).expect("plans");
        assert!(!plain.refuses(&[false, false]), "no quota descriptor, none over");
        let mixed = plan(&d, &[descriptor(&[("q1", "x"), ("r", "x")])]).expect("plans");
        assert!(!mixed.quota(0), "a quota and a rate-limit policy: not a quota descriptor");
        let err = crate::parse(
            r#"{"policies": [{"name": "q", "quota": true, "match": {"domain": "edge"},
            "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]}]}"#,
        )
        .expect_err("all_or_none");
        assert_eq!(err.path, "policies[0].quota");
    }

    #[test]
    fn replaces_drops_the_named_limits_of_the_whole_call() {
        let d = doc(r#"{"charge": "each_descriptor", "policies": [
            {"name": "base", "limit_name": "base", "match": {"domain": "edge", "entries": {"a": {"present": true}}},
             "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]},
            {"name": "vip", "replaces": ["base"], "match": {"domain": "edge", "entries": {"vip": {"present": true}}},
             "limits": [{"type": "fixed_window", "limit": 9, "window": "1m"}]}
        ]}"#);
        let p = plan(&d, &[descriptor(&[("a", "1")])]).expect("plans");
        assert_eq!(p.descriptors[0].enforced.len(), 1);
        let p = plan(&d, &[descriptor(&[("a", "1")]), descriptor(&[("vip", "x")])]).expect("plans");
        assert!(p.descriptors[0].enforced.is_empty());
        assert_eq!(p.descriptors[0].replaced.len(), 1);
        assert!(p.descriptors[0].matched());
        assert_eq!(p.enforced.checks.len(), 1);
    }

    /// A tree as envoyproxy/ratelimit imports it: `plan=pro` 5 a minute,
    /// the bare `plan` 2, `plan=internal` unlimited, `plan=bad` blocked.
    const TREE: &str = r#"{"descriptor_limit": "MODE", "charge": "each_descriptor", "policies": [
        {"name": "bare", "limit_name": "", "match": {"domain": "edge", "descriptor_tree": [{"key": "plan"}]},
         "key": ["entry:plan"], "limits": [{"type": "fixed_window", "limit": 2, "window": "1m"}]},
        {"name": "pro", "limit_name": "pro", "replaces": ["x"], "match": {"domain": "edge", "descriptor_tree": [{"key": "plan", "value": "pro"}]},
         "limits": [{"type": "fixed_window", "limit": 5, "window": "1m"}]},
        {"name": "internal", "unlimited": true, "match": {"domain": "edge", "descriptor_tree": [{"key": "plan", "value": "internal"}]}},
        {"name": "bad", "blocked": "1m", "match": {"domain": "edge", "descriptor_tree": [{"key": "plan", "value": "bad"}]}},
        {"name": "x", "match": {"domain": "edge", "descriptor_tree": [{"key": "x"}]},
         "key": ["entry:x"], "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]}
    ]}"#;

    fn overridden(entries: &[(&str, &str)], rpu: u32, unit_ms: u64) -> Descriptor {
        let mut d = descriptor(entries);
        d.request = d.request.limit(DescriptorLimit::new(rpu, Some(unit_ms)));
        d
    }

    #[test]
    fn an_ignored_override_leaves_the_policies_in_charge() {
        let d = doc(&TREE.replace("MODE", "ignore"));
        let p = plan(&d, &[overridden(&[("plan", "internal")], 3, 60_000)]).expect("plans");
        assert_eq!(p.descriptors[0].unlimited.len(), 1);
        assert!(p.enforced.checks.is_empty());
    }

    #[test]
    fn an_honoured_override_alone_limits_its_descriptor_on_its_nodes_counter() {
        let d = doc(&TREE.replace("MODE", "honour"));
        // A bare node: the rule's own counter (policy and key), the override's number.
        let p = plan(&d, &[overridden(&[("plan", "free")], 3, 60_000)]).expect("plans");
        let check = &p.enforced.checks[0];
        assert_eq!((check.policy.as_str(), check.key.as_str()), ("bare", "free"));
        assert_eq!(check.limits, [WireLimit::FixedWindow { limit: 3, window_ms: Millis(60_000), cost: 1 }]);
        assert_eq!(p.enforced.policies[0].answer_name(), "", "no name");
        // An unlimited node, no node, another domain.
        let p = plan(&d, &[overridden(&[("plan", "internal")], 3, 60_000)]).expect("plans");
        assert!(p.descriptors[0].unlimited.is_empty());
        assert_eq!(p.enforced.checks[0].policy, "internal");
        let p = plan(&d, &[overridden(&[("other", "v")], 3, 3_600_000)]).expect("plans");
        assert_eq!(p.enforced.checks[0].policy, descriptor_limit::NAME);
        assert!(p.enforced.checks[0].key.starts_with("!:"), "no policy's key");
        let mut elsewhere = overridden(&[("plan", "free")], 3, 60_000);
        elsewhere.request.domain = Some(b"other".to_vec());
        assert!(!plan(&d, &[elsewhere]).expect("plans").descriptors[0].matched(), "no limit");
        // requests_per_unit 0: refused, no counter; a blocked value let through by 3.
        let p = plan(&d, &[overridden(&[("plan", "pro")], 0, 60_000)]).expect("plans");
        assert!(p.descriptors[0].refused() && p.enforced.checks.is_empty());
        let p = plan(&d, &[overridden(&[("plan", "bad")], 3, 60_000)]).expect("plans");
        assert!(!p.descriptors[0].refused() && p.enforced.checks.len() == 1);
        // Its rule's `replaces` is not applied; an unknown unit is invalid.
        let p =
            plan(&d, &[overridden(&[("plan", "pro")], 9, 1_000), descriptor(&[("x", "1")])]).expect("plans");
        assert!(p.descriptors[1].replaced.is_empty() && p.descriptors[1].enforced.len() == 1);
        let mut unknown = descriptor(&[("plan", "pro")]);
        unknown.request = unknown.request.limit(DescriptorLimit::new(1, None));
        assert!(plan(&d, &[unknown]).is_err());
    }

    #[test]
    fn headers_rule() {
        assert!(!sends_headers(HeadersMode::Off, true));
        assert!(sends_headers(HeadersMode::OnDeny, true));
        assert!(!sends_headers(HeadersMode::OnDeny, false));
        assert!(sends_headers(HeadersMode::Always, false));
    }
}
