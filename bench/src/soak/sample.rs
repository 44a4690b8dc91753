//! One sample of the soak: the shim's memory and open files (`/proc`),
//! Redis's memory and key count, the leases held in the pool and the
//! waiters the shim holds, and the `api` latency of the window since the
//! last sample.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result};

use super::traffic::Window;

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sample {
    /// Seconds since the traffic started.
    pub(crate) at: f64,
    pub(crate) rss_mib: f64,
    pub(crate) fds: f64,
    pub(crate) redis_mib: f64,
    pub(crate) keys: f64,
    pub(crate) leases: f64,
    pub(crate) waiters: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    /// Requests answered per second in the window.
    pub(crate) rate: f64,
}

/// One series of a sample: (name, unit, value).
pub(crate) type Series = (&'static str, &'static str, fn(&Sample) -> f64);

/// The series of a sample.
pub(crate) const SERIES: [Series; 8] = [
    ("shim RSS", "MiB", |s| s.rss_mib),
    ("shim open fds", "fds", |s| s.fds),
    ("Redis used_memory", "MiB", |s| s.redis_mib),
    ("Redis keys (DBSIZE)", "keys", |s| s.keys),
    ("pool leases held", "leases", |s| s.leases),
    ("waiters held (shim)", "waiters", |s| s.waiters),
    ("api p50", "ms", |s| s.p50_ms),
    ("api p99", "ms", |s| s.p99_ms),
];

pub(crate) struct Probe {
    pub(crate) shim_pid: u32,
    pub(crate) shim_port: u16,
    pub(crate) redis: redis::Connection,
    /// The pool's lease set (`sluice:{pool:}:cc:<lease ms>`, not its
    /// tombstones `:t` or queue keys), once a lease has been seen.
    pub(crate) pool_key: Option<String>,
}

impl Probe {
    pub(crate) fn sample(&mut self, at: f64, window: Window, span: f64) -> Result<Sample> {
        let info: String = redis::cmd("INFO").arg("memory").query(&mut self.redis)?;
        let used = info_field(&info, "used_memory").context("INFO memory has no used_memory")?;
        let keys: u64 = redis::cmd("DBSIZE").query(&mut self.redis)?;
        if self.pool_key.is_none() {
            self.pool_key = find_key(&mut self.redis, "sluice:{pool:*", |key| {
                key.rsplit(':')
                    .next()
                    .is_some_and(|last| !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()))
            })?;
        }
        let leases: u64 = match &self.pool_key {
            Some(key) => redis::cmd("ZCARD").arg(key).query(&mut self.redis)?,
            None => 0,
        };
        let metrics = http_get(self.shim_port, "/metrics")?;
        let waiters = gauge(&metrics, "sluice_waiters").unwrap_or(f64::NAN);
        let mut ms = window.api_ms;
        ms.sort_by(f64::total_cmp);
        Ok(Sample {
            at,
            rss_mib: rss_kib(self.shim_pid)? / 1024.0,
            fds: open_fds(self.shim_pid)?,
            redis_mib: used / (1024.0 * 1024.0),
            keys: keys as f64,
            leases: leases as f64,
            waiters,
            p50_ms: percentile(&ms, 0.50),
            p99_ms: percentile(&ms, 0.99),
            rate: window.requests as f64 / span.max(1e-9),
        })
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn info_field(info: &str, name: &str) -> Option<f64> {
    info.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).and_then(|v| v.trim().parse().ok())
}

/// A gauge's value in a Prometheus text page.
fn gauge(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())
}

/// The first key matching `pattern` for which `wanted` holds, by SCAN.
fn find_key(
    conn: &mut redis::Connection,
    pattern: &str,
    wanted: impl Fn(&str) -> bool,
) -> Result<Option<String>> {
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) =
            redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000).query(conn)?;
        if let Some(key) = keys.into_iter().find(|k| wanted(k)) {
            return Ok(Some(key));
        }
        if next == 0 {
            return Ok(None);
        }
        cursor = next;
    }
}

fn rss_kib(pid: u32) -> Result<f64> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading the shim's /proc status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc status")
}

fn open_fds(pid: u32) -> Result<f64> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd")).context("listing the shim's fds")?.count() as f64)
}

/// `GET path` on the loopback `port`, the body.
pub(crate) fn http_get(port: u16, path: &str) -> Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (_, body) = text.split_once("\r\n\r\n").context("an HTTP answer without a body")?;
    Ok(body.to_string())
}

/// Every key under `sluice:`, by SCAN, and how many have no TTL (PTTL -1).
pub(crate) fn ttl_scan(conn: &mut redis::Connection) -> Result<(u64, u64, Vec<String>)> {
    let (mut cursor, mut scanned, mut without, mut examples) = (0u64, 0u64, 0u64, Vec::new());
    loop {
        let (next, keys): (u64, Vec<String>) =
            redis::cmd("SCAN").arg(cursor).arg("MATCH").arg("sluice:*").arg("COUNT").arg(1000).query(conn)?;
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("PTTL").arg(key);
            }
            let ttls: Vec<i64> = pipe.query(conn)?;
            for (key, ttl) in keys.iter().zip(ttls) {
                scanned += 1;
                // -2: gone since the SCAN; -1: no TTL.
                if ttl == -1 {
                    without += 1;
                    if examples.len() < 5 {
                        examples.push(key.clone());
                    }
                }
            }
        }
        if next == 0 {
            return Ok((scanned, without, examples));
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_info_and_metrics() {
        assert_eq!(
            info_field("# Memory\r\nused_memory:1048576\r\nused_memory_human:1M\r\n", "used_memory"),
            Some(1048576.0)
        );
        let page = "# HELP sluice_waiters Waiting\n# TYPE sluice_waiters gauge\nsluice_waiters 3\nsluice_waiters_x 9\n";
        assert_eq!(gauge(page, "sluice_waiters"), Some(3.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.5), 3.0);
    }
}
