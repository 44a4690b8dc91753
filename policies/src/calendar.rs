//! Calendar windows: a `fixed_window` or `points` limit whose window is a
//! calendar day, week or month in a named IANA time zone, instead of a span
//! aligned to the epoch. Budgets are set per day and per month, not per
//! 86,400 seconds.
//!
//! ```json
//! {"type": "points", "capacity": 1000000, "cost": 1,
//!  "refill": {"calendar": "month", "anchor": 15, "zone": "Europe/Paris"}}
//! ```
//!
//! A window starts at local midnight of its first day and ends at local
//! midnight of the next window's first day, whatever the offset does in
//! between: a day across a DST change lasts 23 or 25 hours. A midnight that
//! does not exist (a gap) starts at the first instant after it; one that
//! happens twice, at its first. A month window starts on day `anchor` of a
//! month, or on its last day when the month is shorter (anchor 31: Jan 31,
//! Feb 28 or 29, Mar 31, Apr 30). A week starts on `starts` (Monday unless
//! given).
//!
//! The zone rules are `jiff`'s bundled copy of the IANA database, the same in
//! the filter (wasm) and the shim. Redis has none: the shim computes the two
//! window ends nearest its own clock ([`Calendar::ends_near`]) and the script
//! picks the window of Redis's own `TIME` among them, so a check stays right
//! when the two clocks straddle a boundary (see `lua/lib/calendar.lua`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

use jiff::civil::Date;
pub use jiff::civil::Weekday;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};

use crate::invalid::Invalid;

/// A calendar window's shape and zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Calendar {
    pub period: Period,
    pub zone: Zone,
}

/// Which calendar unit a window spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    Day,
    /// A week starting on `starts`.
    Week {
        starts: Weekday,
    },
    /// A month starting on day `anchor` (1 to 31), or on the month's last day
    /// when it has fewer: a billing cycle.
    Month {
        anchor: u8,
    },
}

/// A named IANA time zone that the bundled database knows, by its name as
/// the database spells it. Copied freely: names are interned once each (a
/// few hundred at most), so a limit that carries one stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Zone(&'static str);

/// Every zone name met so far, interned.
static ZONES: Mutex<BTreeMap<String, &'static str>> = Mutex::new(BTreeMap::new());

