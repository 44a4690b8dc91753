//! Load with oha: one bounded run against one URL, reduced to what the report
//! needs. Fixed-rate runs correct for coordinated omission (a slow answer does
//! not delay the requests behind it). oha gets one worker thread in every run,
//! so the load tool takes the same share of the two cores for every setup.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use super::tools::output_within;

/// How long oha may overrun its own duration before it is killed.
const SLACK: Duration = Duration::from_secs(20);

/// One load run's result.
#[derive(Clone, Debug, Default)]
pub(crate) struct Run {
    /// Latency percentiles, in milliseconds.
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    /// Completed requests per second.
    pub(crate) rps: f64,
    /// Responses by status code.
    pub(crate) statuses: BTreeMap<u16, u64>,
    /// Requests that got no response (connection errors, timeouts).
    pub(crate) errors: u64,
    /// The CPU oha itself used (user and system), in cores: its CPU time
    /// over the run's length.
    pub(crate) load_cpu: f64,
}

/// A named figure of a run, e.g. its p50.
pub(crate) type Figure = (&'static str, fn(&Run) -> f64);
pub(crate) const P50: Figure = ("p50", |r| r.p50);
pub(crate) const P90: Figure = ("p90", |r| r.p90);
pub(crate) const P99: Figure = ("p99", |r| r.p99);
pub(crate) const P999: Figure = ("p99.9", |r| r.p999);

impl Run {
    /// Each figure's median over the rounds (so a figure may come from another
    /// round than its neighbour); statuses and errors are summed.
    pub(crate) fn median(runs: &[Run]) -> Run {
        let mid = |f: fn(&Run) -> f64| median(runs.iter().map(f));
        let mut out = Run {
            p50: mid(|r| r.p50),
            p90: mid(|r| r.p90),
            p99: mid(|r| r.p99),
            p999: mid(|r| r.p999),
            rps: mid(|r| r.rps),
            load_cpu: mid(|r| r.load_cpu),
            ..Run::default()
        };
        for run in runs {
            for (status, n) in &run.statuses {
                *out.statuses.entry(*status).or_default() += n;
            }
            out.errors += run.errors;
        }
        out
    }

    pub(crate) fn total(&self) -> u64 {
        self.statuses.values().sum::<u64>() + self.errors
    }

    /// Requests that did not get `status`.
    pub(crate) fn other_than(&self, status: u16) -> u64 {
        self.total() - self.statuses.get(&status).copied().unwrap_or(0)
    }

    /// Responses with `status` per second: the rate times their share of
    /// every request sent. A setup's rate counts only the answers it is
    /// there to measure: an allow path whose bucket ran dry answers 429s,
    /// which are cheaper and would inflate its rate.
    pub(crate) fn rate_of(&self, status: u16) -> f64 {
        match self.total() {
            0 => f64::NAN,
            total => self.rps * self.statuses.get(&status).copied().unwrap_or(0) as f64 / total as f64,
        }
    }
}

/// The median of `values` (the upper one of an even count); NaN if none.
pub(crate) fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// What to send.
pub(crate) struct Target<'a> {
    pub(crate) url: String,
    /// `Some(body)`: POST it; `None`: GET.
    pub(crate) body: Option<Body<'a>>,
    /// `Some(file)`: each request's URL is picked at random from this file's
    /// lines (oha's `--urls-from-file`), not `url`.
    pub(crate) urls_from: Option<&'a Path>,
}

impl<'a> Target<'a> {
    pub(crate) fn get(url: String) -> Target<'a> {
        Target { url, body: None, urls_from: None }
    }

    pub(crate) fn post(url: String, body: Body<'a>) -> Target<'a> {
        Target { url, body: Some(body), urls_from: None }
    }

    /// GETs of URLs picked at random from the lines of `file`.
    pub(crate) fn urls_from(file: &'a Path) -> Target<'a> {
        Target { url: file.display().to_string(), body: None, urls_from: Some(file) }
    }
}

/// A POST's body and its `content-type`.
#[derive(Clone, Copy)]
pub(crate) struct Body<'a> {
    pub(crate) content_type: &'a str,
    pub(crate) bytes: &'a [u8],
}

