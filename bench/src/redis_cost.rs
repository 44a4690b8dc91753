//! Scenario 3: what each limit type costs Redis, beside the hand-written
//! scripts of `bench/handwritten/`, in one Redis: CPU per decision
//! (`usec_per_call` of EVALSHA in INFO commandstats, reset before each case)
//! and memory per client key (MEMORY USAGE of all the keys one client's
//! state takes, averaged over a sample).
//!
//! Every case runs the same traffic: `CALLS` decisions round-robin over
//! `CLIENTS` client keys, all of them admitted, so each case is measured on
//! its allow path with the state a client under its limit keeps.

use anyhow::{Context, Result};
use redis::Script;
use sluice_policies::algorithm::Algorithm;
use sluice_policies::units::Millis;
use sluice_policies::wire::{Check, WireLimit};
use sluice_shim::keys::script_limits;
use sluice_shim::scripts::{Invocation, Scripts};

const CLIENTS: usize = 1_000;
const SAMPLE: usize = 100;

pub(crate) struct Cost {
    pub case: String,
    pub usec_per_call: f64,
    pub bytes_per_client: f64,
    /// Instructions Redis ran per decision, counted by callgrind (`--callgrind`).
    pub instructions: Option<u64>,
}

/// Counts the instructions of a redis-server that runs under valgrind's
/// callgrind (`cargo xtask bench --redis-cost --callgrind`): unlike times,
/// the counts repeat on a busy machine.
pub(crate) struct Callgrind {
    /// Where callgrind writes its dumps.
    pub(crate) dir: std::path::PathBuf,
}

impl Callgrind {
    fn zero(&self) -> Result<()> {
        crate::tools::probe(std::process::Command::new("callgrind_control").arg("--zero"))
            .map(drop)
            .context("callgrind_control --zero")
    }

    /// Dumps the counts since the last zero and returns their total.
    fn dump(&self) -> Result<u64> {
        crate::tools::probe(std::process::Command::new("callgrind_control").arg("--dump"))
            .context("callgrind_control --dump")?;
        let newest = std::fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok())
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
            .context("no callgrind dump")?;
        let text = std::fs::read_to_string(newest.path())?;
        text.lines()
            .find_map(|l| l.strip_prefix("summary:").or_else(|| l.strip_prefix("totals:")))
            .and_then(|n| n.split_whitespace().next()?.parse().ok())
            .context("no totals in the callgrind dump")
    }
}

/// The cases: each Sluice type, then the hand-written scripts.
fn sluice_cases() -> Vec<(&'static str, Vec<WireLimit>)> {
    vec![
        (
            "fixed_window 100/1m",
            vec![WireLimit::FixedWindow { limit: 100, window_ms: Millis(60_000), cost: 1 }],
        ),
        (
            "sliding_window 25/5s + 300/5m (S0)",
            vec![
                WireLimit::SlidingWindow { limit: 25, window_ms: Millis(5_000), approximate: false },
                WireLimit::SlidingWindow { limit: 300, window_ms: Millis(300_000), approximate: false },
            ],
        ),
        (
            "sliding_window approximate 100/1m",
            vec![WireLimit::SlidingWindow { limit: 100, window_ms: Millis(60_000), approximate: true }],
        ),
        (
            "token_bucket 100/1s burst 500",
            vec![WireLimit::TokenBucket { rate: 100, per_ms: Millis(1_000), burst: 500 }],
        ),
        ("interval 1ms", vec![WireLimit::Interval { every_ms: Millis(1) }]),
        ("concurrency 50, lease 30s", vec![WireLimit::Concurrency { limit: 50, lease_ms: Millis(30_000) }]),
        (
            "points 1000/20s, cost 10",
            vec![WireLimit::Points { capacity: 1000, refill_ms: Millis(20_000), cost: 10 }],
        ),
    ]
}

pub(crate) fn run(
    conn: &mut redis::Connection,
    calls: usize,
    counter: Option<&Callgrind>,
) -> Result<Vec<Cost>> {
    let scripts = Scripts::new();
    let check = |client: usize, call: usize, limits: &[WireLimit]| -> Result<Invocation<'_>> {
        let mut inv = scripts.check.prepare_invoke();
        inv.arg("").arg(format!("r{call}"));
        for (key, alg) in case_keys(limits, client)? {
            let (kind, [a, b, c, d]) = alg.script_args(0);
            inv.key(key).arg(kind).arg(a).arg(b).arg(c).arg(d);
        }
        Ok(inv)
    };
    let keys = |client: usize, limits: &[WireLimit]| -> Result<Vec<String>> {
        Ok(case_keys(limits, client)?.into_iter().map(|(k, _)| k).collect())
    };
    let _: String = scripts.check.prepare_invoke().load().query(conn).context("FUNCTION LOAD")?;
    let mut costs = Vec::new();
    // As the shim runs it: the library's function.
    for (name, limits) in sluice_cases() {
        costs.push(measure(
            conn,
            counter,
            name,
            calls,
            "fcall",
            |conn, client, call| Ok(check(client, call, &limits)?.fcall().query(conn)?),
            |client| keys(client, &limits),
        )?);
    }
    // As a script, where Redis has no functions: its helpers defined on
    // every call.
    let _: String = scripts.check.script.prepare_invoke().load(conn).context("SCRIPT LOAD")?;
    for (name, limits) in
        sluice_cases().into_iter().filter(|(n, _)| n.starts_with("fixed_window") || n.ends_with("(S0)"))
    {
        costs.push(measure(
            conn,
            counter,
            &format!("{name}, as a script (EVALSHA)"),
            calls,
            "evalsha",
            |conn, client, call| Ok(check(client, call, &limits)?.script().invoke(conn)?),
            |client| keys(client, &limits),
        )?);
    }
    costs.extend(handwritten(conn, calls, counter)?);
    Ok(costs)
}