impl Zone {
    /// The zone named `name` (any case), if the database has it.
    pub fn new(name: &str) -> Option<Zone> {
        if name.is_empty() || name.len() > 64 {
            return None;
        }
        let tz = jiff::tz::db().get(name).ok()?;
        let canonical = tz.iana_name().unwrap_or(name);
        let mut zones = ZONES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&interned) = zones.get(canonical) {
            return Some(Zone(interned));
        }
        let interned: &'static str = Box::leak(canonical.to_string().into_boxed_str());
        zones.insert(canonical.to_string(), interned);
        Some(Zone(interned))
    }

    pub fn name(self) -> &'static str {
        self.0
    }

    fn rules(self) -> Option<TimeZone> {
        jiff::tz::db().get(self.0).ok()
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Zone({})", self.0)
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl Calendar {
    /// The window that holds `at_us` (microseconds since the epoch): its
    /// start and end, in microseconds. `None` only out of the calendar's
    /// range (beyond the year 9999).
    pub fn window(&self, at_us: u64) -> Option<(u64, u64)> {
        let tz = self.zone.rules()?;
        let at = Timestamp::from_microsecond(i64::try_from(at_us).ok()?).ok()?;
        let date = at.to_zoned(tz.clone()).date();
        let (first, next) = match self.period {
            Period::Day => (date, date.tomorrow().ok()?),
            Period::Week { starts } => {
                let back =
                    (date.weekday().to_monday_zero_offset() - starts.to_monday_zero_offset()).rem_euclid(7);
                let first = date.checked_sub(i64::from(back).days()).ok()?;
                (first, first.checked_add(7.days()).ok()?)
            }
            Period::Month { anchor } => {
                let this = anchored(date.first_of_month(), anchor);
                if date >= this {
                    (this, anchored(date.first_of_month().checked_add(1.month()).ok()?, anchor))
                } else {
                    (anchored(date.first_of_month().checked_sub(1.month()).ok()?, anchor), this)
                }
            }
        };
        let midnight = |d: Date| -> Option<u64> {
            u64::try_from(d.to_zoned(tz.clone()).ok()?.timestamp().as_microsecond()).ok()
        };
        Some((midnight(first)?, midnight(next)?))
    }

    /// The ends of two consecutive windows around `now_us`, as the check
    /// script takes them: the window of `now_us` and the one before it when
    /// `now_us` lies in the first half of its window, else it and the one
    /// after. A window is named by its end; Redis's clock picks the first end
    /// still ahead of it, so the shim's and Redis's clocks may differ by up
    /// to half a window (about 12 hours for a day) and still agree on every
    /// window.
    pub fn ends_near(&self, now_us: u64) -> Option<(u64, u64)> {
        let (start, end) = self.window(now_us)?;
        if now_us - start < end - now_us {
            Some((start, end))
        } else {
            Some((end, self.window(end)?.1))
        }
    }

    /// A number that names this calendar among all others (its period and
    /// zone), for identities that hold numbers only.
    pub fn code(&self) -> u64 {
        let name = self.state_name();
        name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
    }

    /// Its part of a state key: `d:UTC`, `w1:Europe/Paris` (a week from
    /// Monday, 1, to Sunday, 7), `m15:America/New_York`. Zone names hold no
    /// `{`, `}` nor space.
    pub fn state_name(&self) -> String {
        match self.period {
            Period::Day => format!("d:{}", self.zone),
            Period::Week { starts } => format!("w{}:{}", starts.to_monday_one_offset(), self.zone),
            Period::Month { anchor } => format!("m{anchor}:{}", self.zone),
        }
    }

    /// A nominal length, for the `RateLimit-Policy` header's `w`: a day, a
    /// week, or 30 days for a month. The reset the headers show is exact.
    pub fn nominal_ms(&self) -> u64 {
        const DAY_MS: u64 = 86_400_000;
        match self.period {
            Period::Day => DAY_MS,
            Period::Week { .. } => 7 * DAY_MS,
            Period::Month { .. } => 30 * DAY_MS,
        }
    }
}

/// Day `anchor` of the month of `first`, or the month's last day.
fn anchored(first: Date, anchor: u8) -> Date {
    let day = i8::try_from(anchor).unwrap_or(31).min(first.days_in_month());
    Date::new(first.year(), first.month(), day).unwrap_or(first.last_of_month())
}

/// In words, for reports: `calendar month from day 15 (Europe/Paris)`.
impl fmt::Display for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.period {
            Period::Day => write!(f, "calendar day ({})", self.zone),
            Period::Week { starts } => write!(f, "calendar week from {} ({})", day_name(starts), self.zone),
            Period::Month { anchor: 1 } => write!(f, "calendar month ({})", self.zone),
            Period::Month { anchor } => write!(f, "calendar month from day {anchor} ({})", self.zone),
        }
    }
}

const DAYS: [(&str, Weekday); 7] = [
    ("monday", Weekday::Monday),
    ("tuesday", Weekday::Tuesday),
    ("wednesday", Weekday::Wednesday),
    ("thursday", Weekday::Thursday),
    ("friday", Weekday::Friday),
    ("saturday", Weekday::Saturday),
    ("sunday", Weekday::Sunday),
];

fn day_name(day: Weekday) -> &'static str {
    DAYS.iter().find(|(_, d)| *d == day).map_or("monday", |(name, _)| name)
}

/// A calendar window: a day, a week or a month in an IANA time zone.
#[derive(Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Calendar"))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCalendar {
    /// The window: `day`, `week` or `month`.
    calendar: RawPeriod,
    /// An IANA time zone name: `UTC`, `Europe/Paris`, `America/New_York`.
    zone: String,
    /// A week's first day, `monday` (the default) to `sunday`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(extend("enum" = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", null]))
    )]
    starts: Option<String>,
    /// A month's first day, 1 (the default) to 31; a shorter month starts on its last day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 31)))]
    anchor: Option<u8>,
}

/// A duration, or a calendar window.
#[cfg(feature = "schema")]
#[derive(schemars::JsonSchema)]
#[schemars(rename = "Window")]
#[schemars(untagged)]
#[allow(dead_code)]
pub(crate) enum SpanOrCalendar {
    Duration(crate::Duration),
    Calendar(RawCalendar),
}

