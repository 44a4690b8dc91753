//! Upstream feedback: which answers of the partner mean "slow down", and for
//! how long. A policy's `upstream` setting turns it on; the filter reads each
//! response of a request the policy admitted through [`Upstream::throttle`],
//! and the shim records the pause fleet-wide, extend-only.
//!
//! The partner knows its limits better than the policy does, and says so in
//! three common ways, all read here:
//!
//! - `Retry-After`: delta-seconds or an HTTP date (RFC 9110);
//! - the IETF `RateLimit` field (draft-ietf-httpapi-ratelimit-headers):
//!   items whose `r` (remaining) is 0 pause for `t` seconds;
//! - `X-RateLimit-Remaining` with `X-RateLimit-Reset`, the reset given as
//!   seconds from now or as a Unix time (`reset`, because partners differ).
//!
//! A throttling status (`statuses`, default 429 and 503) pauses for the
//! longest hint. A 429 with no usable hint pauses for `default_pause`; any
//! other throttling status needs a hint (a 503 without `Retry-After` is an
//! outage, not a limit). Remaining 0 with a reset pauses even on a 200.
//!
//! Hostile or broken values never lock a key out for long: a pause beyond
//! `max_pause` is cut to it, and a hint that is negative, malformed or in
//! the past is ignored; both are reported as `clamped`, so they can be
//! counted. Disagreeing hints: the longest usable one wins (a pause only
//! ever extends).

use std::time::{Duration as StdDuration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::invalid::Invalid;
use crate::units::{Duration, Millis, PPM};

/// A policy's `upstream` setting. `"upstream": {}` takes every default.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// Statuses that mean "slow down": a 429 pauses even without a usable
    /// header (for `default_pause`); any other listed status needs one.
    #[serde(default = "default_statuses")]
    pub statuses: Vec<u16>,
    /// How `X-RateLimit-Reset` counts: `seconds` from now, a `unix` time in
    /// seconds, or `auto` (a value above 10^9 is a Unix time).
    #[serde(default)]
    pub reset: ResetFormat,
    /// The remaining-count header of the common `X-RateLimit-*` pair.
    #[serde(default = "default_remaining_header")]
    pub remaining_header: String,
    /// The reset header of the common `X-RateLimit-*` pair.
    #[serde(default = "default_reset_header")]
    pub reset_header: String,
    /// The pause after a 429 that carries no usable header.
    #[serde(default = "default_pause")]
    pub default_pause: Duration,
    /// The longest pause any answer can cause; longer ones are cut to it.
    #[serde(default = "default_max_pause")]
    pub max_pause: Duration,
    /// Learn the partner's rate from its refusals: `true` (the default) or
    /// settings to turn it on, `false` to keep the policy's own rate.
    #[serde(default)]
    pub adapt: Adaptation,
}

/// Whether a refusal also lowers the key's rate, and how.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Adaptation {
    Off,
    On(Adapt),
}

impl Default for Adaptation {
    fn default() -> Self {
        Adaptation::On(Adapt::default())
    }
}

/// Rate adaptation. A pause is not a rate: when it ends, a policy that
/// overstates the partner's limits sends too much again. So the first
/// refusal after a key ran freely also multiplies the rate of its time
/// limits by `decrease`; the rate then climbs back linearly, by the policy's
/// whole rate every `recover`, and never goes below `min` of it
/// (`algorithm::rate`).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Adapt {
    /// The factor a refusal multiplies the rate by: above 0, below 1.
    #[serde(default = "default_decrease")]
    pub decrease: f64,
    /// How long the rate takes to climb from nothing back to the policy's own.
    #[serde(default = "default_recover")]
    pub recover: Duration,
    /// The lowest the rate goes, as a share of the policy's own: above 0, at most 1.
    #[serde(default = "default_min")]
    pub min: f64,
}

impl Default for Adapt {
    fn default() -> Self {
        Adapt { decrease: default_decrease(), recover: default_recover(), min: default_min() }
    }
}

impl Adapt {
    /// As the shim takes it.
    pub fn slowdown(&self) -> Slowdown {
        Slowdown {
            decrease_ppm: ppm(self.decrease),
            recover_ms: self.recover.to_millis(),
            min_ppm: ppm(self.min),
        }
    }
}

/// How a refusal lowers a key's rate, in parts per million of the policy's
/// own (`algorithm::rate`): the filter sends it from the policy's `adapt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slowdown {
    /// The factor the rate is multiplied by.
    pub decrease_ppm: u64,
    /// How long the rate takes to climb from nothing back to the policy's own.
    pub recover_ms: Millis,
    /// The lowest the rate goes.
    pub min_ppm: u64,
}

