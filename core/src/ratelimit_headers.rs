//! The IETF `RateLimit` and `RateLimit-Policy` headers
//! (draft-ietf-httpapi-ratelimit-headers, structured fields):
//!
//! ```text
//! RateLimit-Policy: "partner-api";q=25;w=5
//! RateLimit: "partner-api";r=0;t=3
//! ```
//!
//! Sluice describes one limit, the most restrictive of those that applied: a
//! denying one first, then the one with the fewest requests remaining, then
//! the one that takes longest to reset. Its item is named after its policy.
//!
//! `q` is the limit's quota, `w` its window in whole seconds (rounded up):
//! for a token bucket the time to refill the whole burst, for a leaky bucket
//! its drain, for `interval` `q=1` and its period, for `points` its capacity
//! and refill. A `concurrency` limit has no window: `q` and
//! `qu="concurrent-requests"`. `r` is what remains after this request, `t`
//! the seconds until the limit frees capacity (for a denying limit, until it
//! would admit the request).

use sluice_policies::units::Millis;
use sluice_policies::wire::{LimitOutcome, WireLimit};
use sluice_policies::Limit;

/// The two header values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitHeaders {
    pub policy: String,
    pub ratelimit: String,
}

impl RateLimitHeaders {
    pub const POLICY: &'static str = "ratelimit-policy";
    pub const RATELIMIT: &'static str = "ratelimit";

    /// The headers for the most restrictive of `limits`: each a policy name,
    /// a limit and the shim's outcome for it.
    pub fn most_restrictive<'a>(
        limits: impl IntoIterator<Item = (&'a str, &'a Limit, &'a LimitOutcome)>,
    ) -> Option<RateLimitHeaders> {
        let (name, limit, outcome) = most_restrictive(limits)?;
        Some(RateLimitHeaders::of(name, limit, outcome.remaining, wait_ms(outcome)))
    }
}

/// The limit the headers describe: a denying one first, then the one with
/// the fewest requests remaining, then the one that takes longest to reset.
/// (The RLS face answers each descriptor's `current_limit` with it too.)
pub fn most_restrictive<'a>(
    limits: impl IntoIterator<Item = (&'a str, &'a Limit, &'a LimitOutcome)>,
) -> Option<(&'a str, &'a Limit, &'a LimitOutcome)> {
    limits.into_iter().min_by_key(|(_, _, o)| (o.allowed, o.remaining, std::cmp::Reverse(wait_ms(o))))
}

impl RateLimitHeaders {
    /// The headers for one limit with `remaining` requests left, `wait_ms` from resetting.
    pub fn of(name: &str, limit: &Limit, remaining: u64, wait_ms: u64) -> RateLimitHeaders {
        // Written piece by piece, not with `format!`: a denial from the
        // over-limit cache builds these on its every request.
        let (q, window) = WireLimit::with_cost(limit, 1).quota();
        let mut policy = item(name, "q", q.into());
        match window {
            Some(w_ms) => push_param(&mut policy, "w", secs(w_ms.get())),
            None => policy.push_str(";qu=\"concurrent-requests\""),
        }
        let mut ratelimit = item(name, "r", remaining);
        push_param(&mut ratelimit, "t", ceil_secs(wait_ms));
        RateLimitHeaders { policy, ratelimit }
    }
}

/// `"name";key=value`.
fn item(name: &str, key: &str, value: u64) -> String {
    let mut out = String::with_capacity(name.len() + 48);
    out.push('"');
    out.push_str(name);
    out.push('"');
    push_param(&mut out, key, value);
    out
}

/// `;key=value`, the value in decimal.
fn push_param(out: &mut String, key: &str, value: u64) {
    out.push(';');
    out.push_str(key);
    out.push('=');
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = value;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend(digits[at..].iter().map(|&d| char::from(d)));
}

/// For a denying limit, until it would admit; otherwise until it resets.
pub fn wait_ms(o: &LimitOutcome) -> u64 {
    if o.allowed {
        o.reset_ms.get()
    } else {
        o.reset_ms.max(o.retry_after_ms.unwrap_or(Millis(0))).get()
    }
}

/// A window in whole seconds: rounded up, at least 1.
fn secs(ms: u64) -> u64 {
    ceil_secs(ms).max(1)
}

fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policies::units::Micros;

    fn limit(json: &str) -> Limit {
        serde_json::from_str(json).expect("a limit")
    }

    fn outcome(allowed: bool, remaining: u64, reset_ms: u64, retry: Option<u64>) -> LimitOutcome {
        LimitOutcome {
            allowed,
            remaining,
            reset_ms: Millis(reset_ms),
            retry_after_ms: retry.map(Millis),
            reclaimed: 0,
            held_until_us: None,
            refunded_us: Micros(0),
        }
    }

    #[test]
    fn each_limit_type_gives_its_quota_and_window() {
        let h = |json: &str| RateLimitHeaders::of("p", &limit(json), 3, 1500).policy;
        assert_eq!(h(r#"{"type":"sliding_window","limit":25,"window":"5s"}"#), r#""p";q=25;w=5"#);
        assert_eq!(h(r#"{"type":"fixed_window","limit":100,"window":"1m"}"#), r#""p";q=100;w=60"#);
        assert_eq!(h(r#"{"type":"token_bucket","rate":100,"per":"1s","burst":500}"#), r#""p";q=500;w=5"#);
        assert_eq!(h(r#"{"type":"leaky_bucket","capacity":60,"drain":"60s"}"#), r#""p";q=60;w=60"#);
        assert_eq!(h(r#"{"type":"interval","every":"250ms"}"#), r#""p";q=1;w=1"#);
        assert_eq!(
            h(r#"{"type":"concurrency","limit":50,"lease":"30s"}"#),
            r#""p";q=50;qu="concurrent-requests""#
        );
        let r = RateLimitHeaders::of("p", &limit(r#"{"type":"interval","every":"1s"}"#), 3, 1500);
        assert_eq!(r.ratelimit, r#""p";r=3;t=2"#);
    }

    /// Numbers are written in decimal at every size, as `format!` would.
    #[test]
    fn numbers_are_written_whole() {
        let every = limit(r#"{"type":"interval","every":"1s"}"#);
        for n in [0, 1, 9, 10, 99, 100, 1_000_000_007, u64::MAX] {
            let h = RateLimitHeaders::of("p", &every, n, 0);
            assert_eq!(h.ratelimit, format!("\"p\";r={n};t=0"));
        }
    }

    #[test]
    fn the_most_restrictive_is_a_denying_limit_then_the_fewest_remaining() {
        let a = limit(r#"{"type":"sliding_window","limit":25,"window":"5s"}"#);
        let b = limit(r#"{"type":"sliding_window","limit":300,"window":"1m"}"#);
        let (oa, ob) = (outcome(true, 4, 5000, Some(0)), outcome(true, 200, 60000, Some(0)));
        let h = RateLimitHeaders::most_restrictive([("a", &a, &oa), ("b", &b, &ob)]).expect("headers");
        assert_eq!((h.policy.as_str(), h.ratelimit.as_str()), (r#""a";q=25;w=5"#, r#""a";r=4;t=5"#));
        let (oa, ob) = (outcome(true, 0, 100, Some(0)), outcome(false, 0, 1000, Some(30_001)));
        let h = RateLimitHeaders::most_restrictive([("a", &a, &oa), ("b", &b, &ob)]).expect("headers");
        assert_eq!((h.policy.as_str(), h.ratelimit.as_str()), (r#""b";q=300;w=60"#, r#""b";r=0;t=31"#));
        assert_eq!(RateLimitHeaders::most_restrictive([]), None);
    }
}