#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "CalendarPeriod"))]
#[serde(rename_all = "snake_case")]
enum RawPeriod {
    Day,
    Week,
    Month,
}

impl RawCalendar {
    fn check(self) -> Result<Calendar, Invalid> {
        let zone = Zone::new(&self.zone).ok_or_else(|| {
            Invalid::new(format!(
                "unknown time zone {:?} (expected an IANA name such as \"UTC\" or \"Europe/Paris\")",
                self.zone
            ))
        })?;
        if self.starts.is_some() && self.calendar != RawPeriod::Week {
            return Err(Invalid::new("`starts` is for a week calendar"));
        }
        if self.anchor.is_some() && self.calendar != RawPeriod::Month {
            return Err(Invalid::new("`anchor` is for a month calendar"));
        }
        let period = match self.calendar {
            RawPeriod::Day => Period::Day,
            RawPeriod::Week => {
                let starts = match self.starts.as_deref() {
                    None => Weekday::Monday,
                    Some(name) => {
                        DAYS.iter().find(|(n, _)| *n == name).map(|(_, d)| *d).ok_or_else(|| {
                            Invalid::new(format!(
                                "invalid starts {name:?} (expected a day, \"monday\" to \"sunday\")"
                            ))
                        })?
                    }
                };
                Period::Week { starts }
            }
            RawPeriod::Month => {
                let anchor = self.anchor.unwrap_or(1);
                if !(1..=31).contains(&anchor) {
                    return Err(Invalid::new(format!(
                        "invalid anchor {anchor} (expected a day of the month, 1 to 31)"
                    )));
                }
                Period::Month { anchor }
            }
        };
        Ok(Calendar { period, zone })
    }
}

impl From<Calendar> for RawCalendar {
    fn from(c: Calendar) -> RawCalendar {
        let (calendar, starts, anchor) = match c.period {
            Period::Day => (RawPeriod::Day, None, None),
            Period::Week { starts } => (RawPeriod::Week, Some(day_name(starts).to_string()), None),
            Period::Month { anchor } => (RawPeriod::Month, None, Some(anchor)),
        };
        RawCalendar { calendar, zone: c.zone.name().to_string(), starts, anchor }
    }
}

/// The binary wire (`wire::Encoding::Binary`): the period (0 a day, 1 a
/// week, 2 a month), its day (a week's first, Monday 1 to Sunday 7; a
/// month's anchor; 0 for a day), then the zone's name; read back through the
/// same checks as the JSON form.
impl borsh::BorshSerialize for Calendar {
    fn serialize<W: std::io::Write>(&self, writer: &mut W) -> std::io::Result<()> {
        let (period, day) = match self.period {
            Period::Day => (0u8, 0u8),
            Period::Week { starts } => (1, starts.to_monday_one_offset().unsigned_abs()),
            Period::Month { anchor } => (2, anchor),
        };
        borsh::BorshSerialize::serialize(&(period, day, self.zone.name()), writer)
    }
}

impl borsh::BorshDeserialize for Calendar {
    fn deserialize_reader<R: std::io::Read>(reader: &mut R) -> std::io::Result<Self> {
        let (period, day, zone): (u8, u8, String) = borsh::BorshDeserialize::deserialize_reader(reader)?;
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
        let calendar = match period {
            0 => RawPeriod::Day,
            1 => RawPeriod::Week,
            2 => RawPeriod::Month,
            n => return Err(invalid(format!("calendar period {n}"))),
        };
        let starts =
            (period == 1).then(|| DAYS.get(usize::from(day).wrapping_sub(1)).map(|(n, _)| n.to_string()));
        let starts = match starts {
            Some(None) => return Err(invalid(format!("week day {day}"))),
            Some(Some(name)) => Some(name),
            None => None,
        };
        let anchor = (period == 2).then_some(day);
        RawCalendar { calendar, zone, starts, anchor }
            .check()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
}

impl<'de> Deserialize<'de> for Calendar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RawCalendar::deserialize(d)?.check().map_err(de::Error::custom)
    }
}