impl Slowdown {
    /// The longest `recover`: a day.
    pub const MAX_RECOVER_MS: u64 = 86_400_000;
    /// The lowest `min`: a thousandth of the policy's rate.
    pub const LEAST_MIN_PPM: u64 = 1_000;

    /// The bounds the parser and the shim both hold it to; the error starts
    /// with the field's name.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.decrease_ppm == 0 || self.decrease_ppm >= PPM {
            return Err(Invalid::at(
                "decrease",
                format!("above 0 and below 1, got {}", self.decrease_ppm as f64 / PPM as f64),
            ));
        }
        let recover_ms = self.recover_ms.get();
        if recover_ms == 0 || recover_ms > Self::MAX_RECOVER_MS {
            return Err(Invalid::at("recover", format!("above 0 and at most 1d, got {recover_ms} ms")));
        }
        if !(Self::LEAST_MIN_PPM..=PPM).contains(&self.min_ppm) {
            return Err(Invalid::at(
                "min",
                format!("at least 0.001 and at most 1, got {}", self.min_ppm as f64 / PPM as f64),
            ));
        }
        Ok(())
    }
}

fn ppm(share: f64) -> u64 {
    (share * PPM as f64).round() as u64
}

fn default_decrease() -> f64 {
    0.5
}

fn default_recover() -> Duration {
    Duration::from_millis(1_800_000).unwrap_or_else(|| unreachable!("30 min is a valid duration"))
}

fn default_min() -> f64 {
    0.05
}

impl<'de> Deserialize<'de> for Adaptation {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Toggle(bool),
            Settings(Adapt),
        }
        Ok(match Raw::deserialize(d)? {
            Raw::Toggle(false) => Adaptation::Off,
            Raw::Toggle(true) => Adaptation::default(),
            Raw::Settings(adapt) => Adaptation::On(adapt),
        })
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Adaptation {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Adaptation".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let adapt = generator.subschema_for::<Adapt>();
        schemars::json_schema!({
            "description": "`true` (the default) or settings: a refusal also lowers the key's rate; `false`: only pauses.",
            "anyOf": [{"type": "boolean"}, adapt]
        })
    }
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream {
            statuses: default_statuses(),
            reset: ResetFormat::default(),
            remaining_header: default_remaining_header(),
            reset_header: default_reset_header(),
            default_pause: default_pause(),
            max_pause: default_max_pause(),
            adapt: Adaptation::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ResetFormat {
    #[default]
    Auto,
    Seconds,
    Unix,
}

fn default_statuses() -> Vec<u16> {
    vec![429, 503]
}

fn default_remaining_header() -> String {
    "x-ratelimit-remaining".into()
}

fn default_reset_header() -> String {
    "x-ratelimit-reset".into()
}

fn default_pause() -> Duration {
    Duration::from_millis(1_000).unwrap_or_else(|| unreachable!("1 s is a valid duration"))
}

fn default_max_pause() -> Duration {
    Duration::from_millis(300_000).unwrap_or_else(|| unreachable!("5 min is a valid duration"))
}

/// A value above this in `X-RateLimit-Reset` is a Unix time under `auto`
/// (10^9 s is 2001; no partner resets 31 years from now).
const UNIX_THRESHOLD: u64 = 1_000_000_000;

/// The pause one of the partner's responses asks for: the key waits
/// `pause_ms` from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartnerPause {
    pub pause_ms: u64,
    /// The partner refused the call (a throttling status), as opposed to
    /// saying on a good answer that nothing is left: only a refusal teaches
    /// that the rate is too high.
    pub refused: bool,
    /// A hint was cut to `max_pause`, or ignored as broken (negative,
    /// malformed, in the past).
    pub clamped: bool,
}

/// One header's reading: a pause, or present but unusable.
enum Hint {
    Pause(u64),
    Broken,
}

/// The longest `max_pause`: a day, the most the shim records.
pub const MAX_PAUSE_MS: u64 = 86_400_000;

