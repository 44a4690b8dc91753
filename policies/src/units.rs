//! Validated scalars. Each type refuses a wrong value while it is parsed, so a
//! parsed document cannot hold one. Past parsing, times keep their unit in
//! their type: [`Millis`] on the wire, [`Micros`] in the algorithms.

use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

/// The largest count a limit may have.
pub const MAX_COUNT: u32 = 1_000_000_000;
/// The longest duration a window may have: one year.
pub const MAX_DURATION_MS: u64 = 365 * 24 * 3600 * 1000;
/// Parts per million: the unit of a rate's factor (`algorithm::rate`).
pub const PPM: u64 = 1_000_000;

/// `n * 1000`, saturating: as `n.saturating_mul(1000)`, without the
/// 128-bit multiply wasm32 makes of its overflow check (about 100 wasm
/// operators, on every cached denial of the filter).
pub fn times_1000(n: u64) -> u64 {
    if n > u64::MAX / 1000 {
        u64::MAX
    } else {
        n * 1000
    }
}

/// The time one unit of a bucket takes to refill, `count` units every
/// `period`, rounded up to a whole microsecond, so a bucket never refills
/// faster than asked.
pub fn per_unit(period: Millis, count: u32) -> Micros {
    Micros(period.as_micros().get().div_ceil(u64::from(count.max(1))))
}

/// For serde's `skip_serializing_if`.
pub(crate) fn is_false(b: &bool) -> bool {
    !b
}

/// For serde's `skip_serializing_if`.
pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Whole milliseconds, as the wire between the filter and the shim carries
/// them (`window_ms`, `retry_after_ms`, ...): a span, or a time since the
/// epoch (a test-mode `now_ms`). A plain number in JSON. Unlike
/// [`Duration`], any value, 0 included; the shim checks ranges where they
/// matter ([`WireLimit::validate`](crate::limit::WireLimit::validate)).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    borsh::BorshSerialize,
    borsh::BorshDeserialize,
)]
#[serde(transparent)]
pub struct Millis(pub u64);

impl Millis {
    pub fn get(self) -> u64 {
        self.0
    }

    /// The same time in microseconds, saturating: a wire value is untrusted.
    pub fn as_micros(self) -> Micros {
        Micros(times_1000(self.0))
    }
}

/// Whole microseconds, the algorithms' unit (`window_us`, `held_until_us`,
/// ...): a span, or a time since the epoch on the shim's clock. A plain
/// number in JSON.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    borsh::BorshSerialize,
    borsh::BorshDeserialize,
)]
#[serde(transparent)]
pub struct Micros(pub u64);

impl Micros {
    pub fn get(self) -> u64 {
        self.0
    }

    /// In milliseconds rounded up, so a wait is never told shorter than it is.
    pub fn ceil_millis(self) -> Millis {
        Millis(self.0.div_ceil(1000))
    }

    /// For serde's `skip_serializing_if`.
    pub(crate) fn is_zero(&self) -> bool {
        self.0 == 0
    }
}

/// A span of time in whole milliseconds, from 1 ms to one year. Written with a
/// unit: `250ms`, `5s`, `1m`, `2h`, `1d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(NonZeroU64);

impl Duration {
    pub fn from_millis(ms: u64) -> Option<Duration> {
        NonZeroU64::new(ms).filter(|ms| ms.get() <= MAX_DURATION_MS).map(Duration)
    }

    pub fn as_millis(self) -> u64 {
        self.0.get()
    }

    /// A span of `ms` in the document's notation (`1d`, `5m`, `250ms`), as
    /// the dashboard and messages show it; `0ms` for none.
    pub fn show(ms: u64) -> String {
        Duration::from_millis(ms).map_or(format!("{ms}ms"), |d| d.to_string())
    }

    /// The span as the wire carries it.
    pub fn to_millis(self) -> Millis {
        Millis(self.as_millis())
    }

    /// Parses `<digits><unit>`; `None` when the text is not of that form or out of range.
    pub fn parse(text: &str) -> Option<Duration> {
        let split = text.find(|c: char| !c.is_ascii_digit())?;
        let (digits, unit) = text.split_at(split);
        let n: u64 = digits.parse().ok()?;
        let unit_ms = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return None,
        };
        Duration::from_millis(n.checked_mul(unit_ms)?)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.as_millis();
        let units = [(86_400_000, "d"), (3_600_000, "h"), (60_000, "m"), (1_000, "s")];
        match units.iter().find(|(size, _)| ms.is_multiple_of(*size)) {
            Some((size, unit)) => write!(f, "{}{}", ms / size, unit),
            None => write!(f, "{ms}ms"),
        }
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Duration::parse(&text).ok_or_else(|| de::Error::custom(invalid_duration(&text)))
    }
}

/// Why `text` is not a [`Duration`].
pub(crate) fn invalid_duration(text: &str) -> String {
    format!("invalid duration {text:?} (expected e.g. \"5s\", \"250ms\"; from 1ms to 365d)")
}

/// How many requests a limit admits: from 1 to [`MAX_COUNT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Count(NonZeroU32);

impl Count {
    pub fn new(n: u64) -> Option<Count> {
        u32::try_from(n).ok().filter(|n| *n <= MAX_COUNT).and_then(NonZeroU32::new).map(Count)
    }

    pub fn get(self) -> u32 {
        self.0.get()
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        Count::new(n)
            .ok_or_else(|| de::Error::custom(format!("invalid count {n} (expected 1 to {MAX_COUNT})")))
    }
}

