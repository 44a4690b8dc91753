//! Raw script load with `redis-benchmark`: the command the shim sends (FCALL
//! of its check library, or EVALSHA where Redis has no functions), captured
//! with MONITOR and replayed straight to Redis, so the script, the keys and
//! the arguments are the shim's own. Arguments that differ per
//! request (the request id; the key, where the scenario varies it) become
//! redis-benchmark's `__rand_int__`, a random 12-digit number per request.
//!
//! Also reads `INFO memory` for the scale scenario.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::tools::output_within;

/// redis-benchmark's placeholder for a random number in `0..keyspace`.
pub(crate) const RAND: &str = "__rand_int__";
/// No redis-benchmark run here may take longer.
const LIMIT: Duration = Duration::from_secs(120);

/// One redis-benchmark run; latencies in milliseconds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Raw {
    pub(crate) rps: f64,
    pub(crate) mean: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
}

/// The script call (FCALL or EVALSHA) that the shim sent for two checks of
/// `policy` (as MONITOR saw them), with each argument that differs between
/// the two replaced by `vary(first, second)`. Calls on other policies' keys
/// (the lease and quota calls of the other setups on the same Redis) are
/// left out.
pub(crate) fn template(
    commands: &[Vec<String>],
    policy: &str,
    vary: impl Fn(&str, &str) -> String,
) -> Result<Vec<String>> {
    let tag = format!("sluice:{{{policy}:");
    let is_call = |c: &&Vec<String>| {
        c.first().is_some_and(|n| n.eq_ignore_ascii_case("FCALL") || n.eq_ignore_ascii_case("EVALSHA"))
            && c.get(3).is_some_and(|key| key.starts_with(&tag))
    };
    let mut calls: Vec<&Vec<String>> = commands.iter().filter(is_call).collect();
    // A retry after NOSCRIPT, or after loading the library, sends the same call again.
    calls.dedup();
    let [first, second] = calls[..] else {
        bail!("expected the shim to send 2 script calls, MONITOR saw {}: {commands:?}", calls.len());
    };
    if first.len() != second.len() {
        bail!("the shim's two script calls have different shapes: {first:?} and {second:?}");
    }
    Ok(first.iter().zip(second).map(|(a, b)| if a == b { a.clone() } else { vary(a, b) }).collect())
}

/// `requests` script calls over `clients` connections, `__rand_int__` drawn from `0..keyspace`.
pub(crate) fn run(
    bin: &Path,
    port: u16,
    clients: u32,
    requests: u64,
    keyspace: u64,
    command: &[String],
) -> Result<Raw> {
    let mut cmd = Command::new(bin);
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "--csv"]);
    cmd.args(["-c", &clients.to_string(), "-n", &requests.to_string(), "-r", &keyspace.to_string()]);
    cmd.args(command);
    let out = output_within(&mut cmd, LIMIT)?;
    parse_csv(&out).with_context(|| format!("reading redis-benchmark's CSV:\n{out}"))
}

/// The last line: `"<command>","rps","avg","min","p50","p95","p99","max"`.
fn parse_csv(out: &str) -> Result<Raw> {
    let line = out.lines().rev().find(|l| !l.trim().is_empty()).context("no output")?;
    let fields: Vec<f64> =
        line.rsplitn(8, ',').take(7).map(|f| f.trim_matches('"').parse()).collect::<Result<_, _>>()?;
    // rsplitn yields from the end: max, p99, p95, p50, min, avg, rps.
    Ok(Raw { rps: fields[6], mean: fields[5], p50: fields[3], p99: fields[1] })
}

/// `used_memory` from `INFO memory`, in bytes.
pub(crate) fn used_memory(conn: &mut redis::Connection) -> Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query(conn)?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .context("INFO memory has no used_memory")?
        .trim()
        .parse()
        .context("used_memory is not a number")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// redis-benchmark 7's CSV, whose first field (the command) may hold commas.
    #[test]
    fn reads_the_csv_line() {
        let out = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                   \"EVALSHA ab 1 k,x\",\"21030.49\",\"0.512\",\"0.072\",\"0.367\",\"1.207\",\"4.607\",\"15.727\"\n";
        let raw = parse_csv(out).unwrap();
        assert_eq!((raw.rps, raw.mean, raw.p50, raw.p99), (21030.49, 0.512, 0.367, 4.607));
    }

    /// Only the arguments that differ between the two captures are varied;
    /// calls on another policy's keys are not the shim's checks. (Regression:
    /// the quick bench failed when an RLQS setup's lease call on the same
    /// Redis came between the two checks.)
    #[test]
    fn template_varies_what_differs() {
        let cmd = |key: &str, id: &str| {
            vec!["EVALSHA".into(), "ab".into(), "1".into(), key.into(), "".into(), id.into()]
        };
        let (k, other) = ("sluice:{p:k}:sw:1000", "sluice:{q:}:fw:1000");
        let commands = [cmd(k, "1.a"), vec!["PING".into()], cmd(other, "7"), cmd(k, "1.b")];
        let t = template(&commands, "p", |_, _| RAND.into()).unwrap();
        assert_eq!(t, ["EVALSHA", "ab", "1", k, "", RAND]);
    }
}