impl<'a> Body<'a> {
    pub(crate) fn json(text: &'a str) -> Body<'a> {
        Body { content_type: "application/json", bytes: text.as_bytes() }
    }
}

/// How to send it.
pub(crate) enum Shape {
    /// This many requests per second for this long.
    Rate { rps: u32, for_: Duration },
    /// As fast as `connections` connections allow, for this long.
    Max { for_: Duration },
    /// Exactly this many requests, as fast as `connections` connections allow.
    Closed(u64),
}

pub(crate) fn run(oha: &Path, target: &Target<'_>, shape: &Shape, connections: u32) -> Result<Run> {
    let mut cmd = Command::new(oha);
    cmd.args(["--no-tui", "--output-format", "json", "--worker-threads", "1", "-t", "5s"]);
    let limit = match *shape {
        Shape::Rate { rps, for_ } => {
            cmd.args(["-q", &rps.to_string(), "--latency-correction", "-z", &secs(for_), "-w"]);
            cmd.args(["-c", &connections.to_string()]);
            for_ + SLACK
        }
        Shape::Max { for_ } => {
            cmd.args(["-z", &secs(for_), "-w", "-c", &connections.to_string()]);
            for_ + SLACK
        }
        Shape::Closed(n) => {
            cmd.args(["-n", &n.to_string(), "-c", &connections.to_string()]);
            SLACK * 3
        }
    };
    // oha reads a body that may not be text from a file.
    let file = match target.body {
        Some(body) => {
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("sluice-bench-body-{}-{n}", std::process::id()));
            std::fs::write(&path, body.bytes).with_context(|| format!("writing {}", path.display()))?;
            cmd.args(["-m", "POST", "-T", body.content_type]).arg("-D").arg(&path);
            Some(path)
        }
        None => None,
    };
    match target.urls_from {
        Some(file) => cmd.arg("--urls-from-file").arg(file),
        None => cmd.arg(&target.url),
    };
    let cpu_before = children_cpu();
    let started = std::time::Instant::now();
    let out = output_within(&mut cmd, limit);
    if let Some(path) = file {
        let _ = std::fs::remove_file(path);
    }
    let out = out?;
    let (cpu, wall) = (children_cpu() - cpu_before, started.elapsed().as_secs_f64());
    let mut run = parse(&out).with_context(|| format!("reading oha's JSON for {}", target.url))?;
    run.load_cpu = if wall > 0.0 { cpu / wall } else { f64::NAN };
    Ok(run)
}

/// CPU seconds (user and system) of this process's finished children. Loads
/// run one at a time, so the difference around one is oha's own.
fn children_cpu() -> f64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct we own.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) != 0 {
            return f64::NAN;
        }
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn secs(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

fn parse(json: &str) -> Result<Run> {
    let v: Value = serde_json::from_str(json)?;
    let pct = |name: &str| v["latencyPercentiles"][name].as_f64().unwrap_or(f64::NAN) * 1000.0;
    let count = |map: &Value| -> Vec<(String, u64)> {
        map.as_object()
            .map(|m| m.iter().map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0))).collect())
            .unwrap_or_default()
    };
    let mut statuses = BTreeMap::new();
    for (code, n) in count(&v["statusCodeDistribution"]) {
        statuses.insert(code.parse().context("a status code")?, n);
    }
    let errors = count(&v["errorDistribution"]).iter().map(|(_, n)| n).sum();
    Ok(Run {
        p50: pct("p50"),
        p90: pct("p90"),
        p99: pct("p99"),
        p999: pct("p99.9"),
        rps: v["summary"]["requestsPerSec"].as_f64().context("summary.requestsPerSec")?,
        statuses,
        errors,
        load_cpu: f64::NAN,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An allow path whose bucket ran dry: its 429s do not count toward its
    /// rate (the bench's RLQS allow row once reported 429s as throughput).
    #[test]
    fn a_rate_counts_only_its_status() {
        let run = Run {
            rps: 30_000.0,
            statuses: BTreeMap::from([(200, 600), (429, 300)]),
            errors: 100,
            ..Run::default()
        };
        assert_eq!(run.rate_of(200), 18_000.0);
        assert_eq!(run.rate_of(429), 9_000.0);
        assert!(Run::default().rate_of(200).is_nan());
    }
}
