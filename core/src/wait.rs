//! Egress waiting, as the filter decides it: how long a request may be held,
//! how long its check call may take, what its response says about the hold,
//! and what a held lease's time means. Plain Rust, tested natively; the
//! filter only moves these values through host calls.
//!
//! **The request-level wait.** The shim holds one request, all or nothing,
//! for every enforced policy that applies. A request waits only if *every*
//! one of them has a `wait`, and then for the shortest `wait.timeout` among
//! them: a policy without `wait` asks for today's answer at once, and no
//! policy is held longer than it allows. Shadow policies never wait. The
//! shim queues a request for one concurrency limit (alone or with time-based
//! limits); a request under two is decided at once.

use sluice_policies::wait::can_wait;
use sluice_policies::{Limit, Policy};

/// The longest the shim may hold a request that these enforced policies
/// apply to: the shortest of their `wait.timeout`s; 0 (decide now) if any of
/// them has no `wait`, if there are none, or if their limits together are
/// ones the shim cannot hold (two concurrency limits: it would refuse the
/// check, and `failure_mode` would decide instead of the limits).
pub fn request_wait_ms<'p>(enforced: impl IntoIterator<Item = &'p Policy> + Clone) -> u64 {
    let mut shortest: Option<u64> = None;
    for policy in enforced.clone() {
        let Some(wait) = policy.wait else { return 0 };
        shortest = Some(shortest.map_or(wait.timeout_ms(), |s| s.min(wait.timeout_ms())));
    }
    if !can_wait(enforced.into_iter().flat_map(|p| &p.limits)) {
        return 0;
    }
    shortest.unwrap_or(0)
}

/// The check call's timeout: the shim's own `timeout_ms` on top of the
/// hold, so a held call is not cut short (the shim answers within `wait_ms`
/// and a few milliseconds).
pub fn call_timeout_ms(shim_timeout_ms: u32, wait_ms: u64) -> u64 {
    u64::from(shim_timeout_ms).saturating_add(wait_ms)
}

/// The `server-timing` header name.
pub const SERVER_TIMING: &str = "server-timing";

/// The `server-timing` value of a response whose request was held
/// `waited_ms`: `sluice;dur=N`, after the upstream's own metrics if it sent
/// any (`existing`), as one comma-separated list.
pub fn server_timing(existing: Option<&str>, waited_ms: u64) -> String {
    let ours = format!("sluice;dur={waited_ms}");
    match existing.map(str::trim).filter(|v| !v.is_empty()) {
        Some(theirs) => format!("{theirs}, {ours}"),
        None => ours,
    }
}

/// Whether a lease held `held_ms` outlived one of `policy`'s concurrency
/// leases (an overage: its slot may have been reclaimed while in use).
pub fn overran_lease(policy: &Policy, held_ms: u64) -> bool {
    policy.limits.iter().filter_map(Limit::lease).any(|lease| held_ms > lease.as_millis())
}

/// Whether `policy` has a concurrency limit (its holds are timed).
pub fn holds_leases(policy: &Policy) -> bool {
    policy.limits.iter().any(|l| l.lease().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(policies: &[&str]) -> sluice_policies::Document {
        let text = format!(r#"{{"policies": [{}]}}"#, policies.join(","));
        sluice_policies::parse(&text).expect("doc")
    }

    fn policy(name: &str, wait: &str) -> String {
        let wait = if wait.is_empty() { String::new() } else { format!(r#""wait": {wait},"#) };
        format!(r#"{{"name": "{name}", {wait} "limits": [{{"type": "interval", "every": "100ms"}}]}}"#)
    }

    #[test]
    fn a_request_waits_for_the_shortest_timeout_of_its_policies() {
        let d = doc(&[policy("a", r#"{"timeout": "15s"}"#).as_str(), &policy("b", r#"{"timeout": "2s"}"#)]);
        assert_eq!(request_wait_ms(d.policies.iter()), 2_000);
        assert_eq!(request_wait_ms(d.policies.iter().take(1)), 15_000);
    }

    #[test]
    fn one_policy_without_wait_means_no_wait_and_none_means_none() {
        let d = doc(&[policy("a", r#"{"timeout": "15s"}"#).as_str(), &policy("b", "")]);
        assert_eq!(request_wait_ms(d.policies.iter()), 0);
        assert_eq!(request_wait_ms(d.policies.iter().rev()), 0);
        assert_eq!(request_wait_ms(std::iter::empty()), 0);
    }

    #[test]
    fn one_concurrency_limit_waits_with_others_and_two_are_decided_now() {
        let queue = r#"{"name": "q", "wait": {"timeout": "15s"}, "limits": [{"type": "concurrency", "limit": 5, "lease": "30s"}]}"#;
        let other = r#"{"name": "r", "wait": {"timeout": "15s"}, "limits": [{"type": "concurrency", "limit": 9, "lease": "30s"}]}"#;
        let d = doc(&[queue, &policy("i", r#"{"timeout": "15s"}"#), other]);
        assert_eq!(request_wait_ms(d.policies.iter().take(1)), 15_000, "a queue alone waits");
        assert_eq!(
            request_wait_ms(d.policies.iter().take(2)),
            15_000,
            "a queue with time limits waits (mixed)"
        );
        assert_eq!(
            request_wait_ms(d.policies.iter()),
            0,
            "the shim queues for one concurrency limit, not two"
        );
    }

    #[test]
    fn a_held_call_gets_the_shim_timeout_on_top_of_its_wait() {
        assert_eq!(call_timeout_ms(100, 0), 100);
        assert_eq!(call_timeout_ms(100, 15_000), 15_100);
    }

    #[test]
    fn server_timing_appends_to_the_upstreams_metrics() {
        assert_eq!(server_timing(None, 42), "sluice;dur=42");
        assert_eq!(server_timing(Some(""), 42), "sluice;dur=42");
        assert_eq!(
            server_timing(Some("db;dur=53, app;dur=47.2"), 0),
            "db;dur=53, app;dur=47.2, sluice;dur=0"
        );
    }

    #[test]
    fn an_overage_is_a_hold_longer_than_the_lease() {
        let d = doc(&[
            r#"{"name": "c", "limits": [{"type": "concurrency", "limit": 2, "lease": "30s"}]}"#,
            &policy("i", ""),
        ]);
        assert!(holds_leases(&d.policies[0]) && !holds_leases(&d.policies[1]));
        assert!(!overran_lease(&d.policies[0], 30_000));
        assert!(overran_lease(&d.policies[0], 30_001));
        assert!(!overran_lease(&d.policies[1], 1_000_000));
    }
}
