//! The IETF `RateLimit` and `RateLimit-Policy` headers
//! (draft-ietf-httpapi-ratelimit-headers-11, structured fields):
//!
//! ```text
//! RateLimit-Policy: "partner-api";q=25;w=5
//! RateLimit: "partner-api";r=0;t=3
//! ```
//!
//! Sluice describes one limit, the most restrictive of those that applied:
//! a denying one first (the one with an unknown wait, then the longest:
//! the wait `retry-after` shows), then the one with the fewest units
//! remaining, then the one whose next unit is furthest off. Its item is
//! named after its policy.
//!
//! `q` is the limit's quota, `w` its window in whole seconds (rounded up):
//! for a token bucket the time to refill the whole burst, for a leaky bucket
//! its drain, for `interval` `q=1` and its period, for `points` its capacity
//! and refill. A `concurrency` limit has no window: `q` and
//! `qu="concurrent-requests"`.
//!
//! `r` and `t` are [`Fields`], computed here and nowhere else: from the
//! shim's outcome ([`Fields::of`]) and from the over-limit cache's wait
//! ([`Fields::refused`]), which give the same fields for the same state.
//! `t` is the seconds until *more* quota is available (draft -11), see
//! [`Fields`] for each kind.

use sluice_policies::algorithm::Algorithm;
use sluice_policies::units::{times_1000, Millis};
use sluice_policies::wire::{LimitOutcome, WireLimit};
use sluice_policies::Limit;

use crate::decision::retry_after_secs;

/// The two header values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitHeaders {
    pub policy: String,
    pub ratelimit: String,
}

/// A limit the headers can describe: as sent to the shim ([`WireLimit`],
/// with its cost) or as the document says it (a `points` cost of 1).
pub trait HeaderLimit {
    fn wire(&self) -> WireLimit;
}

impl HeaderLimit for WireLimit {
    fn wire(&self) -> WireLimit {
        *self
    }
}

impl HeaderLimit for Limit {
    fn wire(&self) -> WireLimit {
        WireLimit::with_cost(self, 1)
    }
}

/// What the `RateLimit` item says of one limit: `r`, the units available,
/// and `t`, the wait until more are, in milliseconds (shown in seconds,
/// rounded up). By kind:
///
/// | kind | admitted: `t` | refused: `r`; `t` |
/// | --- | --- | --- |
/// | `fixed_window`, calendar windows, approximate `sliding_window` | the window's end | 0; the window's end |
/// | `sliding_window` | the oldest entry's expiry | 0; until the request fits |
/// | `token_bucket`, `leaky_bucket`, `interval` | the next unit | 0; the next unit |
/// | `points` | the next point | the points in the bucket; until the cost fits |
/// | calendar `points` | the window's end | 0; the window's end |
/// | `concurrency` | unknown: the retry-after a refusal shows (1 s) | what is free; 1 s |
///
/// A refusal's `t` is its `retry-after` (both [`retry_after_secs`]); its
/// `r` follows from its wait alone, so the over-limit cache, which keeps
/// only the wait, gives the same fields as the shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields {
    /// `r`.
    pub remaining: u64,
    /// `t` in milliseconds.
    pub wait_ms: u64,
}

impl Fields {
    /// The fields of `limit` (as sent) from the shim's `outcome` for it.
    pub fn of(limit: &WireLimit, o: &LimitOutcome) -> Fields {
        if !o.allowed {
            return match o.retry_after_ms {
                Some(wait) => Fields::refused(limit, wait),
                // Unknown (a concurrency limit; a cost beyond the bucket):
                // as long as the retry-after it gets.
                None => Fields { remaining: o.remaining, wait_ms: unknown_wait_ms() },
            };
        }
        let reset_ms = o.reset_ms.get();
        let wait_ms = match (limit, Algorithm::of(limit)) {
            (WireLimit::Concurrency { .. }, _) => unknown_wait_ms(),
            (_, Algorithm::Gcra { interval_us, burst, .. }) => {
                next_unit_ms(reset_ms, o.remaining, interval_us.get(), burst)
            }
            _ => reset_ms,
        };
        Fields { remaining: o.remaining, wait_ms }
    }

    /// The fields of `limit` (as sent) refusing a request that it would
    /// admit in `wait`: `t` the wait, as `retry-after` shows it; `r` what
    /// the limit holds meanwhile: for a bucket, its cost less the units
    /// still to come; for a window, nothing.
    pub fn refused(limit: &WireLimit, wait: Millis) -> Fields {
        let remaining = match Algorithm::of(limit) {
            Algorithm::Gcra { interval_us, cost, .. } => {
                let missing = wait.as_micros().get().div_ceil(interval_us.get().max(1));
                cost.saturating_sub(missing.max(1))
            }
            _ => 0,
        };
        Fields { remaining, wait_ms: times_1000(retry_after_secs(Some(wait))) }
    }
}