impl Upstream {
    /// Checks what serde cannot: statuses are HTTP statuses, header names
    /// are lower-case names, `max_pause` is at most a day and covers
    /// `default_pause`. The error starts with the field's name.
    pub fn validate(&self) -> Result<(), Invalid> {
        if let Some(s) = self.statuses.iter().find(|s| !(100..=599).contains(*s)) {
            return Err(Invalid::at("statuses", format!("{s} is not an HTTP status (100 to 599)")));
        }
        for (field, name) in
            [("remaining_header", &self.remaining_header), ("reset_header", &self.reset_header)]
        {
            if crate::HeaderName::new(name).is_none_or(|h| h.as_str() != name) {
                return Err(Invalid::at(field, format!("{name:?} is not a lower-case header name")));
            }
        }
        if self.max_pause.as_millis() > MAX_PAUSE_MS {
            return Err(Invalid::at("max_pause", format!("at most 1d, got {}", self.max_pause)));
        }
        if let Adaptation::On(adapt) = self.adapt {
            adapt.slowdown().validate().map_err(|e| e.within("adapt"))?;
        }
        if self.default_pause > self.max_pause {
            return Err(Invalid::at(
                "default_pause",
                format!("{} is longer than max_pause {}", self.default_pause, self.max_pause),
            ));
        }
        Ok(())
    }

    /// The pause this response calls for, if any. `header` reads a response
    /// header by lower-case name; `now_ms` is the proxy's clock in
    /// milliseconds since the epoch (for HTTP dates and Unix resets).
    pub fn throttle<'a>(
        &self,
        status: u16,
        header: impl Fn(&str) -> Option<&'a [u8]>,
        now_ms: u64,
    ) -> Option<PartnerPause> {
        let throttling = self.statuses.contains(&status);
        let mut hints: Vec<Hint> = Vec::new();
        if throttling {
            hints.extend(header("retry-after").map(|v| retry_after(v, now_ms)));
        }
        hints.extend(header("ratelimit").and_then(ratelimit_field));
        let remaining = header(&self.remaining_header).map(integer);
        if let (Some(Some(left)), Some(reset)) = (remaining, header(&self.reset_header)) {
            if left <= 0 {
                hints.push(self.reset(reset, now_ms));
            }
        }
        let broken = hints.iter().any(|h| matches!(h, Hint::Broken));
        let longest =
            hints.iter().filter_map(|h| if let Hint::Pause(ms) = h { Some(*ms) } else { None }).max();
        let pause = match (longest, throttling && status == 429) {
            (Some(ms), _) => ms,
            (None, true) => self.default_pause.as_millis(),
            (None, false) => return None,
        };
        let max = self.max_pause.as_millis();
        Some(PartnerPause { pause_ms: pause.min(max), refused: throttling, clamped: broken || pause > max })
    }

    fn reset(&self, value: &[u8], now_ms: u64) -> Hint {
        let Some(n) = integer(value).and_then(|n| u64::try_from(n).ok()) else { return Hint::Broken };
        let unix = match self.reset {
            ResetFormat::Seconds => false,
            ResetFormat::Unix => true,
            ResetFormat::Auto => n > UNIX_THRESHOLD,
        };
        if unix {
            until(n.saturating_mul(1000), now_ms)
        } else {
            Hint::Pause(n.saturating_mul(1000))
        }
    }
}

/// A pause until `at_ms`; a time already past is broken.
fn until(at_ms: u64, now_ms: u64) -> Hint {
    match at_ms.checked_sub(now_ms) {
        Some(ms) if ms > 0 => Hint::Pause(ms),
        _ => Hint::Broken,
    }
}

/// A header value as a whole number, if it is one.
fn integer(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// `Retry-After`: delta-seconds or an HTTP date.
fn retry_after(value: &[u8], now_ms: u64) -> Hint {
    let Ok(text) = std::str::from_utf8(value) else { return Hint::Broken };
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // Digits beyond u64 are a hostile value: as long as possible, then cut.
        return Hint::Pause(text.parse::<u64>().unwrap_or(u64::MAX).saturating_mul(1000));
    }
    match httpdate::parse_http_date(text).ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()) {
        Some(at) => until(millis(at), now_ms),
        None => Hint::Broken,
    }
}

