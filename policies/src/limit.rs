//! The limit types of a policy and what each one means. The Redis scripts in
//! `lua/` implement them, and the modules under `algorithm` model them.
//! [`WireLimit`] is the same limit as the shim takes it, with the bounds the
//! parser and the shim both hold it to.
//!
//! | type | fields | meaning |
//! |---|---|---|
//! | `fixed_window` | `limit`, `window`, `start` | at most `limit` per window aligned to the epoch, or (`start: first_hit`) per window that starts at its key's first counted request |
//! | `sliding_window` | `limit`, `window`, `approximate` | exact: at most `limit` in any interval one `window` long; approximate: the two-counter estimate |
//! | `token_bucket` | `rate`, `per`, `burst` | `rate` tokens refill every `per`; the bucket holds at most `burst` |
//! | `leaky_bucket` | `capacity`, `drain` | a full bucket of `capacity` drains in `drain`: burst, then one every `drain / capacity` |
//! | `interval` | `every` | at most one request per `every` |
//! | `concurrency` | `limit`, `lease`, `reserve` | at most `limit` in flight; a slot returns at stream end, or after `lease` if its holder died; `reserve` holds a share back for the more important classes |
//! | `points` | `capacity`, `refill`, `cost`, `actual_cost_header` | a bucket of `capacity` points refilled completely in `refill`; each request costs `cost` (or LLM tokens: `"llm_tokens"`) |
//!
//! A `fixed_window`'s `window` or a `points` limit's `refill` may be a
//! calendar window instead of a duration (see [`crate::calendar`]): at most
//! `limit` requests, or `capacity` points, per calendar day, week or month.
//! These are [`Limit::CalendarWindow`] and [`Limit::CalendarPoints`].

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use crate::calendar::Calendar;
use crate::cost::read_cost;
use crate::invalid::Invalid;
use crate::units::{is_false, per_unit, Micros, Millis, MAX_COUNT};
use crate::{Count, Duration, HeaderName, PolicyName, Request};

/// One limit of a policy; `type` names its kind.
// Read through `RawLimit` (so an error is reported at its own position); the
// JSON Schema is derived from this type itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(tag = "type", rename_all = "snake_case", deny_unknown_fields))]
pub enum Limit {
    /// At most `limit` per window aligned to the epoch, or per calendar day,
    /// week or month when `window` is a calendar; with `start: first_hit`,
    /// per window that starts at the first request counted once the last
    /// window ended.
    FixedWindow {
        limit: Count,
        #[cfg_attr(feature = "schema", schemars(with = "crate::calendar::SpanOrCalendar"))]
        window: Duration,
        #[cfg_attr(feature = "schema", schemars(default))]
        start: WindowStart,
    },
    /// At most `limit` in any interval one `window` long (exact), or the O(1)
    /// two-counter estimate with `approximate`.
    SlidingWindow {
        limit: Count,
        window: Duration,
        // The parser takes `null` as false too, so the schema does.
        #[cfg_attr(feature = "schema", schemars(default, with = "Option<bool>"))]
        approximate: bool,
    },
    /// `rate` tokens refill every `per`; the bucket holds at most `burst`.
    TokenBucket { rate: Count, per: Duration, burst: Count },
    /// A full bucket of `capacity` drains in `drain`: burst, then drip.
    LeakyBucket { capacity: Count, drain: Duration },
    /// At most one request per `every`.
    Interval { every: Duration },
    /// At most `limit` in flight; a slot is reclaimed after `lease` if its
    /// holder died; `reserve` holds a share back for the more important classes.
    Concurrency { limit: Count, lease: Duration, reserve: Option<PoolReserve> },
    /// A bucket of `capacity` points refilled completely in `refill`; each
    /// request costs `cost`, a number or `{"header": NAME, "default": N}`.
    /// With a calendar as `refill`: `capacity` points per calendar day, week
    /// or month, all back when it ends.
    Points {
        capacity: Count,
        #[cfg_attr(feature = "schema", schemars(with = "crate::calendar::SpanOrCalendar"))]
        refill: Duration,
        cost: Cost,
        actual_cost_header: Option<HeaderName>,
    },
    /// A `fixed_window` whose window is a calendar day, week or month: at
    /// most `limit` per calendar window.
    #[cfg_attr(feature = "schema", schemars(skip))]
    CalendarWindow { limit: Count, calendar: Calendar },
    /// A `points` limit whose `refill` is a calendar window: `capacity`
    /// points per calendar window, all back at its end.
    #[cfg_attr(feature = "schema", schemars(skip))]
    CalendarPoints { capacity: Count, calendar: Calendar, cost: Cost, actual_cost_header: Option<HeaderName> },
}

