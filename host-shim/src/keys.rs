//! Checks the requests the filter sends before they reach Redis, and names
//! their keys: `sluice:{<policy>:<key>}:<suffix>`.
//!
//! Every key of one check shares the hash tag `{<policy>:<key>}`, so a check
//! lands in one Redis Cluster slot; a hierarchy's level keeps its state
//! under it too, as `sluice:{<policy>:<key>}:@<level>:<level key>:<suffix>`,
//! so every level of a check is charged in the same atomic call. The key is the filter's encoded key (see
//! `sluice_policies::key`); the shim refuses anything else, so no request can
//! smuggle `{`, `}` or spaces into a key name. The suffix names the limit's
//! algorithm and period (`Algorithm::state_suffix`).
//!
//! The bounds on checks, limits and key length are `sluice_policies::bounds`,
//! the ones the document parser holds every policy document to.

use sluice_policies::algorithm::{Algorithm, Correction};
pub use sluice_policies::bounds::{MAX_ADJUSTMENTS, MAX_CHECKS, MAX_LIMITS};
use sluice_policies::key::is_encoded;
use sluice_policies::units::Micros;
use sluice_policies::wire::{Adjustment, Check, LeaseRequest, WireLimit};
use sluice_policies::{Invalid, PolicyName};

/// A limit as the scripts take it: its state key and its algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptLimit {
    pub key: String,
    pub algorithm: Algorithm,
}

impl ScriptLimit {
    /// Its algorithm's name and four numbers (check.lua's layout) for a
    /// call whose time argument is `now`: empty for Redis TIME, in which case
    /// a calendar's window ends are placed around this shim's clock (see
    /// `sluice_policies::calendar`).
    pub fn script_args(&self, now: &str) -> (&'static str, [u64; 4]) {
        self.algorithm.script_args(clock_us(now))
    }
}

/// A script's time argument as microseconds: the explicit time of test
/// mode, or this shim's clock for Redis TIME (empty).
pub fn clock_us(now: &str) -> u64 {
    now.parse().unwrap_or_else(|_| {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
    })
}

/// `sluice:{<policy>:<key>}`, after checking both parts.
pub fn tag(policy: &str, key: &str) -> Result<String, Invalid> {
    if PolicyName::new(policy).is_none() {
        return Err(Invalid::new(format!("invalid policy name {policy:?}")));
    }
    if !is_encoded(key) {
        return Err(Invalid::new("not an encoded key"));
    }
    Ok(sluice_policies::wire::hash_tag(policy, key))
}

/// A check's levels, checked: valid names and keys, each level starting
/// after the one before, with at least one limit each and one for the top.
fn check_levels(check: &Check) -> Result<(), Invalid> {
    let mut from = 0;
    for (i, level) in check.levels.iter().enumerate() {
        if PolicyName::new(&level.level.name).is_none() {
            return Err(Invalid::at(
                format!("levels[{i}].name"),
                format!("invalid level name {:?}", level.level.name),
            ));
        }
        if !is_encoded(&level.level.key) {
            return Err(Invalid::at(format!("levels[{i}].key"), "not an encoded key"));
        }
        if level.from <= from || level.from >= check.limits.len() {
            return Err(Invalid::at(
                format!("levels[{i}].from"),
                format!("{} is not after the level above it and within the limits", level.from),
            ));
        }
        from = level.from;
    }
    Ok(())
}

fn script_limit(tag: &str, limit: &WireLimit) -> Result<ScriptLimit, Invalid> {
    limit.validate()?;
    let algorithm = Algorithm::of(limit);
    Ok(ScriptLimit { key: algorithm.state_key(tag), algorithm })
}

/// The state keys of `limits` under `prefix` (a check's hash tag, or a
/// level's key under it), each limit checked.
pub fn state_keys(prefix: &str, limits: &[WireLimit]) -> Result<Vec<ScriptLimit>, Invalid> {
    (limits.iter().enumerate())
        .map(|(j, limit)| script_limit(prefix, limit).map_err(|e| e.within(&format!("limits[{j}]"))))
        .collect()
}

