//! A traffic pattern: streams of requests, each either steady (one request
//! `every` interval from `from` until `until`) or a `burst` of requests at
//! one instant (`at`), with the request's path, method and headers (keys,
//! costs), how long each stays in flight (`duration`, for concurrency) and
//! the LLM tokens each uses (`tokens`, for a policy with an `llm`).
//!
//! ```json
//! {"streams": [
//!   {"headers": {"x-account": "acme"}, "path": "/v42/orders", "every": "100ms", "until": "10s"},
//!   {"headers": {"x-account": "zeta"}, "burst": 30, "at": "2s", "duration": "500ms"}
//! ]}
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;
use sluice_policies::replay::{Recorded, Replayed};
use sluice_policies::request::SimpleRequest;
use sluice_policies::Duration;

/// At most this many requests in one pattern: the page stays responsive.
pub const MAX_REQUESTS: usize = 20_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pattern {
    streams: Vec<Stream>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stream {
    #[serde(default = "root")]
    path: String,
    #[serde(default = "get")]
    method: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// Steady: one request per `every`, from `from` (default 0) until `until`.
    every: Option<Duration>,
    from: Option<Duration>,
    until: Option<Duration>,
    /// A burst of this many requests at `at` (default 0).
    burst: Option<u32>,
    at: Option<Duration>,
    /// How long each request is in flight.
    duration: Option<Duration>,
    /// The LLM tokens each request uses (its usage, as its policy's `llm` charges it).
    tokens: Option<u64>,
}

fn root() -> String {
    "/".into()
}

fn get() -> String {
    "GET".into()
}

fn ms(d: Option<Duration>) -> u64 {
    d.map_or(0, Duration::as_millis)
}

impl Pattern {
    /// Parses and checks a pattern; the error says which stream is wrong.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        let pattern: Pattern = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut total = 0u64;
        for (i, s) in pattern.streams.iter().enumerate() {
            let count = match (s.every, s.burst) {
                (Some(every), None) => {
                    let until = s.until.ok_or(format!("streams[{i}]: a steady stream needs until"))?;
                    until.as_millis().saturating_sub(ms(s.from)).div_ceil(every.as_millis())
                }
                (None, Some(n)) => u64::from(n),
                _ => return Err(format!("streams[{i}]: give either every (with until) or burst (with at)")),
            };
            total = total.saturating_add(count);
        }
        if total > MAX_REQUESTS as u64 {
            return Err(format!("{total} requests; the playground replays at most {MAX_REQUESTS}"));
        }
        Ok(pattern)
    }

    /// Every request, in time order (ties keep stream order), with its stream's index.
    pub fn requests(&self) -> Vec<(usize, Replayed)> {
        let mut out = Vec::new();
        for (i, s) in self.streams.iter().enumerate() {
            let times: Vec<u64> = match (s.every, s.burst) {
                (Some(every), _) => (ms(s.from)..ms(s.until)).step_by(every.as_millis() as usize).collect(),
                (None, Some(n)) => vec![ms(s.at); n as usize],
                (None, None) => Vec::new(),
            };
            for t in times {
                let mut request = SimpleRequest::new(&s.method, &s.path);
                for (name, value) in &s.headers {
                    request = request.header(name, value);
                }
                out.push((
                    i,
                    Replayed {
                        at_us: t * 1000,
                        request,
                        duration_ms: ms(s.duration),
                        tokens: s.tokens,
                        recorded: Recorded::EVERYTHING,
                    },
                ));
            }
        }
        out.sort_by_key(|(i, r)| (r.at_us, *i));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_and_burst_streams_interleave_in_time() {
        let p = Pattern::parse(r#"{"streams": [{"every": "1s", "until": "3s"}, {"burst": 2, "at": "1s"}]}"#)
            .expect("valid");
        let times: Vec<(usize, u64)> = p.requests().iter().map(|(i, r)| (*i, r.at_us / 1000)).collect();
        assert_eq!(times, [(0, 0), (0, 1000), (1, 1000), (1, 1000), (0, 2000)]);
    }

    #[test]
    fn a_wrong_stream_is_named() {
        assert_eq!(
            Pattern::parse(r#"{"streams": [{"burst": 1}, {"every": "1s"}]}"#).unwrap_err(),
            "streams[1]: a steady stream needs until"
        );
        assert!(Pattern::parse(r#"{"streams": [{"every": "1ms", "until": "1d"}]}"#)
            .unwrap_err()
            .contains("at most"));
    }
}