/// Where a `fixed_window`'s windows start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum WindowStart {
    /// At multiples of `window` since the Unix epoch: every key's windows
    /// end together.
    #[default]
    Epoch,
    /// At the first request a key counts once its last window ended: the
    /// window lasts `window` from there (Limitador's counters).
    FirstHit,
}

impl Limit {
    pub fn kind(&self) -> LimitType {
        match self {
            Limit::FixedWindow { .. } | Limit::CalendarWindow { .. } => LimitType::FixedWindow,
            Limit::SlidingWindow { .. } => LimitType::SlidingWindow,
            Limit::TokenBucket { .. } => LimitType::TokenBucket,
            Limit::LeakyBucket { .. } => LimitType::LeakyBucket,
            Limit::Interval { .. } => LimitType::Interval,
            Limit::Concurrency { .. } => LimitType::Concurrency,
            Limit::Points { .. } | Limit::CalendarPoints { .. } => LimitType::Points,
        }
    }

    /// Its calendar, if its window is one.
    pub fn calendar(&self) -> Option<Calendar> {
        match self {
            Limit::CalendarWindow { calendar, .. } | Limit::CalendarPoints { calendar, .. } => {
                Some(*calendar)
            }
            _ => None,
        }
    }

    pub fn type_name(&self) -> &'static str {
        self.kind().name()
    }

    /// A `concurrency` limit's lease; none for the other kinds.
    pub fn lease(&self) -> Option<Duration> {
        match self {
            Limit::Concurrency { lease, .. } => Some(*lease),
            _ => None,
        }
    }

    /// A `concurrency` limit's reserve, if it has one.
    pub fn reserve(&self) -> Option<&PoolReserve> {
        match self {
            Limit::Concurrency { reserve, .. } => reserve.as_ref(),
            _ => None,
        }
    }

    /// Whether it is a `points` limit charged in LLM tokens.
    pub fn costs_llm_tokens(&self) -> bool {
        matches!(
            self,
            Limit::Points { cost: Cost::LlmTokens, .. } | Limit::CalendarPoints { cost: Cost::LlmTokens, .. }
        )
    }

    /// Whether a settlement once the response is known can charge it more
    /// or give part of its charge back: a `points` limit with an
    /// `actual_cost_header` or in LLM tokens.
    pub fn settles(&self) -> bool {
        self.actual_cost_header().is_some() || self.costs_llm_tokens()
    }

    /// The response header a `points` limit reads its true cost from, if any.
    pub fn actual_cost_header(&self) -> Option<&HeaderName> {
        match self {
            Limit::Points { actual_cost_header, .. } | Limit::CalendarPoints { actual_cost_header, .. } => {
                actual_cost_header.as_ref()
            }
            _ => None,
        }
    }
}

/// Slots of a `concurrency` pool held back for the more important classes
/// (scenario S4c): `{"for": "critical", "share": 0.2}`. The class `for` and
/// every more important one may use the whole pool; a less important class
/// is admitted only while fewer than `limit - slots` are in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolReserve {
    /// The least important class that may use the whole pool.
    pub for_class: PolicyName,
    /// Its index among the document's classes, set once the document is read.
    pub for_index: usize,
    /// The slots held back: `share` of the pool, rounded, 1 to `limit - 1`.
    pub slots: u32,
}

impl PoolReserve {
    /// The pool a request of `class` may fill.
    pub fn pool_for(&self, limit: u32, class: usize) -> u32 {
        if class > self.for_index {
            limit - self.slots
        } else {
            limit
        }
    }
}

#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReserve {
    /// The least important class that may use the whole pool.
    #[serde(rename = "for")]
    for_class: PolicyName,
    /// The share of the pool held back, above 0 and below 1.
    share: f64,
}

/// What one request costs a `points` limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    /// The same for every request.
    Fixed(u32),
    /// Read from a request header, an integer from 0 to the capacity;
    /// `default` when the header is missing or not such a number.
    Header { header: HeaderName, default: u32 },
    /// `"llm_tokens"`: LLM tokens, as the policy's `llm` reads them: the
    /// reservation at the check, the true count once the response tells it
    /// (see [`crate::llm`]).
    LlmTokens,
}

