//! The `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`
//! headers of draft-polli-ratelimit-headers-03 over every limit a call
//! met, as Limitador's server writes them with `--rate-limit-headers
//! DRAFT_VERSION_03` (the RLS face's `"header_format": "draft_version_03"`):
//!
//! ```text
//! X-RateLimit-Limit: 3, 3;w=86400, 30;w=86400;name="everyone"
//! X-RateLimit-Remaining: 0
//! X-RateLimit-Reset: 86012
//! ```
//!
//! The limits are ordered by what they have left, fewest first (ties keep
//! the call's order). `Limit` is the first one's quota, then every limit's
//! quota and window in whole seconds, and its name when it has one (`"`
//! written `'`); `Remaining` and `Reset` (whole seconds, rounded down) are
//! the first one's. A limit with no window (concurrency) has no `w`. A call
//! that met no limit has none of the three.
//!
//! Each limit shows what it holds, not what the IETF fields show: admitted,
//! after the call's cost; refused, before it (a refused call charges none),
//! and until its window ends.

/// One limit a call met, as the headers show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter<'a> {
    pub quota: u64,
    pub window_ms: Option<u64>,
    pub name: Option<&'a str>,
    pub remaining: u64,
    pub reset_ms: u64,
}

pub const LIMIT: &str = "X-RateLimit-Limit";
pub const REMAINING: &str = "X-RateLimit-Remaining";
pub const RESET: &str = "X-RateLimit-Reset";

/// The three headers of `counters`, sorted by name; none for no counter.
pub fn headers(mut counters: Vec<Counter<'_>>) -> Vec<(&'static str, String)> {
    counters.sort_by_key(|c| c.remaining);
    let Some(first) = counters.first() else { return Vec::new() };
    let mut limit = first.quota.to_string();
    for c in &counters {
        limit.push_str(&format!(", {}", c.quota));
        if let Some(w) = c.window_ms {
            limit.push_str(&format!(";w={}", w / 1000));
        }
        if let Some(name) = c.name {
            limit.push_str(&format!(";name=\"{}\"", name.replace('"', "'")));
        }
    }
    vec![
        (LIMIT, limit),
        (REMAINING, first.remaining.to_string()),
        (RESET, (first.reset_ms / 1000).to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(quota: u64, remaining: u64, reset_ms: u64, name: Option<&str>) -> Counter<'_> {
        Counter { quota, window_ms: Some(60_000), name, remaining, reset_ms }
    }

    /// The fewest remaining first, every limit listed with its window and
    /// name, the first one's remaining and reset in whole seconds.
    #[test]
    fn the_limit_with_the_fewest_remaining_leads_and_every_limit_is_listed() {
        let got = headers(vec![counter(30, 12, 59_999, Some("all \"users\"")), counter(3, 0, 41_500, None)]);
        assert_eq!(
            got,
            vec![
                (LIMIT, r#"3, 3;w=60, 30;w=60;name="all 'users'""#.to_string()),
                (REMAINING, "0".to_string()),
                (RESET, "41".to_string()),
            ]
        );
    }

    /// Ties keep the call's order; a limit with no window has no `w`.
    #[test]
    fn ties_keep_the_calls_order() {
        let mut lease = counter(5, 2, 0, None);
        lease.window_ms = None;
        let got = headers(vec![counter(4, 2, 9_000, None), lease]);
        assert_eq!(got[0].1, "4, 4;w=60, 5");
        assert_eq!(got[2].1, "9");
    }

    #[test]
    fn a_call_that_met_no_limit_has_no_headers() {
        assert!(headers(Vec::new()).is_empty());
    }
}