/// A policy name: 1 to 64 of `A-Z a-z 0-9 _ -`. Names appear in Redis keys,
/// stats and headers, so nothing else is allowed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyName(String);

impl PolicyName {
    pub fn new(name: &str) -> Option<PolicyName> {
        let valid = (1..=64).contains(&name.len())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        valid.then(|| PolicyName(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for PolicyName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        PolicyName::new(&name).ok_or_else(|| {
            de::Error::custom(format!("invalid policy name {name:?} (expected 1 to 64 of A-Z a-z 0-9 _ -)"))
        })
    }
}

/// A request header name, stored in lower case: 1 to 128 of `A-Z a-z 0-9 - _ .`,
/// optionally after a leading `:` for pseudo-headers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HeaderName(String);

impl HeaderName {
    pub fn new(name: &str) -> Option<HeaderName> {
        let body = name.strip_prefix(':').unwrap_or(name);
        let valid = (1..=128).contains(&body.len())
            && body.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        valid.then(|| HeaderName(name.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for HeaderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for HeaderName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        HeaderName::new(&name).ok_or_else(|| {
            de::Error::custom(format!("invalid header name {name:?} (expected e.g. \"x-api-key\")"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `times_1000` is `saturating_mul(1000)`, at and around the edge.
    #[test]
    fn times_1000_saturates_as_saturating_mul() {
        let edge = u64::MAX / 1000;
        for n in [0, 1, 999, 1_000_000, edge - 1, edge, edge + 1, u64::MAX - 1, u64::MAX] {
            assert_eq!(times_1000(n), n.saturating_mul(1000), "{n}");
        }
    }

    #[test]
    fn durations_parse_with_each_unit() {
        let ms = |t| Duration::parse(t).map(Duration::as_millis);
        assert_eq!(ms("250ms"), Some(250));
        assert_eq!(ms("5s"), Some(5_000));
        assert_eq!(ms("1m"), Some(60_000));
        assert_eq!(ms("2h"), Some(7_200_000));
        assert_eq!(ms("1d"), Some(86_400_000));
        assert_eq!(ms("365d"), Some(MAX_DURATION_MS));
    }

    #[test]
    fn durations_refuse_bad_text_and_range() {
        for bad in ["", "5", "s", "5 sec", "5S", "-1s", "0s", "0ms", "366d", "1.5s", "99999999999999999999d"]
        {
            assert_eq!(Duration::parse(bad), None, "{bad:?} should be refused");
        }
    }

    #[test]
    fn durations_display_in_the_largest_whole_unit() {
        let show = |t| Duration::parse(t).map(|d| d.to_string());
        assert_eq!(show("60s").as_deref(), Some("1m"));
        assert_eq!(show("1500ms").as_deref(), Some("1500ms"));
        assert_eq!(show("24h").as_deref(), Some("1d"));
    }

    /// Millis and Micros are plain numbers in JSON, so the wire is the same
    /// as when they were bare integers.
    #[test]
    fn millis_and_micros_are_plain_numbers_on_the_wire() {
        assert_eq!(serde_json::to_string(&Millis(5_000)).unwrap(), "5000");
        assert_eq!(serde_json::from_str::<Millis>("5000").unwrap(), Millis(5_000));
        assert_eq!(serde_json::to_string(&Some(Micros(7))).unwrap(), "7");
        assert_eq!(serde_json::from_str::<Option<Micros>>("null").unwrap(), None);
    }

    /// Microseconds become milliseconds rounded up, as every wait and reset
    /// a check reports; milliseconds become microseconds without overflowing.
    #[test]
    fn conversions_round_up_to_milliseconds_and_saturate_to_microseconds() {
        assert_eq!(Millis(5).as_micros(), Micros(5_000));
        assert_eq!(Millis(u64::MAX).as_micros(), Micros(u64::MAX));
        assert_eq!(Micros(0).ceil_millis(), Millis(0));
        assert_eq!(Micros(1).ceil_millis(), Millis(1));
        assert_eq!(Micros(1_000).ceil_millis(), Millis(1));
        assert_eq!(Micros(1_001).ceil_millis(), Millis(2));
        assert_eq!(Duration::parse("5s").map(Duration::to_millis), Some(Millis(5_000)));
    }

    #[test]
    fn counts_are_one_to_a_billion() {
        assert_eq!(Count::new(0), None);
        assert_eq!(Count::new(1).map(Count::get), Some(1));
        assert_eq!(Count::new(1_000_000_000).map(Count::get), Some(1_000_000_000));
        assert_eq!(Count::new(1_000_000_001), None);
        assert_eq!(Count::new(u64::MAX), None);
    }

    #[test]
    fn header_names_are_lower_cased_and_checked() {
        assert_eq!(HeaderName::new("X-Api-Key").map(|h| h.0), Some("x-api-key".into()));
        assert_eq!(HeaderName::new(":authority").map(|h| h.0), Some(":authority".into()));
        for bad in ["", ":", "a b", "a:b", "é"] {
            assert!(HeaderName::new(bad).is_none(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn policy_names_are_limited_to_a_safe_alphabet() {
        assert!(PolicyName::new("partner-api_2").is_some());
        assert!(PolicyName::new(&"a".repeat(64)).is_some());
        for bad in ["", "a b", "a{b}", "a:b", "é", &"a".repeat(65)] {
            assert!(PolicyName::new(bad).is_none(), "{bad:?} should be refused");
        }
    }
}