/// Every field any limit type may have. A limit is read into this first, so
/// that a bad value is reported at its own path and position, and then
/// checked against its type.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimit {
    #[serde(rename = "type")]
    kind: LimitType,
    limit: Option<Count>,
    window: Option<Span>,
    start: Option<WindowStart>,
    approximate: Option<bool>,
    rate: Option<Count>,
    per: Option<Duration>,
    burst: Option<Count>,
    capacity: Option<Count>,
    drain: Option<Duration>,
    every: Option<Duration>,
    lease: Option<Duration>,
    refill: Option<Span>,
    cost: Option<RawCost>,
    actual_cost_header: Option<HeaderName>,
    reserve: Option<RawReserve>,
}

/// The kind of a limit, its `type`. Its name and fields are in [`KINDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitType {
    FixedWindow,
    SlidingWindow,
    TokenBucket,
    LeakyBucket,
    Interval,
    Concurrency,
    Points,
}

/// Each kind's name in a document and the fields it may have besides
/// `type`, in [`LimitType`]'s order.
const KINDS: [(&str, &[&str]); 7] = [
    ("fixed_window", &["limit", "window", "start"]),
    ("sliding_window", &["limit", "window", "approximate"]),
    ("token_bucket", &["rate", "per", "burst"]),
    ("leaky_bucket", &["capacity", "drain"]),
    ("interval", &["every"]),
    ("concurrency", &["limit", "lease", "reserve"]),
    ("points", &["capacity", "refill", "cost", "actual_cost_header"]),
];

impl LimitType {
    /// Its name in a document: `fixed_window`, `token_bucket`, ...
    pub fn name(self) -> &'static str {
        KINDS[self as usize].0
    }

    /// The fields a limit of this kind may have besides `type`.
    pub fn fields(self) -> &'static [&'static str] {
        KINDS[self as usize].1
    }
}

/// A number, `{"header": NAME, "default": N}`, or `"llm_tokens"`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(untagged))]
pub(crate) enum RawCost {
    Fixed(u32),
    Header(HeaderCost),
    Named(CostName),
}

/// A cost by name.
#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub(crate) enum CostName {
    /// LLM tokens, as the policy's `llm` reads them.
    LlmTokens,
}

impl<'de> Deserialize<'de> for RawCost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct CostVisitor;
        impl<'de> de::Visitor<'de> for CostVisitor {
            type Value = RawCost;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a cost: a number, {\"header\": NAME, \"default\": N}, or \"llm_tokens\"")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<RawCost, E> {
                match name {
                    "llm_tokens" => Ok(RawCost::Named(CostName::LlmTokens)),
                    _ => Err(E::invalid_value(de::Unexpected::Str(name), &self)),
                }
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<RawCost, E> {
                u32::try_from(n).map(RawCost::Fixed).map_err(|_| E::custom(format!("cost {n} is too large")))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<RawCost, A::Error> {
                HeaderCost::deserialize(de::value::MapAccessDeserializer::new(map)).map(RawCost::Header)
            }
        }
        d.deserialize_any(CostVisitor)
    }
}

/// A `window` or `refill`: a duration (`"1m"`), or a calendar window
/// (`{"calendar": "day", "zone": "UTC"}`).
pub(crate) enum Span {
    Duration(Duration),
    Calendar(Calendar),
}

