//! Upstream feedback, the filter's half: after an admitted request's
//! response, which of its policies the partner asked to slow down, and for
//! how long (`sluice_policies::feedback`). The root context sends the pauses
//! to the shim, which records them fleet-wide. Plain Rust: the adapter
//! hands in the status and a header reader.

use sluice_policies::feedback::Adaptation;
use sluice_policies::units::Millis;
use sluice_policies::wire::{Check, Pause};
use sluice_policies::Document;

/// What one response says, per policy (document indexes).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Feedback {
    pub pauses: Vec<Pause>,
    /// Policies whose key this response pauses.
    pub throttled: Vec<usize>,
    /// Of those, the ones whose hint was cut to `max_pause` or ignored as broken.
    pub clamped: Vec<usize>,
}

/// The pauses that a response with `status` calls for, for each enforced
/// policy of the request that reads upstream feedback. `header` reads a
/// response header by lower-case name; `now_ms` is the proxy's clock.
pub fn read(
    doc: &Document,
    policies: &[usize],
    checks: &[Check],
    status: u16,
    header: impl Fn(&str) -> Option<Vec<u8>>,
    now_ms: u64,
) -> Feedback {
    let mut out = Feedback::default();
    for (&index, check) in policies.iter().zip(checks) {
        let Some(upstream) = doc.policies.get(index).and_then(|p| p.upstream.as_ref()) else { continue };
        let names =
            ["retry-after", "ratelimit", upstream.remaining_header.as_str(), upstream.reset_header.as_str()];
        let values: Vec<(&str, Vec<u8>)> = names.iter().filter_map(|&n| Some((n, header(n)?))).collect();
        let read = |name: &str| values.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_slice());
        let Some(throttle) = upstream.throttle(status, read, now_ms) else { continue };
        if throttle.pause_ms == 0 {
            continue;
        }
        // A refusal also teaches the rate, if the policy adapts it.
        let slow = match upstream.adapt {
            Adaptation::On(adapt) if throttle.refused => Some(adapt.slowdown()),
            _ => None,
        };
        out.pauses.push(Pause {
            policy: check.policy.clone(),
            key: check.key.clone(),
            pause_ms: Millis(throttle.pause_ms),
            slow,
        });
        out.throttled.push(index);
        if throttle.clamped {
            out.clamped.push(index);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"{"policies": [
        {"name": "partner", "key": ["header:x-account"], "upstream": {"max_pause": "1m"},
         "limits": [{"type": "sliding_window", "limit": 25, "window": "5s"}]},
        {"name": "plain", "limits": [{"type": "fixed_window", "limit": 9, "window": "1m"}]}
    ]}"#;

    fn checks() -> Vec<Check> {
        ["partner", "plain"]
            .iter()
            .map(|p| Check {
                policy: (*p).into(),
                key: "acme".into(),
                limits: Vec::new(),
                margin_ms: None,
                upstream: false,
                levels: Vec::new(),
            })
            .collect()
    }

    fn headers(list: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<Vec<u8>> {
        move |name| list.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_bytes().to_vec())
    }

    #[test]
    fn a_429_pauses_only_the_policies_that_read_feedback() {
        let doc = sluice_policies::parse(DOC).expect("valid");
        let got = read(&doc, &[0, 1], &checks(), 429, headers(&[("retry-after", "7")]), 0);
        let slow = Some(sluice_policies::feedback::Adapt::default().slowdown());
        assert_eq!(
            got.pauses,
            [Pause { policy: "partner".into(), key: "acme".into(), pause_ms: Millis(7_000), slow }]
        );
        assert_eq!((got.throttled, got.clamped), (vec![0], vec![]));
    }

    #[test]
    fn only_a_refusal_lowers_the_rate_and_only_where_the_policy_adapts() {
        let doc = sluice_policies::parse(DOC).expect("valid");
        let nothing_left = headers(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "3")]);
        let got = read(&doc, &[0, 1], &checks(), 200, nothing_left, 0);
        assert_eq!((got.pauses[0].pause_ms, got.pauses[0].slow), (Millis(3_000), None));
        let fixed = DOC.replace(r#""max_pause": "1m""#, r#""max_pause": "1m", "adapt": false"#);
        let doc = sluice_policies::parse(&fixed).expect("valid");
        let got = read(&doc, &[0, 1], &checks(), 429, headers(&[("retry-after", "7")]), 0);
        assert_eq!((got.pauses[0].pause_ms, got.pauses[0].slow), (Millis(7_000), None));
    }

    #[test]
    fn a_hostile_retry_after_is_cut_and_reported() {
        let doc = sluice_policies::parse(DOC).expect("valid");
        let got = read(&doc, &[0, 1], &checks(), 429, headers(&[("retry-after", "31536000")]), 0);
        assert_eq!(got.pauses[0].pause_ms, Millis(60_000));
        assert_eq!(got.clamped, vec![0]);
    }

    #[test]
    fn a_good_answer_pauses_nothing() {
        let doc = sluice_policies::parse(DOC).expect("valid");
        assert_eq!(read(&doc, &[0, 1], &checks(), 200, headers(&[]), 0), Feedback::default());
    }
}
