//! What the filter does with the shim's answer.

use sluice_policies::wire::{Check, CheckResponse};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Every limit allowed: resume the request; release `lease` at its end.
    Allow { lease: Option<String> },
    /// A limit denied: answer 429 naming `policy`, with `Retry-After: retry_after_secs`.
    Deny { policy: String, retry_after_secs: u64 },
    /// The shim gave no usable answer: `failure_mode` decides.
    Fail(String),
}

/// Reads the shim's answer to `checks`. `status` is the `:status` header,
/// `None` when the call failed without a response (reset, timeout).
pub fn decide(status: Option<&[u8]>, body: Option<&[u8]>, checks: &[Check]) -> Decision {
    let Some(status) = status else {
        return Decision::Fail("no response from the shim (unreachable, reset or timed out)".into());
    };
    if status != b"200" {
        let shown = String::from_utf8_lossy(status);
        let reason = body.map(String::from_utf8_lossy).unwrap_or_default();
        return Decision::Fail(format!("shim answered {shown}: {}", reason.trim()));
    }
    let resp: CheckResponse = match serde_json::from_slice(body.unwrap_or_default()) {
        Ok(resp) => resp,
        Err(err) => return Decision::Fail(format!("malformed shim answer: {err}")),
    };
    if resp.checks.len() != checks.len() {
        return Decision::Fail(format!(
            "shim answered {} checks for {} asked",
            resp.checks.len(),
            checks.len()
        ));
    }
    if resp.allowed {
        return Decision::Allow { lease: resp.lease };
    }
    let policy = resp.denied_check().and_then(|i| checks.get(i)).map(|c| c.policy.clone());
    // An unknown wait (a concurrency limit waits for a release) is sent as 1 s.
    let retry_after_secs = resp.retry_after_ms.map_or(1, |ms| ms.div_ceil(1000).max(1));
    Decision::Deny { policy: policy.unwrap_or_default(), retry_after_secs }
}

/// The body of a 429: a small JSON document.
pub fn deny_body(policy: &str, retry_after_secs: u64) -> Vec<u8> {
    serde_json::json!({"error": "rate_limited", "policy": policy, "retry_after": retry_after_secs})
        .to_string()
        .into_bytes()
}

/// The body of a 400 for a request that lacks a key source its policy requires.
pub fn missing_key_body(policy: &str) -> Vec<u8> {
    serde_json::json!({"error": "missing_key", "policy": policy}).to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policies::wire::WireLimit;

    fn checks() -> Vec<Check> {
        let limits = vec![WireLimit::SlidingWindow { limit: 25, window_ms: 5000, approximate: false }];
        vec![
            Check { policy: "a".into(), key: "k".into(), limits: limits.clone() },
            Check { policy: "b".into(), key: "k".into(), limits },
        ]
    }

    fn answer(allowed: [bool; 2], retry_after_ms: Option<u64>) -> Vec<u8> {
        let limit = |ok: bool| serde_json::json!({"allowed": ok, "remaining": 0, "reset_ms": 10, "retry_after_ms": if ok {Some(0)} else {retry_after_ms}});
        serde_json::json!({
            "allowed": allowed[0] && allowed[1],
            "retry_after_ms": if allowed[0] && allowed[1] {Some(0)} else {retry_after_ms},
            "checks": [{"limits": [limit(allowed[0])]}, {"limits": [limit(allowed[1])]}],
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn allowed_answer_resumes() {
        assert_eq!(
            decide(Some(b"200"), Some(&answer([true, true], Some(0))), &checks()),
            Decision::Allow { lease: None }
        );
        let with_lease =
            br#"{"allowed":true,"retry_after_ms":0,"lease":"ab.1","checks":[{"limits":[]},{"limits":[]}]}"#;
        assert_eq!(
            decide(Some(b"200"), Some(with_lease), &checks()),
            Decision::Allow { lease: Some("ab.1".into()) }
        );
    }

    #[test]
    fn denial_names_the_denying_policy_and_rounds_retry_after_up() {
        let d = decide(Some(b"200"), Some(&answer([true, false], Some(4001))), &checks());
        assert_eq!(d, Decision::Deny { policy: "b".into(), retry_after_secs: 5 });
        let d = decide(Some(b"200"), Some(&answer([false, true], Some(5000))), &checks());
        assert_eq!(d, Decision::Deny { policy: "a".into(), retry_after_secs: 5 });
        let d = decide(Some(b"200"), Some(&answer([false, true], Some(1))), &checks());
        assert_eq!(d, Decision::Deny { policy: "a".into(), retry_after_secs: 1 });
        // A concurrency denial cannot know its wait: 1 s.
        let d = decide(Some(b"200"), Some(&answer([false, true], None)), &checks());
        assert_eq!(d, Decision::Deny { policy: "a".into(), retry_after_secs: 1 });
    }

    #[test]
    fn broken_answers_are_failures() {
        let fails = |status: Option<&[u8]>, body: Option<&[u8]>| {
            matches!(decide(status, body, &checks()), Decision::Fail(_))
        };
        assert!(fails(None, None));
        assert!(fails(Some(b"503"), Some(b"redis: connection refused")));
        assert!(fails(Some(b"200"), None));
        assert!(fails(Some(b"200"), Some(b"{\"allowed\": tr")));
        assert!(fails(Some(b"200"), Some(&[0xff, 0xfe])));
        let one_check = br#"{"allowed":true,"retry_after_ms":0,"checks":[{"limits":[]}]}"#;
        assert!(fails(Some(b"200"), Some(one_check)));
    }

    #[test]
    fn deny_body_is_json() {
        let body: serde_json::Value = serde_json::from_slice(&deny_body("p", 3)).expect("json");
        assert_eq!(body, serde_json::json!({"error": "rate_limited", "policy": "p", "retry_after": 3}));
    }
}