/// The state keys and algorithms of `limits` for client `client`, as the shim names them.
pub(crate) fn case_keys(limits: &[WireLimit], client: usize) -> Result<Vec<(String, Algorithm)>> {
    let check = Check {
        policy: "bench".into(),
        key: format!("client{client}"),
        limits: limits.to_vec(),
        margin_ms: None,
        upstream: false,
        levels: Vec::new(),
    };
    let limits = script_limits(&[check]).map_err(anyhow::Error::msg)?;
    Ok(limits.into_iter().map(|l| (l.key, l.algorithm)).collect())
}

/// `usec_per_call` of `command` in INFO commandstats.
fn usec_per_call(conn: &mut redis::Connection, command: &str) -> Result<f64> {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(conn)?;
    stats
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("usec_per_call=")))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {command} in INFO commandstats"))
}

fn handwritten(conn: &mut redis::Connection, calls: usize, counter: Option<&Callgrind>) -> Result<Vec<Cost>> {
    let dual = Script::new(include_str!("../handwritten/dual_window_zset.lua"));
    let incr = Script::new(include_str!("../handwritten/incr_counter.lua"));
    let bucket = Script::new(include_str!("../handwritten/token_bucket_two_keys.lua"));
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    };
    let mut costs = Vec::new();
    let keys = |client: usize, names: &[&str]| {
        names.iter().map(|n| format!("hand:{n}:client{client}")).collect::<Vec<_>>()
    };
    for script in [&dual, &incr, &bucket] {
        let _: String = script.prepare_invoke().load(conn).context("SCRIPT LOAD")?;
    }
    costs.push(measure(
        conn,
        counter,
        "hand-written S0 dual sorted sets",
        calls,
        "evalsha",
        |conn, client, _| {
            let mut inv = dual.prepare_invoke();
            for k in keys(client, &["w5", "w300"]) {
                inv.key(k);
            }
            inv.arg(now()).arg(5).arg(25).arg(300).arg(300);
            Ok(inv.invoke(conn)?)
        },
        |client| Ok(keys(client, &["w5", "w300"])),
    )?);
    costs.push(measure(
        conn,
        counter,
        "hand-written S3 INCR with SET NX EX",
        calls,
        "evalsha",
        |conn, client, _| {
            let mut inv = incr.prepare_invoke();
            inv.key(keys(client, &["n"])[0].clone()).arg(60);
            Ok(inv.invoke(conn)?)
        },
        |client| Ok(keys(client, &["n"])),
    )?);
    costs.push(measure(
        conn,
        counter,
        "hand-written S4a two-key token bucket",
        calls,
        "evalsha",
        |conn, client, _| {
            let mut inv = bucket.prepare_invoke();
            for k in keys(client, &["tokens", "ts"]) {
                inv.key(k);
            }
            inv.arg(100).arg(500).arg(now()).arg(1);
            Ok(inv.invoke(conn)?)
        },
        |client| Ok(keys(client, &["tokens", "ts"])),
    )?);
    Ok(costs)
}

/// Runs `calls` decisions round-robin over the clients (`decide(conn,
/// client, call)`, loaded beforehand), then reads the CPU per call of
/// `command` and the memory of a sample of clients' keys. Flushing the
/// keys keeps loaded scripts and functions.
#[allow(clippy::too_many_arguments)]
fn measure(
    conn: &mut redis::Connection,
    counter: Option<&Callgrind>,
    case: &str,
    calls: usize,
    command: &str,
    decide: impl Fn(&mut redis::Connection, usize, usize) -> Result<redis::Value>,
    keys: impl Fn(usize) -> Result<Vec<String>>,
) -> Result<Cost> {
    redis::cmd("FLUSHALL").query::<()>(conn)?;
    redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(conn)?;
    if let Some(counter) = counter {
        counter.zero()?;
    }
    for call in 0..calls {
        decide(conn, call % CLIENTS, call).with_context(|| format!("{case}: call {call}"))?;
    }
    let instructions = match counter {
        Some(counter) => Some(counter.dump()? / calls.max(1) as u64),
        None => None,
    };
    let usec_per_call = usec_per_call(conn, command).with_context(|| case.to_string())?;
    let mut bytes = 0u64;
    for client in 0..SAMPLE {
        for key in keys(client)? {
            let usage: Option<u64> =
                redis::cmd("MEMORY").arg("USAGE").arg(&key).arg("SAMPLES").arg(0).query(conn)?;
            bytes += usage.unwrap_or(0);
        }
    }
    Ok(Cost {
        case: case.to_string(),
        usec_per_call,
        bytes_per_client: bytes as f64 / SAMPLE as f64,
        instructions,
    })
}

/// The table for `bench/README.md`.
pub(crate) fn table(costs: &[Cost]) -> String {
    let counted = costs.iter().any(|c| c.instructions.is_some());
    let mut out = String::from("| case | Redis CPU per decision (µs) | memory per client key (bytes) |");
    out.push_str(if counted {
        " Redis instructions per decision |\n|---|---:|---:|---:|\n"
    } else {
        "\n|---|---:|---:|\n"
    });
    for c in costs {
        let bytes = if c.bytes_per_client.is_nan() {
            "as above".into()
        } else {
            format!("{:.0}", c.bytes_per_client)
        };
        out.push_str(&format!("| {} | {:.2} | {bytes} |", c.case, c.usec_per_call));
        if let Some(n) = c.instructions {
            out.push_str(&format!(" {n} |"));
        }
        out.push('\n');
    }
    out
}