/// The wait shown where nobody knows it: the retry-after of an unknown wait.
fn unknown_wait_ms() -> u64 {
    retry_after_secs(None).saturating_mul(1000)
}

/// A bucket's next unit, `reset_ms` (when it is full again) from now,
/// `remaining` units in it, one every `interval_us`, `burst` at most: it
/// holds `remaining + 1` once its fill time has come down to
/// `tau - (remaining + 1) * interval`. A full bucket gains none: 0.
fn next_unit_ms(reset_ms: u64, remaining: u64, interval_us: u64, burst: u64) -> u64 {
    let reset_us = reset_ms.saturating_mul(1000);
    let tau = interval_us.saturating_mul(burst);
    let to_next = reset_us.saturating_add(remaining.saturating_add(1).saturating_mul(interval_us));
    to_next.saturating_sub(tau).min(reset_us).div_ceil(1000)
}

impl RateLimitHeaders {
    pub const POLICY: &'static str = "ratelimit-policy";
    pub const RATELIMIT: &'static str = "ratelimit";

    /// The headers for the most restrictive of `limits`: each a policy name,
    /// a limit and the shim's outcome for it.
    pub fn most_restrictive<'a, L: HeaderLimit + 'a>(
        limits: impl IntoIterator<Item = (&'a str, &'a L, &'a LimitOutcome)>,
    ) -> Option<RateLimitHeaders> {
        let (name, limit, outcome) = most_restrictive(limits)?;
        let wire = limit.wire();
        Some(RateLimitHeaders::of(name, &wire, Fields::of(&wire, outcome)))
    }
}

/// The limit the headers describe: a denying one first (an unknown wait,
/// then the first of the longest: the one `retry-after` shows), else the
/// one with the fewest units remaining, then the one whose next unit is
/// furthest off.
/// (The RLS face answers each descriptor's `current_limit` with it too.)
pub fn most_restrictive<'a, L: HeaderLimit + 'a>(
    limits: impl IntoIterator<Item = (&'a str, &'a L, &'a LimitOutcome)>,
) -> Option<(&'a str, &'a L, &'a LimitOutcome)> {
    use std::cmp::Reverse;
    // Among refusals the first of the longest waits, as the over-limit
    // cache records it.
    limits.into_iter().min_by_key(|(_, l, o)| {
        let f = Fields::of(&l.wire(), o);
        match o.allowed {
            // The wait in milliseconds, not `t`'s whole seconds: two
            // limits in the same second are told apart as the cache does.
            false => (false, o.retry_after_ms.is_some(), 0, Reverse(o.retry_after_ms.map_or(0, Millis::get))),
            true => (true, false, f.remaining, Reverse(f.wait_ms)),
        }
    })
}

impl RateLimitHeaders {
    /// The headers for `limit` (as sent) showing `fields`.
    pub fn of(name: &str, limit: &WireLimit, fields: Fields) -> RateLimitHeaders {
        // Written piece by piece, not with `format!`: a denial from the
        // over-limit cache builds these on its every request.
        let (q, window) = limit.quota();
        let mut policy = item(name, "q", q.into());
        match window {
            Some(w_ms) => push_param(&mut policy, "w", secs(w_ms.get())),
            None => policy.push_str(";qu=\"concurrent-requests\""),
        }
        let mut ratelimit = item(name, "r", fields.remaining);
        push_param(&mut ratelimit, "t", ceil_secs(fields.wait_ms));
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

/// Draft 03's remaining and reset (the RLS face's `limit_remaining` and
/// `duration_until_reset`), `wait_ms` the reset: for an admitting limit,
/// what it has left and until it resets; for a refusing one, what its
/// `RateLimit` item shows ([`Fields::refused`]: until it would admit), read
/// from its wait alone, so the shim's outcome and the over-limit cache's
/// entry give the same at the same moment; a refusal whose wait nobody
/// knows, what it has left and until it resets.
pub fn draft03(limit: &WireLimit, o: &LimitOutcome) -> Fields {
    match (o.allowed, o.retry_after_ms) {
        (false, Some(wait)) => Fields::refused(limit, wait),
        _ => Fields { remaining: o.remaining, wait_ms: o.reset_ms.get() },
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

    fn limit(json: &str) -> WireLimit {
        WireLimit::with_cost(&serde_json::from_str(json).expect("a limit"), 1)
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

    fn fields(remaining: u64, wait_ms: u64) -> Fields {
        Fields { remaining, wait_ms }
    }

    #[test]
    fn each_limit_type_gives_its_quota_and_window() {
        let h = |json: &str| RateLimitHeaders::of("p", &limit(json), fields(3, 1500)).policy;
        assert_eq!(h(r#"{"type":"sliding_window","limit":25,"window":"5s"}"#), r#""p";q=25;w=5"#);
        assert_eq!(h(r#"{"type":"fixed_window","limit":100,"window":"1m"}"#), r#""p";q=100;w=60"#);
        assert_eq!(h(r#"{"type":"token_bucket","rate":100,"per":"1s","burst":500}"#), r#""p";q=500;w=5"#);
        assert_eq!(h(r#"{"type":"leaky_bucket","capacity":60,"drain":"60s"}"#), r#""p";q=60;w=60"#);
        assert_eq!(h(r#"{"type":"interval","every":"250ms"}"#), r#""p";q=1;w=1"#);
        assert_eq!(
            h(r#"{"type":"concurrency","limit":50,"lease":"30s"}"#),
            r#""p";q=50;qu="concurrent-requests""#
        );
        let r = RateLimitHeaders::of("p", &limit(r#"{"type":"interval","every":"1s"}"#), fields(3, 1500));
        assert_eq!(r.ratelimit, r#""p";r=3;t=2"#);
    }

    /// Draft -11's `r` and `t` for each limit kind, admitted and refused,
    /// from the outcome the script replies (remaining, reset, retry): `t`
    /// is the wait for *more* quota, and a refusal's `t` its retry-after.
    /// Regression: a `points` refusal showed the time to refill the whole
    /// bucket (`t=78787` beside `retry-after: 1344`), a concurrency refusal
    /// the lease (`t=30` beside `retry-after: 1`).
    #[test]
    fn each_limit_kind_gives_draft_11_fields() {
        let points = |cost| {
            let l: Limit =
                serde_json::from_str(r#"{"type":"points","capacity":1000,"refill":"100s","cost":1}"#)
                    .expect("a limit");
            WireLimit::with_cost(&l, cost)
        };
        #[rustfmt::skip]
        let table: [(&str, WireLimit, LimitOutcome, Fields); 18] = [
            // A window frees capacity at its end, admitted or refused.
            ("fixed_window admitted", limit(r#"{"type":"fixed_window","limit":10,"window":"1m"}"#),
             outcome(true, 4, 12_345, Some(0)), fields(4, 12_345)),
            ("fixed_window refused", limit(r#"{"type":"fixed_window","limit":10,"window":"1m"}"#),
             outcome(false, 0, 12_345, Some(12_345)), fields(0, 13_000)),
            // A first_hit window's end is its first request's time plus
            // the window: the key's own expiry in Redis, less a second.
            ("first_hit admitted", limit(r#"{"type":"fixed_window","limit":10,"window":"1m","start":"first_hit"}"#),
             outcome(true, 4, 41_500, Some(0)), fields(4, 41_500)),
            ("first_hit refused", limit(r#"{"type":"fixed_window","limit":10,"window":"1m","start":"first_hit"}"#),
             outcome(false, 0, 41_500, Some(41_500)), fields(0, 42_000)),
            ("calendar admitted", limit(r#"{"type":"fixed_window","limit":10,"window":{"calendar":"day","zone":"UTC"}}"#),
             outcome(true, 9, 3_600_000, Some(0)), fields(9, 3_600_000)),
            // The oldest entry's expiry; refused, when the request fits.
            ("sliding_window admitted", limit(r#"{"type":"sliding_window","limit":10,"window":"1m"}"#),
             outcome(true, 3, 40_000, Some(0)), fields(3, 40_000)),
            ("sliding_window refused", limit(r#"{"type":"sliding_window","limit":10,"window":"1m"}"#),
             outcome(false, 0, 40_000, Some(40_000)), fields(0, 40_000)),
            ("approximate refused", limit(r#"{"type":"sliding_window","limit":10,"window":"1m","approximate":true}"#),
             outcome(false, 0, 50_000, Some(7_001)), fields(0, 8_000)),
            // A bucket: the next unit, not the whole refill.
            ("token_bucket admitted", limit(r#"{"type":"token_bucket","rate":10,"per":"1s","burst":10}"#),
             outcome(true, 9, 100, Some(0)), fields(9, 100)),
            ("token_bucket drained", limit(r#"{"type":"token_bucket","rate":10,"per":"1s","burst":10}"#),
             outcome(true, 0, 1_000, Some(0)), fields(0, 100)),
            ("token_bucket refused", limit(r#"{"type":"token_bucket","rate":10,"per":"1s","burst":10}"#),
             outcome(false, 0, 1_040, Some(40)), fields(0, 1_000)),
            ("token_bucket full", limit(r#"{"type":"token_bucket","rate":10,"per":"1s","burst":10}"#),
             outcome(true, 10, 0, Some(0)), fields(10, 0)),
            ("leaky_bucket admitted", limit(r#"{"type":"leaky_bucket","capacity":60,"drain":"60s"}"#),
             outcome(true, 57, 2_500, Some(0)), fields(57, 500)),
            ("interval admitted", limit(r#"{"type":"interval","every":"2s"}"#),
             outcome(true, 0, 2_000, Some(0)), fields(0, 2_000)),
            // Points: one point every 100 ms; refused, until the cost fits,
            // with what the bucket holds meanwhile.
            ("points admitted", points(300), outcome(true, 500, 50_000, Some(0)), fields(500, 100)),
            ("points refused", points(300), outcome(false, 263, 73_601, Some(3_601)), fields(263, 4_000)),
            // Concurrency: a slot's release is unknown: the retry-after.
            ("concurrency admitted", limit(r#"{"type":"concurrency","limit":5,"lease":"30s"}"#),
             outcome(true, 2, 29_000, Some(0)), fields(2, 1_000)),
            ("concurrency refused", limit(r#"{"type":"concurrency","limit":5,"lease":"30s"}"#),
             outcome(false, 0, 29_000, None), fields(0, 1_000)),
        ];
        for (name, limit, o, want) in table {
            assert_eq!(Fields::of(&limit, &o), want, "{name}");
            if !o.allowed {
                assert_eq!(
                    want.wait_ms,
                    retry_after_secs(o.retry_after_ms) * 1000,
                    "{name}: t is retry-after"
                );
            }
        }
    }

    /// Numbers are written in decimal at every size, as `format!` would.
    #[test]
    fn numbers_are_written_whole() {
        let every = limit(r#"{"type":"interval","every":"1s"}"#);
        for n in [0, 1, 9, 10, 99, 100, 1_000_000_007, u64::MAX] {
            let h = RateLimitHeaders::of("p", &every, fields(n, 0));
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
        assert_eq!(RateLimitHeaders::most_restrictive::<WireLimit>([]), None);
    }

    /// Of two refusals, the longer wait is shown, whatever remains: the
    /// wait `retry-after` shows.
    #[test]
    fn of_two_refusals_the_longer_wait_is_shown() {
        let a = limit(r#"{"type":"sliding_window","limit":25,"window":"5s"}"#);
        let p: Limit = serde_json::from_str(r#"{"type":"points","capacity":1000,"refill":"100s","cost":1}"#)
            .expect("a limit");
        let b = WireLimit::with_cost(&p, 900);
        let (oa, ob) = (outcome(false, 0, 1000, Some(1000)), outcome(false, 500, 50_000, Some(40_000)));
        let h = RateLimitHeaders::most_restrictive([("a", &a, &oa), ("b", &b, &ob)]).expect("headers");
        assert_eq!(h.ratelimit, r#""b";r=500;t=40"#);
    }

    /// A concurrency limit and a window that both refuse: the wait is
    /// unknown (a slot may free at any moment), so `retry-after` is 1 and
    /// the fields describe the concurrency limit with `t=1`, as
    /// docs/policy-reference.md's "What a denied request gets" says; never
    /// the window's 30 s beside a retry-after of 1.
    #[test]
    fn a_concurrency_and_a_window_refusing_show_the_unknown_wait() {
        use crate::decision::retry_after_secs;
        let pool = limit(r#"{"type":"concurrency","limit":5,"lease":"30s"}"#);
        let window = limit(r#"{"type":"fixed_window","limit":10,"window":"1m"}"#);
        let (op, ow) = (outcome(false, 0, 29_000, None), outcome(false, 0, 30_000, Some(30_000)));
        let retry = retry_after_secs(
            [&op, &ow].iter().try_fold(Millis(0), |m, o| o.retry_after_ms.map(|w| m.max(w))),
        );
        for order in [
            [("pool", &pool, &op), ("window", &window, &ow)],
            [("window", &window, &ow), ("pool", &pool, &op)],
        ] {
            let h = RateLimitHeaders::most_restrictive(order).expect("headers");
            assert_eq!(h.ratelimit, format!(r#""pool";r=0;t={retry}"#));
        }
        assert_eq!(retry, 1);
    }
}