/// Validates `checks` and returns the limits of all of them, in order.
pub fn script_limits(checks: &[Check]) -> Result<Vec<ScriptLimit>, Invalid> {
    if checks.len() > MAX_CHECKS {
        return Err(Invalid::new(format!("too many checks: {} (at most {MAX_CHECKS})", checks.len())));
    }
    let mut out = Vec::new();
    for (i, check) in checks.iter().enumerate() {
        tag(&check.policy, &check.key).map_err(|e| e.within(&format!("checks[{i}]")))?;
        if check.limits.is_empty() || check.limits.len() > MAX_LIMITS {
            return Err(Invalid::at(
                format!("checks[{i}].limits"),
                format!("expected 1 to {MAX_LIMITS} limits"),
            ));
        }
        check_levels(check).map_err(|e| e.within(&format!("checks[{i}]")))?;
        for (j, limit) in check.limits.iter().enumerate() {
            let prefix = check.state_prefix(j);
            out.push(
                script_limit(&prefix, limit).map_err(|e| e.within(&format!("checks[{i}].limits[{j}]")))?,
            );
        }
    }
    // The partner's pauses come after every limit, in the checks' order
    // (`limiter::by_check` reads them there), then the rates its refusals
    // taught, which scale the limits of their check (`lua/lib/rate.lua`).
    for algorithm in [Algorithm::Pause, Algorithm::Rate] {
        for check in checks.iter().filter(|c| c.upstream) {
            let tag = tag(&check.policy, &check.key)?;
            out.push(ScriptLimit { key: algorithm.state_key(&tag), algorithm });
        }
    }
    let mut keys: Vec<&str> = out.iter().map(|l| l.key.as_str()).collect();
    keys.sort_unstable();
    if let Some(pair) = keys.windows(2).find(|w| w[0] == w[1]) {
        return Err(Invalid::new(format!("two limits share the key {}", pair[0])));
    }
    Ok(out)
}

/// The keys of the partner's pause and of the rate its refusals taught,
/// for `policy`'s `key` (upstream feedback).
pub fn feedback_keys(policy: &str, key: &str) -> Result<[String; 2], Invalid> {
    let tag = tag(policy, key)?;
    Ok([Algorithm::Pause, Algorithm::Rate].map(|a| a.state_key(&tag)))
}

/// The state key of a leased policy's window, after checking the request.
pub fn lease_key(req: &LeaseRequest) -> Result<ScriptLimit, Invalid> {
    req.validate()?;
    let tag = tag(&req.policy, &req.key)?;
    script_limit(&tag, &req.limit).map_err(|e| e.within("limit"))
}

/// The points corrections as the adjust script takes them.
pub fn script_adjustments(adjustments: &[Adjustment]) -> Result<Vec<Correction>, Invalid> {
    if adjustments.len() > MAX_ADJUSTMENTS {
        return Err(Invalid::new(format!(
            "too many adjustments: {} (at most {MAX_ADJUSTMENTS})",
            adjustments.len()
        )));
    }
    adjustments
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let (WireLimit::Points { cost, capacity, .. } | WireLimit::CalendarPoints { cost, capacity, .. }) =
                a.limit
            else {
                return Err(Invalid::at(format!("adjustments[{i}].limit"), "only points limits are adjusted"));
            };
            // An actual cost beyond the capacity could drive the bucket
            // into years of debt (see `sluice_policies::cost`).
            if a.actual > capacity {
                return Err(Invalid::at(
                    format!("adjustments[{i}].actual"),
                    format!("{} exceeds the capacity {capacity}", a.actual),
                ));
            }
            let mut tag = tag(&a.policy, &a.key).map_err(|e| e.within(&format!("adjustments[{i}]")))?;
            if let Some(level) = &a.level {
                if PolicyName::new(&level.name).is_none() || !is_encoded(&level.key) {
                    return Err(Invalid::at(format!("adjustments[{i}].level"), "invalid level name or key"));
                }
                tag = level.under(&tag);
            }
            let limit = script_limit(&tag, &a.limit).map_err(|e| e.within(&format!("adjustments[{i}].limit")))?;
            // A calendar window's counter takes interval 0 (calendar.lua).
            let interval_us = match limit.algorithm {
                Algorithm::Gcra { interval_us, .. } => interval_us.get(),
                Algorithm::Calendar { .. } => 0,
                _ => return Err(Invalid::at(format!("adjustments[{i}].limit"), "not a bucket")),
            };
            if a.id.as_deref().is_some_and(|id| !valid_id(id)) {
                return Err(Invalid::at(format!("adjustments[{i}].id"), "expected 1 to 64 of A-Z a-z 0-9 . _ -"));
            }
            Ok(Correction {
                key: limit.key,
                id: a.id.clone(),
                interval_us,
                delta: i64::from(a.actual) - i64::from(cost),
                held_until_us: a.held_until_us.map_or(0, Micros::get),
                refunded_us: a.refunded_us.get(),
            })
        })
        .collect()
}

