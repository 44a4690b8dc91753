//! Reading the shim's answer to a check call.

use sluice_policies::units::Millis;
use sluice_policies::wire::{Check, CheckResponse, Encoding, WireError};

/// The check and its answer go in the binary wire (docs/performance.md,
/// "Levers measured"); the other calls in JSON.
pub const CHECK_ENCODING: Encoding = Encoding::Binary;

/// Why a check call has no usable answer: `failure_mode` decides the
/// request, and the reason is logged.
#[derive(Debug, thiserror::Error)]
pub enum NoAnswer {
    /// The adapter could not send the call; its words.
    #[error("{0}")]
    NotSent(String),
    #[error("cannot encode the check: {0}")]
    Encode(WireError),
    #[error("the shim breaker is open")]
    BreakerOpen,
    #[error("no response from the shim (unreachable, reset or timed out)")]
    NoResponse,
    /// A status other than 200, with the body's text.
    #[error("shim answered {status}: {body}")]
    Refused { status: String, body: String },
    #[error("malformed shim answer: {0}")]
    Malformed(WireError),
    #[error("shim answered {answered} checks for {asked} asked, or not one outcome per limit")]
    Mismatch { answered: usize, asked: usize },
}

/// The shim's answer to `checks`, or why it is no usable answer (and
/// `failure_mode` decides). `status` is the `:status` header, `None` when the
/// call failed without a response (reset, timeout).
pub fn read_answer(
    encoding: Encoding,
    status: Option<&[u8]>,
    body: Option<&[u8]>,
    checks: &[Check],
) -> Result<CheckResponse, NoAnswer> {
    let Some(status) = status else {
        return Err(NoAnswer::NoResponse);
    };
    if status != b"200" {
        let body = body.map(String::from_utf8_lossy).unwrap_or_default();
        return Err(NoAnswer::Refused {
            status: String::from_utf8_lossy(status).into_owned(),
            body: body.trim().to_string(),
        });
    }
    let resp: CheckResponse = encoding.decode(body.unwrap_or_default()).map_err(NoAnswer::Malformed)?;
    if resp.checks.len() != checks.len()
        || resp.checks.iter().zip(checks).any(|(o, c)| o.limits.len() != c.limits.len())
    {
        return Err(NoAnswer::Mismatch { answered: resp.checks.len(), asked: checks.len() });
    }
    Ok(resp)
}

/// `Retry-After` in whole seconds, rounded up, at least 1; an unknown wait
/// (a concurrency limit waits for a release) is sent as 1 s.
pub fn retry_after_secs(retry_after_ms: Option<Millis>) -> u64 {
    retry_after_ms.map_or(1, |ms| ms.get().div_ceil(1000).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policies::wire::WireLimit;

    fn checks() -> Vec<Check> {
        let limits =
            vec![WireLimit::SlidingWindow { limit: 25, window_ms: Millis(5000), approximate: false }];
        vec![
            Check {
                policy: "a".into(),
                key: "k".into(),
                limits: limits.clone(),
                margin_ms: None,
                upstream: false,
                levels: Vec::new(),
            },
            Check {
                policy: "b".into(),
                key: "k".into(),
                limits,
                margin_ms: None,
                upstream: false,
                levels: Vec::new(),
            },
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

    /// The same answer in the binary wire.
    fn binary(json: &[u8]) -> Vec<u8> {
        let resp: CheckResponse = serde_json::from_slice(json).expect("an answer");
        Encoding::Binary.encode(&resp).expect("encodes")
    }

    #[test]
    fn answers_are_read_with_the_denying_check() {
        for (encoding, body) in
            [(Encoding::Json, answer as fn(_, _) -> _), (Encoding::Binary, |a, r| binary(&answer(a, r)))]
        {
            let read =
                |body: Vec<u8>| read_answer(encoding, Some(b"200"), Some(&body), &checks()).expect("answer");
            assert!(read(body([true, true], Some(0))).allowed);
            let resp = read(body([true, false], Some(4001)));
            assert_eq!((resp.allowed, resp.denied_check()), (false, Some(1)), "{encoding:?}");
        }
    }

    #[test]
    fn retry_after_rounds_up_and_an_unknown_wait_is_one_second() {
        assert_eq!(retry_after_secs(Some(Millis(4001))), 5);
        assert_eq!(retry_after_secs(Some(Millis(5000))), 5);
        assert_eq!(retry_after_secs(Some(Millis(1))), 1);
        assert_eq!(retry_after_secs(Some(Millis(0))), 1);
        assert_eq!(retry_after_secs(None), 1);
    }

    #[test]
    fn broken_answers_are_failures() {
        let fails = |status: Option<&[u8]>, body: Option<&[u8]>| {
            read_answer(Encoding::Json, status, body, &checks()).is_err()
        };
        assert!(fails(None, None));
        assert!(fails(Some(b"503"), Some(b"redis: connection refused")));
        assert!(fails(Some(b"200"), None));
        assert!(fails(Some(b"200"), Some(b"{\"allowed\": tr")));
        assert!(fails(Some(b"200"), Some(&[0xff, 0xfe])));
        let one_check = br#"{"allowed":true,"retry_after_ms":0,"checks":[{"limits":[]}]}"#;
        assert!(fails(Some(b"200"), Some(one_check)));
        let no_limits = br#"{"allowed":true,"retry_after_ms":0,"checks":[{"limits":[]},{"limits":[]}]}"#;
        assert!(fails(Some(b"200"), Some(no_limits)));
        let fails = |body: &[u8]| read_answer(Encoding::Binary, Some(b"200"), Some(body), &checks()).is_err();
        let whole = binary(&answer([true, true], Some(0)));
        assert!(!fails(&whole));
        assert!(fails(&whole[..whole.len() - 1]), "cut short");
        assert!(fails(&[&whole[..], &[0]].concat()), "a byte too many");
        assert!(fails(b"<html>502 bad gateway</html>"));
        assert!(fails(&answer([true, true], Some(0))), "JSON where the binary wire was asked for");
        assert!(fails(&binary(one_check)));
        assert!(fails(&binary(no_limits)));
    }
}
