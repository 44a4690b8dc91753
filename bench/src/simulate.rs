//! `--simulate`: how fast `sluice simulate` replays a big access log. It
//! writes a log of Envoy's text format (1M lines; 100k with `--quick`), one
//! request every 3.6 ms from 2,000 clients in `x-forwarded-for`, each line
//! up to 5 s out of start order as a real log is, then times the built
//! `dist/sluice simulate` on it through a dual sliding window per client and
//! a global token bucket, and prints lines per second. Needs only
//! `dist/sluice`, no Redis or Envoy.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

const POLICY: &str = r#"{"trusted_hops": 1, "policies": [
  {"name": "per-client", "match": {"path_prefix": "/v42/"}, "key": ["ip"],
   "limits": [{"type": "sliding_window", "limit": 25, "window": "5s"},
              {"type": "sliding_window", "limit": 300, "window": "1m"}]},
  {"name": "global", "limits": [{"type": "token_bucket", "rate": 200, "per": "1s", "burst": 400}]}
]}"#;

/// 2026-11-23T10:00:00Z, in seconds.
const T0: u64 = 1_795_428_000;

/// Writes the log into `dir`, runs the replay, prints and returns lines per second.
pub(crate) fn run(sluice: &Path, dir: &Path, lines: u64) -> Result<f64> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let policy = dir.join("policy.json");
    std::fs::write(&policy, POLICY).with_context(|| format!("writing {}", policy.display()))?;
    let log = dir.join("access.log");
    write_log(&log, lines)?;
    let started = Instant::now();
    let out = Command::new(sluice)
        .arg("simulate")
        .arg("--policy")
        .arg(&policy)
        .arg(&log)
        .output()
        .with_context(|| format!("running {}", sluice.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("sluice simulate failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let rate = lines as f64 / seconds;
    println!("sluice simulate: {lines} lines in {seconds:.2} s, {rate:.0} lines/s");
    Ok(rate)
}

fn write_log(path: &Path, lines: u64) -> Result<()> {
    let file = std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let mut line = String::new();
    for i in 0..lines {
        // Started 3.6 ms apart, logged up to 5 s late: a fixed scramble.
        let start_ms = T0 * 1000 + i * 36 / 10 + (i * 7_919) % 5_000;
        let (secs, ms) = (start_ms / 1000, start_ms % 1000);
        let client = (i * 7_919) % 2_000;
        line.clear();
        let _ = writeln!(
            line,
            r#"[{}.{ms:03}Z] "GET /v42/orders/{} HTTP/1.1" 200 - 0 512 {} {} "10.{}.{}.9" "bench/1.0" "id-{i}" "api.example.com" "10.1.0.1:80""#,
            rfc3339_seconds(secs),
            i % 100,
            i % 300,
            i % 290,
            client / 250,
            client % 250,
        );
        out.write_all(line.as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SS` of seconds since the epoch (days from the civil
/// calendar algorithm of Howard Hinnant's `civil_from_days`).
fn rfc3339_seconds(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}", rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn seconds_become_a_calendar_time() {
        assert_eq!(super::rfc3339_seconds(super::T0), "2026-11-23T10:00:00");
        assert_eq!(super::rfc3339_seconds(951_782_400), "2000-02-29T00:00:00");
    }
}