impl Serialize for Calendar {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RawCalendar::from(*self).serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cal(json: &str) -> Calendar {
        serde_json::from_str(json).expect("a calendar")
    }

    fn us(text: &str) -> u64 {
        let ts: Timestamp = text.parse().expect("a timestamp");
        u64::try_from(ts.as_microsecond()).expect("after 1970")
    }

    fn window(c: &Calendar, at: &str) -> (String, String) {
        let (start, end) = c.window(us(at)).expect("a window");
        let show = |t: u64| {
            Timestamp::from_microsecond(i64::try_from(t).expect("fits"))
                .expect("in range")
                .to_zoned(c.zone.rules().expect("rules"))
                .strftime("%Y-%m-%dT%H:%M:%S%:z")
                .to_string()
        };
        (show(start), show(end))
    }

    /// The day of a spring-forward change lasts 23 hours, the day of the
    /// fall-back change 25, both from midnight to midnight.
    #[test]
    fn a_day_across_a_dst_change_runs_midnight_to_midnight() {
        let day = cal(r#"{"calendar": "day", "zone": "Europe/Paris"}"#);
        let spring = window(&day, "2026-03-29T12:00:00Z");
        assert_eq!(spring, ("2026-03-29T00:00:00+01:00".into(), "2026-03-30T00:00:00+02:00".into()));
        let (s, e) = day.window(us("2026-03-29T12:00:00Z")).expect("a window");
        assert_eq!(e - s, 23 * 3_600_000_000);
        let (s, e) = day.window(us("2026-10-25T12:00:00Z")).expect("a window");
        assert_eq!(e - s, 25 * 3_600_000_000);
    }

    /// Where midnight does not exist (Santiago's clocks jump from 00:00 to
    /// 01:00), the day starts at 01:00.
    #[test]
    fn a_missing_midnight_starts_the_day_after_the_gap() {
        let day = cal(r#"{"calendar": "day", "zone": "America/Santiago"}"#);
        let got = window(&day, "2026-09-06T12:00:00Z");
        assert_eq!(got, ("2026-09-06T01:00:00-03:00".into(), "2026-09-07T00:00:00-03:00".into()));
    }

    /// Anchor 31 starts each month on its 31st, or its last day: February's
    /// window runs from the 28th (29th in a leap year) to March 31.
    #[test]
    fn anchor_31_falls_back_to_a_months_last_day() {
        let month = cal(r#"{"calendar": "month", "anchor": 31, "zone": "UTC"}"#);
        let cases = [
            ("2026-01-31T10:00:00Z", "2026-01-31T00:00:00+00:00", "2026-02-28T00:00:00+00:00"),
            ("2026-02-27T10:00:00Z", "2026-01-31T00:00:00+00:00", "2026-02-28T00:00:00+00:00"),
            ("2026-02-28T10:00:00Z", "2026-02-28T00:00:00+00:00", "2026-03-31T00:00:00+00:00"),
            ("2026-03-30T10:00:00Z", "2026-02-28T00:00:00+00:00", "2026-03-31T00:00:00+00:00"),
            ("2026-04-30T10:00:00Z", "2026-04-30T00:00:00+00:00", "2026-05-31T00:00:00+00:00"),
            ("2028-02-28T10:00:00Z", "2028-01-31T00:00:00+00:00", "2028-02-29T00:00:00+00:00"),
            ("2028-02-29T10:00:00Z", "2028-02-29T00:00:00+00:00", "2028-03-31T00:00:00+00:00"),
        ];
        for (at, start, end) in cases {
            assert_eq!(window(&month, at), (start.to_string(), end.to_string()), "at {at}");
        }
    }

    /// A month window from the 1st spans the month, whatever its length.
    #[test]
    fn months_of_every_length() {
        let month = cal(r#"{"calendar": "month", "zone": "Asia/Tokyo"}"#);
        for (at, days) in
            [("2026-02-10T00:00:00Z", 28), ("2026-04-10T00:00:00Z", 30), ("2026-05-10T00:00:00Z", 31)]
        {
            let (s, e) = month.window(us(at)).expect("a window");
            assert_eq!(e - s, days * 86_400_000_000, "at {at}");
        }
        assert_eq!(
            window(&month, "2026-01-31T20:00:00Z"),
            ("2026-02-01T00:00:00+09:00".into(), "2026-03-01T00:00:00+09:00".into()),
            "20:00 UTC on Jan 31 is Feb 1 in Tokyo"
        );
    }

    /// A week starts on its `starts` day, at local midnight.
    #[test]
    fn weeks_start_on_their_day() {
        let week = cal(r#"{"calendar": "week", "starts": "sunday", "zone": "America/New_York"}"#);
        // Wednesday 2026-03-11; the US changed clocks on Sunday 2026-03-08.
        let got = window(&week, "2026-03-11T12:00:00Z");
        assert_eq!(got, ("2026-03-08T00:00:00-05:00".into(), "2026-03-15T00:00:00-04:00".into()));
        let monday = cal(r#"{"calendar": "week", "zone": "UTC"}"#);
        let got = window(&monday, "2026-03-08T23:59:59Z");
        assert_eq!(got, ("2026-03-02T00:00:00+00:00".into(), "2026-03-09T00:00:00+00:00".into()));
    }

    /// The two ends passed to the script bracket now by at least half a
    /// window on either side.
    #[test]
    fn ends_bracket_now_by_half_a_window() {
        let day = cal(r#"{"calendar": "day", "zone": "UTC"}"#);
        let morning = us("2026-05-10T03:00:00Z");
        assert_eq!(day.ends_near(morning), Some((us("2026-05-10T00:00:00Z"), us("2026-05-11T00:00:00Z"))));
        let evening = us("2026-05-10T21:00:00Z");
        assert_eq!(day.ends_near(evening), Some((us("2026-05-11T00:00:00Z"), us("2026-05-12T00:00:00Z"))));
    }

    #[test]
    fn zones_are_checked_and_named_as_the_database_names_them() {
        assert_eq!(Zone::new("europe/paris").map(Zone::name), Some("Europe/Paris"));
        assert_eq!(Zone::new("Mars/Olympus"), None);
        assert_eq!(Zone::new(""), None);
        let err = serde_json::from_str::<Calendar>(r#"{"calendar": "day", "zone": "Mars/Olympus"}"#);
        assert!(err.is_err());
    }

    /// Every calendar the database allows has its own code: the over-limit
    /// cache tells limits apart by it.
    #[test]
    fn codes_are_distinct_for_every_zone_and_period() {
        let mut seen = std::collections::HashSet::new();
        for name in jiff::tz::db().available() {
            let Some(zone) = Zone::new(name.as_str()) else { continue };
            let periods =
                [Period::Day, Period::Week { starts: Weekday::Monday }, Period::Month { anchor: 1 }];
            for period in periods {
                let c = Calendar { period, zone };
                if !seen.insert(c.state_name()) {
                    continue; // an alias of a zone already seen
                }
                assert!(seen.insert(format!("code {}", c.code())), "{} shares its code", c.state_name());
            }
        }
        assert!(seen.len() > 1000, "the bundled database has hundreds of zones");
    }

    #[test]
    fn round_trips_through_the_binary_wire() {
        for json in [
            r#"{"calendar":"day","zone":"UTC"}"#,
            r#"{"calendar":"week","zone":"America/New_York","starts":"sunday"}"#,
            r#"{"calendar":"month","zone":"Europe/Paris","anchor":31}"#,
        ] {
            let c = cal(json);
            let bytes = borsh::to_vec(&c).expect("encodes");
            assert_eq!(borsh::from_slice::<Calendar>(&bytes).expect("decodes"), c);
        }
        let unknown = borsh::to_vec(&(0u8, 0u8, "Mars/Olympus")).expect("encodes");
        assert!(borsh::from_slice::<Calendar>(&unknown).is_err());
    }

    #[test]
    fn round_trips_through_json() {
        let json = r#"{"calendar":"month","zone":"Europe/Paris","anchor":15}"#;
        let c = cal(json);
        assert_eq!(c.period, Period::Month { anchor: 15 });
        assert_eq!(serde_json::to_string(&c).expect("serializes"), json);
        assert_eq!(c.to_string(), "calendar month from day 15 (Europe/Paris)");
    }
}