fn millis(d: StdDuration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The IETF `RateLimit` field: a list of items with `r` (remaining) and `t`
/// (seconds until the quota resets). The longest `t` among items with no
/// quota left; nothing if every item still has some.
fn ratelimit_field(value: &[u8]) -> Option<Hint> {
    let Ok(list) = sfv::Parser::new(value).parse::<sfv::List>() else { return Some(Hint::Broken) };
    let mut longest: Option<Hint> = None;
    for entry in &list {
        let sfv::ListEntry::Item(item) = entry else { continue };
        let param = |name: &str| item.params.iter().find(|(k, _)| k.as_str() == name).map(|(_, v)| v);
        let (Some(r), Some(t)) = (param("r"), param("t")) else { continue };
        let (Some(r), Some(t)) = (r.as_integer().map(i64::from), t.as_integer().map(i64::from)) else {
            longest = longest.or(Some(Hint::Broken));
            continue;
        };
        if r > 0 {
            continue;
        }
        let hint = match u64::try_from(t) {
            Ok(secs) if secs > 0 => Hint::Pause(secs.saturating_mul(1000)),
            _ => Hint::Broken,
        };
        longest = match (longest, hint) {
            (Some(Hint::Pause(a)), Hint::Pause(b)) => Some(Hint::Pause(a.max(b))),
            (Some(Hint::Pause(a)), Hint::Broken) => Some(Hint::Pause(a)),
            (_, hint) => Some(hint),
        };
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-23 12:00:00 UTC.
    const NOW: u64 = 1_795_435_200_000;

    fn throttle(status: u16, headers: &[(&str, &str)]) -> Option<PartnerPause> {
        Upstream::default()
            .throttle(status, |name| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_bytes()), NOW)
            // Whether the call was refused has its own test.
            .map(|t| PartnerPause { refused: false, ..t })
    }

    fn pause(ms: u64) -> Option<PartnerPause> {
        Some(PartnerPause { pause_ms: ms, refused: false, clamped: false })
    }

    fn clamped(ms: u64) -> Option<PartnerPause> {
        Some(PartnerPause { pause_ms: ms, refused: false, clamped: true })
    }

    #[test]
    fn only_a_throttling_status_is_a_refusal() {
        let read = |status: u16| {
            let h = |name: &str| match name {
                "retry-after" => Some(&b"2"[..]),
                "x-ratelimit-remaining" => Some(&b"0"[..]),
                "x-ratelimit-reset" => Some(&b"2"[..]),
                _ => None,
            };
            Upstream::default().throttle(status, h, NOW).map(|t| t.refused)
        };
        assert_eq!(read(429), Some(true));
        assert_eq!(read(503), Some(true));
        assert_eq!(read(200), Some(false), "nothing left on a good answer is not a refusal");
    }

    #[test]
    fn adaptation_is_on_by_default_and_can_be_turned_off_or_tuned() {
        let parse = |json: &str| serde_json::from_str::<Upstream>(json).map(|u| u.adapt);
        assert_eq!(parse("{}").ok(), Some(Adaptation::On(Adapt::default())));
        assert_eq!(parse(r#"{"adapt": true}"#).ok(), Some(Adaptation::On(Adapt::default())));
        assert_eq!(parse(r#"{"adapt": false}"#).ok(), Some(Adaptation::Off));
        let tuned = parse(r#"{"adapt": {"decrease": 0.7, "recover": "5m"}}"#).ok();
        let want = Adapt { decrease: 0.7, recover: Duration::parse("5m").expect("5m"), min: 0.05 };
        assert_eq!(tuned, Some(Adaptation::On(want)));
        let defaults = Adapt::default().slowdown();
        assert_eq!(
            defaults,
            Slowdown { decrease_ppm: 500_000, recover_ms: Millis(1_800_000), min_ppm: 50_000 }
        );
        assert!(parse(r#"{"adapt": {"decrease": 1.5}}"#)
            .is_ok_and(|a| { matches!(a, Adaptation::On(a) if a.slowdown().validate().is_err()) }));
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        assert_eq!(throttle(429, &[("retry-after", "30")]), pause(30_000));
        assert_eq!(throttle(429, &[("retry-after", "Mon, 23 Nov 2026 12:00:07 GMT")]), pause(7_000));
        // RFC 850 and asctime forms are HTTP dates too.
        assert_eq!(throttle(429, &[("retry-after", "Monday, 23-Nov-26 12:00:07 GMT")]), pause(7_000));
        assert_eq!(throttle(429, &[("retry-after", "Mon Nov 23 12:00:07 2026")]), pause(7_000));
    }

    #[test]
    fn a_429_without_a_usable_header_pauses_for_the_default() {
        assert_eq!(throttle(429, &[]), pause(1_000));
    }

    #[test]
    fn a_503_pauses_only_with_retry_after() {
        assert_eq!(throttle(503, &[]), None);
        assert_eq!(throttle(503, &[("retry-after", "2")]), pause(2_000));
    }

    #[test]
    fn other_statuses_ignore_retry_after() {
        assert_eq!(throttle(200, &[("retry-after", "30")]), None);
        assert_eq!(throttle(500, &[("retry-after", "30")]), None);
    }

    #[test]
    fn remaining_zero_with_a_reset_pauses_even_a_200() {
        let h = [("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "12")];
        assert_eq!(throttle(200, &h), pause(12_000));
        let unix = [("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "1795435215")];
        assert_eq!(throttle(200, &unix), pause(15_000));
        assert_eq!(throttle(200, &[("x-ratelimit-remaining", "3"), ("x-ratelimit-reset", "12")]), None);
        assert_eq!(throttle(200, &[("x-ratelimit-remaining", "0")]), None, "no reset, no pause");
    }

    #[test]
    fn the_reset_format_is_configurable() {
        let seconds = Upstream { reset: ResetFormat::Seconds, ..Upstream::default() };
        let unix = Upstream { reset: ResetFormat::Unix, ..Upstream::default() };
        let h = |name: &str| match name {
            "x-ratelimit-remaining" => Some(&b"0"[..]),
            "x-ratelimit-reset" => Some(&b"1795435260"[..]),
            _ => None,
        };
        // Read as seconds, a Unix time is decades: cut to the maximum pause.
        assert_eq!(seconds.throttle(200, h, NOW), clamped(300_000));
        assert_eq!(unix.throttle(200, h, NOW), pause(60_000));
        let small = |name: &str| match name {
            "x-ratelimit-remaining" => Some(&b"0"[..]),
            "x-ratelimit-reset" => Some(&b"20"[..]),
            _ => None,
        };
        // A Unix reset in 1970 is in the past: ignored.
        assert_eq!(unix.throttle(200, small, NOW), None);
    }

    #[test]
    fn the_ietf_field_pauses_for_items_with_nothing_left() {
        assert_eq!(throttle(200, &[("ratelimit", "\"default\";r=0;t=30")]), pause(30_000));
        assert_eq!(throttle(200, &[("ratelimit", "\"default\";r=5;t=30")]), None);
        let two = "\"burst\";r=0;t=2, \"daily\";r=0;t=3600, \"hourly\";r=9;t=60";
        assert_eq!(throttle(429, &[("ratelimit", two)]), clamped(300_000));
        let upstream = Upstream { max_pause: Duration::parse("2h").expect("2h"), ..Upstream::default() };
        let h = |name: &str| (name == "ratelimit").then_some(two.as_bytes());
        let refused = PartnerPause { pause_ms: 3_600_000, refused: true, clamped: false };
        assert_eq!(upstream.throttle(429, h, NOW), Some(refused));
    }

    #[test]
    fn hostile_values_are_cut_or_ignored_and_reported() {
        // A year, and more digits than any integer holds: cut to the maximum.
        assert_eq!(throttle(429, &[("retry-after", "31536000")]), clamped(300_000));
        assert_eq!(throttle(429, &[("retry-after", "99999999999999999999999999")]), clamped(300_000));
        // Negative, malformed, a date in the past: ignored; a 429 still pauses by default.
        assert_eq!(throttle(429, &[("retry-after", "-5")]), clamped(1_000));
        assert_eq!(throttle(429, &[("retry-after", "soon")]), clamped(1_000));
        assert_eq!(throttle(429, &[("retry-after", "Mon, 23 Nov 2026 11:00:00 GMT")]), clamped(1_000));
        assert_eq!(throttle(429, &[("retry-after", "Mon, 32 Foo 2026 99:00:00 GMT")]), clamped(1_000));
        assert_eq!(throttle(429, &[("ratelimit", "r=0;;t=")]), clamped(1_000));
        assert_eq!(throttle(429, &[("ratelimit", "\"q\";r=0;t=-4")]), clamped(1_000));
        assert_eq!(throttle(200, &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "-1")]), None);
        assert_eq!(
            throttle(200, &[("x-ratelimit-remaining", "-3"), ("x-ratelimit-reset", "4")]),
            pause(4_000)
        );
        assert_eq!(throttle(429, &[("retry-after", "\u{0}\u{7f}")]), clamped(1_000));
    }

    #[test]
    fn disagreeing_headers_take_the_longest_usable_pause() {
        let h = [
            ("retry-after", "5"),
            ("ratelimit", "\"default\";r=0;t=9"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "7"),
        ];
        assert_eq!(throttle(429, &h), pause(9_000));
        let with_broken = [("retry-after", "garbage"), ("ratelimit", "\"default\";r=0;t=9")];
        assert_eq!(throttle(429, &with_broken), clamped(9_000));
    }
}
