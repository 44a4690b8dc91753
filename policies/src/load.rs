//! The utilization signal a shedding policy reads (scenario S4d), from 0
//! (idle) to 1 (saturated), as a gateway can see it:
//!
//! - `{"header": "x-load"}`: a number from 0 to 1 in a response header;
//! - `{"orca": "cpu_utilization"}`: a field of the upstream's ORCA load
//!   report, the `endpoint-load-metrics` response header that Envoy's own
//!   load balancers read, in its `TEXT` or `JSON` form
//!   (`TEXT cpu_utilization=0.3, mem_utilization=0.8`);
//! - `"pool"`: the occupancy of the policy's own `concurrency` pool, as
//!   each admission reports it.
//!
//! A value that is not a number from 0 to 1 is no report: a broken header
//! never sheds traffic.

use serde::de::{self, Deserialize, Deserializer};

use crate::HeaderName;

/// The header of an ORCA load report.
pub const ORCA_HEADER: &str = "endpoint-load-metrics";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    Header(HeaderName),
    Orca(String),
    Pool,
}

#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSignalFields {
    /// A response header carrying a number from 0 to 1.
    header: Option<HeaderName>,
    /// A field of the ORCA `endpoint-load-metrics` response header, e.g. `cpu_utilization`.
    orca: Option<String>,
}

/// `"pool"`, or `{"header": NAME}`, or `{"orca": FIELD}`.
#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub(crate) enum RawSignal {
    Named(String),
    Fields(RawSignalFields),
}

impl<'de> Deserialize<'de> for Signal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let expected = r#"expected "pool", {"header": NAME} or {"orca": FIELD}"#;
        match RawSignal::deserialize(d)
            .map_err(|_| de::Error::custom(format!("invalid signal ({expected})")))?
        {
            RawSignal::Named(name) if name == "pool" => Ok(Signal::Pool),
            RawSignal::Fields(RawSignalFields { header: Some(h), orca: None }) => Ok(Signal::Header(h)),
            RawSignal::Fields(RawSignalFields { header: None, orca: Some(field) }) => {
                let valid = !field.is_empty()
                    && field.len() <= 128
                    && field.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.".contains(&b));
                if valid {
                    Ok(Signal::Orca(field))
                } else {
                    Err(de::Error::custom(format!("invalid ORCA field {field:?} (e.g. \"cpu_utilization\")")))
                }
            }
            _ => Err(de::Error::custom(format!("invalid signal ({expected})"))),
        }
    }
}

impl Signal {
    /// The utilization a response reports, if it reports one; `header`
    /// gives a response header's value by (lower-case) name.
    pub fn read<B: AsRef<[u8]>>(&self, header: impl Fn(&str) -> Option<B>) -> Option<f64> {
        match self {
            Signal::Header(name) => utilization(std::str::from_utf8(header(name.as_str())?.as_ref()).ok()?),
            Signal::Orca(field) => {
                orca_field(std::str::from_utf8(header(ORCA_HEADER)?.as_ref()).ok()?, field)
            }
            Signal::Pool => None,
        }
    }
}

/// A pool's occupancy once a request holds a slot: `remaining` slots are
/// left of `limit`.
pub fn pool_occupancy(limit: u32, remaining: u64) -> f64 {
    let held = u64::from(limit).saturating_sub(remaining);
    (held as f64 / f64::from(limit.max(1))).clamp(0.0, 1.0)
}

/// A number from 0 to 1, or nothing.
fn utilization(text: &str) -> Option<f64> {
    let value: f64 = text.trim().parse().ok()?;
    (0.0..=1.0).contains(&value).then_some(value)
}

/// `field` of an ORCA load report: `TEXT a=0.1, b=0.2` or `JSON {"a": 0.1}`;
/// `named_metrics.NAME` reads a named metric. The binary form is not read.
fn orca_field(report: &str, field: &str) -> Option<f64> {
    let report = report.trim();
    if let Some(text) = report.strip_prefix("TEXT ") {
        let (_, value) =
            text.split(',').filter_map(|pair| pair.split_once('=')).find(|(name, _)| name.trim() == field)?;
        return utilization(value);
    }
    let json: serde_json::Value = serde_json::from_str(report.strip_prefix("JSON ")?).ok()?;
    let value = match field.split_once('.') {
        Some((outer, inner)) => json.get(outer)?.get(inner)?,
        None => json.get(field)?,
    };
    value.as_f64().filter(|v| (0.0..=1.0).contains(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(signal: &str, headers: &[(&str, &str)]) -> Option<f64> {
        let signal: Signal = serde_json::from_str(signal).expect("signal");
        signal.read(|name| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_bytes()))
    }

    #[test]
    fn a_header_carries_a_number_from_0_to_1() {
        let s = r#"{"header": "x-load"}"#;
        assert_eq!(read(s, &[("x-load", " 0.85 ")]), Some(0.85));
        assert_eq!(read(s, &[("x-load", "1.5")]), None, "beyond 1: no report");
        assert_eq!(read(s, &[("x-load", "-0.1")]), None);
        assert_eq!(read(s, &[("x-load", "NaN")]), None);
        assert_eq!(read(s, &[("x-load", "high")]), None);
        assert_eq!(read(s, &[]), None);
    }

    #[test]
    fn an_orca_report_gives_its_field_in_text_or_json() {
        let s = r#"{"orca": "cpu_utilization"}"#;
        let text = "TEXT mem_utilization=0.2, cpu_utilization=0.9";
        assert_eq!(read(s, &[(ORCA_HEADER, text)]), Some(0.9));
        let json = r#"JSON {"cpu_utilization": 0.4, "rps_fractional": 10.0}"#;
        assert_eq!(read(s, &[(ORCA_HEADER, json)]), Some(0.4));
        let named = r#"{"orca": "named_metrics.queue"}"#;
        assert_eq!(read(named, &[(ORCA_HEADER, r#"JSON {"named_metrics": {"queue": 0.7}}"#)]), Some(0.7));
        assert_eq!(read(s, &[(ORCA_HEADER, "BIN CgQIARAB")]), None, "the binary form is not read");
        assert_eq!(read(s, &[(ORCA_HEADER, "TEXT mem_utilization=0.2")]), None);
    }

    #[test]
    fn pool_occupancy_counts_the_slots_held() {
        assert_eq!(pool_occupancy(10, 2), 0.8);
        assert_eq!(pool_occupancy(10, 0), 1.0);
        assert_eq!(pool_occupancy(10, 10), 0.0);
    }

    #[test]
    fn bad_signals_are_refused() {
        for bad in
            [r#""cpu""#, r#"{"header": "x-load", "orca": "cpu_utilization"}"#, r#"{"orca": "a b"}"#, "{}"]
        {
            assert!(serde_json::from_str::<Signal>(bad).is_err(), "{bad}");
        }
    }
}
