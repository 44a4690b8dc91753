//! Checks a check request before it reaches Redis, and names its keys.
//!
//! Every Redis key of one check shares the hash tag `{<policy>:<key>}`, so a
//! check lands in one Redis Cluster slot. The key is the filter's encoded key
//! (see `sluice_policies::key`); the shim refuses anything else, so no request
//! can smuggle `{`, `}` or spaces into a key name.

use sluice_policies::key::is_encoded;
use sluice_policies::wire::{CheckRequest, WireLimit};
use sluice_policies::{Count, Duration, PolicyName};

/// The most checks one request may carry.
pub const MAX_CHECKS: usize = 64;
/// The most limits one check may carry.
pub const MAX_LIMITS: usize = 32;

/// A limit as the script takes it: its state key and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptLimit {
    pub key: String,
    pub kind: &'static str,
    pub limit: u32,
    pub window_us: u64,
}

/// Validates `req` and returns the limits of all its checks, in order.
pub fn script_limits(req: &CheckRequest) -> Result<Vec<ScriptLimit>, String> {
    if req.checks.len() > MAX_CHECKS {
        return Err(format!("too many checks: {} (at most {MAX_CHECKS})", req.checks.len()));
    }
    let mut out = Vec::new();
    for (i, check) in req.checks.iter().enumerate() {
        if PolicyName::new(&check.policy).is_none() {
            return Err(format!("checks[{i}].policy: invalid policy name {:?}", check.policy));
        }
        if !is_encoded(&check.key) {
            return Err(format!("checks[{i}].key: not an encoded key"));
        }
        if check.limits.is_empty() || check.limits.len() > MAX_LIMITS {
            return Err(format!("checks[{i}].limits: expected 1 to {MAX_LIMITS} limits"));
        }
        let tag = format!("sluice:{{{}:{}}}", check.policy, check.key);
        for (j, limit) in check.limits.iter().enumerate() {
            match *limit {
                WireLimit::SlidingWindow { limit, window_ms, approximate: false } => {
                    let (Some(_), Some(_)) = (Count::new(limit.into()), Duration::from_millis(window_ms))
                    else {
                        return Err(format!("checks[{i}].limits[{j}]: limit or window out of range"));
                    };
                    out.push(ScriptLimit {
                        key: format!("{tag}:sw:{window_ms}"),
                        kind: "sliding_window",
                        limit,
                        window_us: window_ms * 1000,
                    });
                }
                other => return Err(format!("checks[{i}].limits[{j}]: {other:?} is not supported yet")),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policies::wire::Check;

    fn request(policy: &str, key: &str) -> CheckRequest {
        CheckRequest {
            checks: vec![Check {
                policy: policy.into(),
                key: key.into(),
                limits: vec![
                    WireLimit::SlidingWindow { limit: 25, window_ms: 5_000, approximate: false },
                    WireLimit::SlidingWindow { limit: 300, window_ms: 60_000, approximate: false },
                ],
            }],
            now_us: None,
        }
    }

    #[test]
    fn every_key_of_a_check_shares_one_hash_tag() {
        let limits = script_limits(&request("partner-api", "alice")).expect("valid");
        let keys: Vec<&str> = limits.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(keys, ["sluice:{partner-api:alice}:sw:5000", "sluice:{partner-api:alice}:sw:60000"]);
        assert_eq!(limits[1].window_us, 60_000_000);
    }

    #[test]
    fn raw_key_syntax_is_refused() {
        assert!(script_limits(&request("p", "a}b")).is_err());
        assert!(script_limits(&request("p", "a b")).is_err());
        assert!(script_limits(&request("p{", "a")).is_err());
    }

    #[test]
    fn out_of_range_limits_are_refused() {
        let mut req = request("p", "a");
        req.checks[0].limits[0] = WireLimit::SlidingWindow { limit: 0, window_ms: 5_000, approximate: false };
        assert!(script_limits(&req).is_err());
        req.checks[0].limits[0] = WireLimit::SlidingWindow { limit: 1, window_ms: 0, approximate: false };
        assert!(script_limits(&req).is_err());
    }
}