impl Span {
    /// The duration; a calendar where `what` must be a duration is refused.
    fn duration(self, what: &str) -> Result<Duration, Invalid> {
        match self {
            Span::Duration(d) => Ok(d),
            Span::Calendar(_) => Err(Invalid::new(format!(
                "{what} is a duration: calendar windows are for fixed_window and points limits"
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        enum Read {
            Text(String),
            Calendar(Calendar),
        }
        struct SpanVisitor;
        impl<'de> de::Visitor<'de> for SpanVisitor {
            type Value = Read;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Read, E> {
                Ok(Read::Text(text.to_string()))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Read, A::Error> {
                Calendar::deserialize(de::value::MapAccessDeserializer::new(map)).map(Read::Calendar)
            }
        }
        // A duration is checked once read, so its error is placed as before.
        match d.deserialize_any(SpanVisitor)? {
            Read::Text(text) => Duration::parse(&text)
                .map(Span::Duration)
                .ok_or_else(|| de::Error::custom(crate::units::invalid_duration(&text))),
            Read::Calendar(calendar) => Ok(Span::Calendar(calendar)),
        }
    }
}

#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct HeaderCost {
    header: HeaderName,
    default: u32,
}

impl RawLimit {
    /// The names of the fields given, for the "not a field of" check.
    fn given(&self) -> Vec<&'static str> {
        let fields = [
            ("limit", self.limit.is_some()),
            ("window", self.window.is_some()),
            ("start", self.start.is_some()),
            ("approximate", self.approximate.is_some()),
            ("rate", self.rate.is_some()),
            ("per", self.per.is_some()),
            ("burst", self.burst.is_some()),
            ("capacity", self.capacity.is_some()),
            ("drain", self.drain.is_some()),
            ("every", self.every.is_some()),
            ("lease", self.lease.is_some()),
            ("refill", self.refill.is_some()),
            ("cost", self.cost.is_some()),
            ("actual_cost_header", self.actual_cost_header.is_some()),
            ("reserve", self.reserve.is_some()),
        ];
        fields.iter().filter(|(_, given)| *given).map(|(name, _)| *name).collect()
    }

    fn check(self) -> Result<Limit, Invalid> {
        let (name, allowed) = (self.kind.name(), self.kind.fields());
        if let Some(extra) = self.given().into_iter().find(|f| !allowed.contains(f)) {
            return Err(Invalid::new(format!(
                "`{extra}` is not a field of a {name} limit (expected {})",
                allowed.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ")
            )));
        }
        fn need<T>(value: Option<T>, field: &str) -> Result<T, Invalid> {
            value.ok_or_else(|| Invalid::new(format!("missing field `{field}`")))
        }
        let limit = match self.kind {
            LimitType::FixedWindow => match need(self.window, "window")? {
                Span::Duration(window) => Limit::FixedWindow {
                    limit: need(self.limit, "limit")?,
                    window,
                    start: self.start.unwrap_or_default(),
                },
                Span::Calendar(_) if self.start == Some(WindowStart::FirstHit) => {
                    return Err(Invalid::new("`start: first_hit` needs a duration `window`: a calendar window starts where the calendar says"))
                }
                Span::Calendar(calendar) => {
                    Limit::CalendarWindow { limit: need(self.limit, "limit")?, calendar }
                }
            },
            LimitType::SlidingWindow => Limit::SlidingWindow {
                limit: need(self.limit, "limit")?,
                window: need(self.window, "window")?.duration("a sliding_window's `window`")?,
                approximate: self.approximate.unwrap_or(false),
            },
            LimitType::TokenBucket => Limit::TokenBucket {
                rate: need(self.rate, "rate")?,
                per: need(self.per, "per")?,
                burst: need(self.burst, "burst")?,
            },
            LimitType::LeakyBucket => Limit::LeakyBucket {
                capacity: need(self.capacity, "capacity")?,
                drain: need(self.drain, "drain")?,
            },
            LimitType::Interval => Limit::Interval { every: need(self.every, "every")? },
            LimitType::Concurrency => {
                let limit = need(self.limit, "limit")?;
                let reserve = self.reserve.map(|r| reserve(r, limit)).transpose()?;
                Limit::Concurrency { limit, lease: need(self.lease, "lease")?, reserve }
            }
            LimitType::Points => {
                let capacity = need(self.capacity, "capacity")?;
                let cost = match need(self.cost, "cost")? {
                    RawCost::Fixed(n) => Cost::Fixed(n),
                    RawCost::Header(h) => Cost::Header { header: h.header, default: h.default },
                    RawCost::Named(CostName::LlmTokens) => Cost::LlmTokens,
                };
                if cost == Cost::LlmTokens && self.actual_cost_header.is_some() {
                    return Err(Invalid::new(
                        "a limit that costs llm_tokens reads its true cost from the response's body: drop `actual_cost_header`",
                    ));
                }
                if let Cost::Fixed(n) | Cost::Header { default: n, .. } = cost {
                    if n > capacity.get() {
                        return Err(Invalid::new(format!(
                            "cost {n} exceeds the capacity {}: it could never pass",
                            capacity.get()
                        )));
                    }
                }
                let actual_cost_header = self.actual_cost_header;
                match need(self.refill, "refill")? {
                    Span::Duration(refill) => Limit::Points { capacity, refill, cost, actual_cost_header },
                    Span::Calendar(calendar) => {
                        Limit::CalendarPoints { capacity, calendar, cost, actual_cost_header }
                    }
                }
            }
        };
        check_rate(&limit)?;
        Ok(limit)
    }
}

/// `raw`'s share of a pool of `limit`, in whole slots.
fn reserve(raw: RawReserve, limit: Count) -> Result<PoolReserve, Invalid> {
    if !(raw.share > 0.0 && raw.share < 1.0) {
        return Err(Invalid::new(format!("reserve.share {} is not above 0 and below 1", raw.share)));
    }
    let slots = (f64::from(limit.get()) * raw.share).round() as u32;
    if slots < 1 || slots >= limit.get() {
        return Err(Invalid::new(format!(
            "reserve.share {} of a pool of {} is {slots} slots: it must hold back at least 1 and leave at least 1",
            raw.share,
            limit.get()
        )));
    }
    Ok(PoolReserve { for_class: raw.for_class, for_index: 0, slots })
}

/// The bounds the shim checks too, in one place: see [`WireLimit::validate`].
fn check_rate(limit: &Limit) -> Result<(), Invalid> {
    WireLimit::with_cost(limit, 0).validate()
}

/// A limit as the shim takes it: durations in milliseconds, the request's
/// cost resolved.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, borsh::BorshSerialize, borsh::BorshDeserialize,
)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum WireLimit {
    /// A request costs `cost` (1 from a policy; an RLS call's `hits_addend`).
    FixedWindow {
        limit: u32,
        window_ms: Millis,
        #[serde(default = "one", skip_serializing_if = "is_one")]
        cost: u32,
    },
    SlidingWindow {
        limit: u32,
        window_ms: Millis,
        #[serde(default, skip_serializing_if = "is_false")]
        approximate: bool,
    },
    TokenBucket {
        rate: u32,
        per_ms: Millis,
        burst: u32,
    },
    LeakyBucket {
        capacity: u32,
        drain_ms: Millis,
    },
    Interval {
        every_ms: Millis,
    },
    Concurrency {
        limit: u32,
        lease_ms: Millis,
    },
    Points {
        capacity: u32,
        refill_ms: Millis,
        cost: u32,
    },
    /// A `fixed_window` on a calendar window.
    CalendarWindow {
        limit: u32,
        calendar: Calendar,
        #[serde(default = "one", skip_serializing_if = "is_one")]
        cost: u32,
    },
    /// A `points` limit on a calendar window.
    CalendarPoints {
        capacity: u32,
        cost: u32,
        calendar: Calendar,
    },
    /// A `fixed_window` with `start: first_hit`.
    FirstHitWindow {
        limit: u32,
        window_ms: Millis,
        #[serde(default = "one", skip_serializing_if = "is_one")]
        cost: u32,
    },
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// The longest a bucket may take to refill completely: ten years.
pub const MAX_REFILL_US: Micros = Micros(10 * 365 * 24 * 3600 * 1_000_000);

impl WireLimit {
    /// `limit` as it applies to `req` of `class`: a `points` cost read from
    /// its header; a `concurrency` pool less its reserve for a class the
    /// reserve holds out.
    pub fn of(limit: &Limit, req: &impl Request, class: usize) -> WireLimit {
        match limit {
            Limit::Points { cost, capacity, .. } | Limit::CalendarPoints { cost, capacity, .. } => {
                WireLimit::with_cost(limit, request_cost(cost, capacity.get(), req))
            }
            Limit::Concurrency { limit, lease, reserve: Some(reserve) } => WireLimit::Concurrency {
                limit: reserve.pool_for(limit.get(), class),
                lease_ms: lease.to_millis(),
            },
            _ => WireLimit::with_cost(limit, 1),
        }
    }

    /// `limit` with a `points` cost of `cost`; a window's cost is 1.
    pub fn with_cost(limit: &Limit, cost: u32) -> WireLimit {
        match *limit {
            Limit::FixedWindow { limit, window, start: WindowStart::Epoch } => {
                WireLimit::FixedWindow { limit: limit.get(), window_ms: window.to_millis(), cost: 1 }
            }
            Limit::FixedWindow { limit, window, start: WindowStart::FirstHit } => {
                WireLimit::FirstHitWindow { limit: limit.get(), window_ms: window.to_millis(), cost: 1 }
            }
            Limit::SlidingWindow { limit, window, approximate } => {
                WireLimit::SlidingWindow { limit: limit.get(), window_ms: window.to_millis(), approximate }
            }
            Limit::TokenBucket { rate, per, burst } => {
                WireLimit::TokenBucket { rate: rate.get(), per_ms: per.to_millis(), burst: burst.get() }
            }
            Limit::LeakyBucket { capacity, drain } => {
                WireLimit::LeakyBucket { capacity: capacity.get(), drain_ms: drain.to_millis() }
            }
            Limit::Interval { every } => WireLimit::Interval { every_ms: every.to_millis() },
            Limit::Concurrency { limit, lease, .. } => {
                WireLimit::Concurrency { limit: limit.get(), lease_ms: lease.to_millis() }
            }
            Limit::Points { capacity, refill, .. } => {
                WireLimit::Points { capacity: capacity.get(), refill_ms: refill.to_millis(), cost }
            }
            Limit::CalendarWindow { limit, calendar } => {
                WireLimit::CalendarWindow { limit: limit.get(), calendar, cost: 1 }
            }
            Limit::CalendarPoints { capacity, calendar, .. } => {
                WireLimit::CalendarPoints { capacity: capacity.get(), cost, calendar }
            }
        }
    }

    pub fn kind(&self) -> LimitType {
        match self {
            WireLimit::FixedWindow { .. }
            | WireLimit::CalendarWindow { .. }
            | WireLimit::FirstHitWindow { .. } => LimitType::FixedWindow,
            WireLimit::SlidingWindow { .. } => LimitType::SlidingWindow,
            WireLimit::TokenBucket { .. } => LimitType::TokenBucket,
            WireLimit::LeakyBucket { .. } => LimitType::LeakyBucket,
            WireLimit::Interval { .. } => LimitType::Interval,
            WireLimit::Concurrency { .. } => LimitType::Concurrency,
            WireLimit::Points { .. } | WireLimit::CalendarPoints { .. } => LimitType::Points,
        }
    }

    pub fn type_name(&self) -> &'static str {
        self.kind().name()
    }

    /// What it holds at once: a window's or a pool's limit, a bucket's size.
    pub fn capacity(&self) -> u32 {
        match *self {
            WireLimit::FixedWindow { limit, .. }
            | WireLimit::SlidingWindow { limit, .. }
            | WireLimit::Concurrency { limit, .. }
            | WireLimit::CalendarWindow { limit, .. }
            | WireLimit::FirstHitWindow { limit, .. } => limit,
            WireLimit::TokenBucket { burst, .. } => burst,
            WireLimit::LeakyBucket { capacity, .. }
            | WireLimit::Points { capacity, .. }
            | WireLimit::CalendarPoints { capacity, .. } => capacity,
            WireLimit::Interval { .. } => 1,
        }
    }

    /// The quota and its window in milliseconds, as the RateLimit headers
    /// tell them: its [capacity](Self::capacity) over its window, or the time
    /// an empty bucket takes to fill; no window for concurrency; a calendar
    /// window's nominal length ([`Calendar::nominal_ms`]).
    pub fn quota(&self) -> (u32, Option<Millis>) {
        let window_ms = match *self {
            WireLimit::FixedWindow { window_ms, .. }
            | WireLimit::SlidingWindow { window_ms, .. }
            | WireLimit::FirstHitWindow { window_ms, .. } => Some(window_ms),
            WireLimit::TokenBucket { rate, per_ms, burst } => {
                Some(Millis(per_ms.get().saturating_mul(burst.into()) / u64::from(rate.max(1))))
            }
            WireLimit::LeakyBucket { drain_ms, .. } => Some(drain_ms),
            WireLimit::Interval { every_ms } => Some(every_ms),
            WireLimit::Concurrency { .. } => None,
            WireLimit::Points { refill_ms, .. } => Some(refill_ms),
            WireLimit::CalendarWindow { calendar, .. } | WireLimit::CalendarPoints { calendar, .. } => {
                Some(Millis(calendar.nominal_ms()))
            }
        };
        (self.capacity(), window_ms)
    }

    /// A `points` limit's cost as the check charges it; none for the other kinds.
    pub fn points_cost(&self) -> Option<u32> {
        match *self {
            WireLimit::Points { cost, .. } | WireLimit::CalendarPoints { cost, .. } => Some(cost),
            _ => None,
        }
    }

    /// What a request costs it, where it counts a cost: a window (1, or an
    /// RLS call's `hits_addend`) or a `points` limit; none for the others,
    /// which count requests one by one.
    pub fn cost_mut(&mut self) -> Option<&mut u32> {
        match self {
            WireLimit::FixedWindow { cost, .. }
            | WireLimit::FirstHitWindow { cost, .. }
            | WireLimit::CalendarWindow { cost, .. }
            | WireLimit::Points { cost, .. }
            | WireLimit::CalendarPoints { cost, .. } => Some(cost),
            _ => None,
        }
    }

    /// A `concurrency` limit's lease; none for the other kinds.
    pub fn lease_ms(&self) -> Option<Millis> {
        match *self {
            WireLimit::Concurrency { lease_ms, .. } => Some(lease_ms),
            _ => None,
        }
    }

    /// A number for its kind, 1 to 10, and every field at its full width, 0
    /// where the kind has none (a window's cost in the last): two limits that differ in kind or in any
    /// field never give the same numbers (the over-limit cache's identity;
    /// a calendar by its [code](Calendar::code), distinct for every one).
    pub fn identity(&self) -> (u8, u32, u64, u32) {
        match *self {
            WireLimit::FixedWindow { limit, window_ms, cost } => (1, limit, window_ms.get(), cost),
            WireLimit::SlidingWindow { limit, window_ms, approximate } => {
                (2, limit, window_ms.get(), u32::from(approximate))
            }
            WireLimit::TokenBucket { rate, per_ms, burst } => (3, rate, per_ms.get(), burst),
            WireLimit::LeakyBucket { capacity, drain_ms } => (4, capacity, drain_ms.get(), 0),
            WireLimit::Interval { every_ms } => (5, 0, every_ms.get(), 0),
            WireLimit::Concurrency { limit, lease_ms } => (6, limit, lease_ms.get(), 0),
            WireLimit::Points { capacity, refill_ms, cost } => (7, capacity, refill_ms.get(), cost),
            WireLimit::CalendarWindow { limit, calendar, cost } => (8, limit, calendar.code(), cost),
            WireLimit::CalendarPoints { capacity, cost, calendar } => (9, capacity, calendar.code(), cost),
            WireLimit::FirstHitWindow { limit, window_ms, cost } => (10, limit, window_ms.get(), cost),
        }
    }

    /// Its type and numbers, durations in milliseconds, for a replay's
    /// report: `fixed_window 100 per 60000ms`.
    pub fn describe(&self) -> String {
        match *self {
            WireLimit::FixedWindow { limit, window_ms, .. } => {
                format!("fixed_window {limit} per {}ms", window_ms.get())
            }
            WireLimit::SlidingWindow { limit, window_ms, approximate } => {
                let kind = if approximate { "approximate sliding_window" } else { "sliding_window" };
                format!("{kind} {limit} per {}ms", window_ms.get())
            }
            WireLimit::TokenBucket { rate, per_ms, burst } => {
                format!("token_bucket {rate} per {}ms, burst {burst}", per_ms.get())
            }
            WireLimit::LeakyBucket { capacity, drain_ms } => {
                format!("leaky_bucket {capacity}, drained in {}ms", drain_ms.get())
            }
            WireLimit::Interval { every_ms } => format!("interval {}ms", every_ms.get()),
            WireLimit::Concurrency { limit, lease_ms } => {
                format!("concurrency {limit}, lease {}ms", lease_ms.get())
            }
            WireLimit::Points { capacity, refill_ms, .. } => {
                format!("points {capacity} per {}ms", refill_ms.get())
            }
            WireLimit::CalendarWindow { limit, calendar, .. } => {
                format!("fixed_window {limit} per {calendar}")
            }
            WireLimit::CalendarPoints { capacity, calendar, .. } => {
                format!("points {capacity} per {calendar}")
            }
            WireLimit::FirstHitWindow { limit, window_ms, .. } => {
                format!("fixed_window {limit} per {}ms from the first hit", window_ms.get())
            }
        }
    }

    /// Its numbers in words, without its type, durations shown by `show`,
    /// for the dashboard: `100 per 1m`.
    pub fn summary(&self, show: impl Fn(Millis) -> String) -> String {
        match *self {
            WireLimit::FixedWindow { limit, window_ms, .. } => format!("{limit} per {}", show(window_ms)),
            WireLimit::SlidingWindow { limit, window_ms, approximate } => {
                let how = if approximate { " (approximate)" } else { "" };
                format!("{limit} per {}{how}", show(window_ms))
            }
            WireLimit::TokenBucket { rate, per_ms, burst } => {
                format!("{rate} per {}, burst {burst}", show(per_ms))
            }
            WireLimit::LeakyBucket { capacity, drain_ms } => {
                format!("{capacity}, drains in {}", show(drain_ms))
            }
            WireLimit::Interval { every_ms } => format!("1 per {}", show(every_ms)),
            WireLimit::Concurrency { limit, lease_ms } => {
                format!("{limit} in flight, lease {}", show(lease_ms))
            }
            WireLimit::Points { capacity, refill_ms, .. } => {
                format!("{capacity} points, refilled in {}", show(refill_ms))
            }
            WireLimit::CalendarWindow { limit, calendar, .. } => format!("{limit} per {calendar}"),
            WireLimit::CalendarPoints { capacity, calendar, .. } => {
                format!("{capacity} points per {calendar}")
            }
            WireLimit::FirstHitWindow { limit, window_ms, .. } => {
                format!("{limit} per {} from the first hit", show(window_ms))
            }
        }
    }

    /// Checks the ranges the policy language guarantees, for a shim that
    /// must not trust its caller: counts 1 to 1e9, durations 1 ms to a year,
    /// a bucket unit of at least a microsecond, a refill of at most ten years,
    /// a points cost of at most the capacity, a window's cost of at least 1
    /// (above its limit it is never admitted).
    pub fn validate(&self) -> Result<(), Invalid> {
        if let WireLimit::FixedWindow { cost: 0, .. }
        | WireLimit::FirstHitWindow { cost: 0, .. }
        | WireLimit::CalendarWindow { cost: 0, .. } = self
        {
            return Err(Invalid::new("cost 0: a window counts each request at least once"));
        }
        let (counts, durations): (&[u32], &[Millis]) = match self {
            WireLimit::FixedWindow { limit, window_ms, .. }
            | WireLimit::FirstHitWindow { limit, window_ms, .. }
            | WireLimit::SlidingWindow { limit, window_ms, .. } => (&[*limit], &[*window_ms]),
            WireLimit::TokenBucket { rate, per_ms, burst } => (&[*rate, *burst], &[*per_ms]),
            WireLimit::LeakyBucket { capacity, drain_ms } => (&[*capacity], &[*drain_ms]),
            WireLimit::Interval { every_ms } => (&[], &[*every_ms]),
            WireLimit::Concurrency { limit, lease_ms } => (&[*limit], &[*lease_ms]),
            WireLimit::Points { capacity, refill_ms, .. } => (&[*capacity], &[*refill_ms]),
            WireLimit::CalendarWindow { limit, .. } => (&[*limit], &[]),
            WireLimit::CalendarPoints { capacity, cost, .. } => {
                if cost > capacity {
                    return Err(Invalid::new(format!("cost {cost} exceeds the capacity {capacity}")));
                }
                (&[*capacity], &[])
            }
        };
        if let Some(n) = counts.iter().find(|n| Count::new(u64::from(**n)).is_none()) {
            return Err(Invalid::new(format!("count {n} out of range (1 to {MAX_COUNT})")));
        }
        if let Some(ms) = durations.iter().find(|ms| Duration::from_millis(ms.get()).is_none()) {
            return Err(Invalid::new(format!("duration {}ms out of range (1ms to 365d)", ms.get())));
        }
        let (period_ms, units, burst) = match *self {
            WireLimit::TokenBucket { rate, per_ms, burst } => (per_ms, rate, burst),
            WireLimit::LeakyBucket { capacity, drain_ms } => (drain_ms, capacity, capacity),
            WireLimit::Points { capacity, refill_ms, .. } => (refill_ms, capacity, capacity),
            _ => return Ok(()),
        };
        if period_ms.as_micros() < Micros(u64::from(units)) {
            return Err(Invalid::new(format!(
                "{units} per {} is more than one per microsecond, the finest rate Sluice keeps",
                Duration::from_millis(period_ms.get()).map(|d| d.to_string()).unwrap_or_default()
            )));
        }
        if let WireLimit::Points { capacity, cost, .. } = *self {
            if cost > capacity {
                return Err(Invalid::new(format!("cost {cost} exceeds the capacity {capacity}")));
            }
        }
        if per_unit(period_ms, units).get().saturating_mul(u64::from(burst)) > MAX_REFILL_US.get() {
            return Err(Invalid::new("the bucket would take more than ten years to refill"));
        }
        Ok(())
    }
}

/// A request's cost, at most `capacity` (see [`crate::cost`]): a header
/// value that is not a whole number counts as the default.
fn request_cost(cost: &Cost, capacity: u32, req: &impl Request) -> u32 {
    match cost {
        Cost::Fixed(n) => *n,
        Cost::Header { header, default } => {
            req.header(header.as_str()).and_then(|v| read_cost(&v, capacity)).unwrap_or(*default)
        }
        // Reserved from the policy's `llm` (`Applied::check`), not here.
        Cost::LlmTokens => 0,
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RawLimit::deserialize(d)?.check().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serde reads each kind by the name [`KINDS`] gives it.
    #[test]
    fn each_kind_parses_from_its_name() {
        for (i, (name, _)) in KINDS.iter().enumerate() {
            let kind: LimitType = serde_json::from_value(serde_json::json!(name)).expect("a kind");
            assert_eq!(kind as usize, i, "{name}");
            assert_eq!(kind.name(), *name);
        }
    }
}