/// A request or settlement id as the scripts store it: 1 to 64 bytes of
/// letters, digits, `.`, `_` and `-`.
pub(crate) fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policies::units::Millis;

    fn check(policy: &str, key: &str, limits: Vec<WireLimit>) -> Vec<Check> {
        vec![Check {
            policy: policy.into(),
            key: key.into(),
            limits,
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        }]
    }

    fn dual() -> Vec<WireLimit> {
        vec![
            WireLimit::SlidingWindow { limit: 25, window_ms: Millis(5_000), approximate: false },
            WireLimit::SlidingWindow { limit: 300, window_ms: Millis(60_000), approximate: false },
        ]
    }

    #[test]
    fn every_key_of_a_check_shares_one_hash_tag() {
        let limits = script_limits(&check("partner-api", "alice", dual())).expect("valid");
        let keys: Vec<&str> = limits.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(keys, ["sluice:{partner-api:alice}:sw:5000", "sluice:{partner-api:alice}:sw:60000"]);
    }

    #[test]
    fn each_algorithm_has_its_own_suffix() {
        let limits = vec![
            WireLimit::FixedWindow { limit: 1, window_ms: Millis(60_000), cost: 1 },
            WireLimit::SlidingWindow { limit: 1, window_ms: Millis(60_000), approximate: true },
            WireLimit::TokenBucket { rate: 100, per_ms: Millis(1_000), burst: 500 },
            WireLimit::Concurrency { limit: 5, lease_ms: Millis(30_000) },
        ];
        let keys: Vec<String> =
            script_limits(&check("p", "k", limits)).expect("valid").into_iter().map(|l| l.key).collect();
        assert_eq!(
            keys,
            [
                "sluice:{p:k}:fw:60000",
                "sluice:{p:k}:sa:60000",
                "sluice:{p:k}:gcra:10000",
                "sluice:{p:k}:cc:30000"
            ]
        );
    }

    #[test]
    fn raw_key_syntax_is_refused() {
        assert!(script_limits(&check("p", "a}b", dual())).is_err());
        assert!(script_limits(&check("p", "a b", dual())).is_err());
        assert!(script_limits(&check("p{", "a", dual())).is_err());
    }

    #[test]
    fn out_of_range_limits_are_refused() {
        let bad = [
            WireLimit::SlidingWindow { limit: 0, window_ms: Millis(5_000), approximate: false },
            WireLimit::SlidingWindow { limit: 1, window_ms: Millis(0), approximate: false },
            WireLimit::TokenBucket { rate: 1_000_000, per_ms: Millis(1), burst: 1 },
            WireLimit::Interval { every_ms: Millis(400 * 86_400_000) },
        ];
        for limit in bad {
            assert!(script_limits(&check("p", "k", vec![limit])).is_err(), "{limit:?}");
        }
    }

    #[test]
    fn limits_sharing_a_key_are_refused() {
        let twice = vec![
            WireLimit::Interval { every_ms: Millis(1_000) },
            WireLimit::Interval { every_ms: Millis(1_000) },
        ];
        assert!(script_limits(&check("p", "k", twice)).is_err());
    }

    #[test]
    fn adjustments_charge_the_difference() {
        let limit = WireLimit::Points { capacity: 1000, refill_ms: Millis(20_000), cost: 50 };
        let a = |actual| Adjustment {
            policy: "p".into(),
            key: "k".into(),
            limit,
            id: None,
            actual,
            held_until_us: None,
            refunded_us: Micros(0),
            level: None,
        };
        let got = script_adjustments(&[a(80), a(10)]).expect("valid");
        assert_eq!(
            got[0],
            Correction {
                key: "sluice:{p:k}:gcra:20000".into(),
                id: None,
                interval_us: 20_000,
                delta: 30,
                held_until_us: 0,
                refunded_us: 0,
            }
        );
        assert_eq!(got[1].delta, -40);
    }
}
