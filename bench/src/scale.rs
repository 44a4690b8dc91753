//! Scenario 4, scale: decision latency and Redis memory as the number of
//! distinct keys grows, for each limit type the shim decides.
//!
//! - The keys are made by the real script: the shim's own script call (captured
//!   with MONITOR) is replayed for keys `0..N` in pipelined batches.
//! - Latency: redis-benchmark replays the same script call on a key drawn at
//!   random among the N, so every call finds existing state. That is the part
//!   of a decision that can feel the key count; the shim's and the filter's
//!   share of a decision does not depend on it.
//! - Memory: `used_memory` after the preload, less the empty server's, per key.
//!
//! Every replayed call uses one fixed request id, so each key holds the same
//! state (one entry) at every N, and the rows differ only in key count.
//!
//! A limit type is one line in [`KINDS`]. A type the shim does not decide yet
//! (it answers the check with an error) is reported as such and skipped, so
//! rows for GCRA and the approximate window appear once the shim has them.

use anyhow::{Context, Result};

use super::load::{self, Body, Shape, Target};
use super::monitor;
use super::plan::Plan;
use super::redis_bench::{self, Raw, RAND};
use super::setups::Rig;
use super::tools::Tools;

pub(crate) struct Kind {
    pub(crate) name: &'static str,
    /// One limit in the shim's wire format. Limits are never reached, and
    /// state outlasts the run, so no key changes shape or expires meanwhile.
    limit: &'static str,
}

pub(crate) const KINDS: &[Kind] = &[
    Kind {
        name: "sliding_window (exact log)",
        limit: r#"{"type":"sliding_window","limit":1000000000,"window_ms":3600000}"#,
    },
    Kind {
        name: "sliding_window (approximate)",
        limit: r#"{"type":"sliding_window","limit":1000000000,"window_ms":3600000,"approximate":true}"#,
    },
    // GCRA keeps a key only while its bucket is not full, so the rate is slow
    // (one token an hour) and the burst deep (8,000: a refill time under the
    // shim's 365-day bound): each call moves the key's theoretical arrival
    // time an hour on, and no key expires during the run.
    Kind {
        name: "token_bucket (GCRA)",
        limit: r#"{"type":"token_bucket","rate":1,"per_ms":3600000,"burst":8000}"#,
    },
];

/// The key names that mark where the key goes in the captured command.
const KEYS: [&str; 2] = ["scalekey0", "scalekey1"];
/// Connections for the latency measurement: light load, so it shows the
/// cost per call rather than queueing.
const CLIENTS: u32 = 4;
/// Commands per pipelined preload batch.
const BATCH: u64 = 10_000;

pub(crate) struct Point {
    pub(crate) keys: u64,
    pub(crate) raw: Raw,
    pub(crate) bytes_per_key: f64,
}

pub(crate) enum Outcome {
    Measured(Vec<Point>),
    /// The shim does not decide this type yet: why.
    Unsupported(String),
}

pub(crate) fn run(rig: &Rig, plan: &Plan, tools: &Tools) -> Result<Vec<(&'static str, Outcome)>> {
    let mut conn = rig.redis.connection()?;
    let mut out = Vec::new();
    for kind in KINDS {
        eprintln!("bench: scale, {}", kind.name);
        let outcome = match capture(rig, tools, kind)? {
            Err(why) => Outcome::Unsupported(why),
            Ok(command) => Outcome::Measured(measure(rig, plan, tools, &mut conn, &command)?),
        };
        out.push((kind.name, outcome));
    }
    redis::cmd("FLUSHALL").exec(&mut conn)?;
    Ok(out)
}

/// The shim's script call for `kind` with [`RAND`] where the key goes; or why the
/// shim would not decide it.
fn capture(rig: &Rig, tools: &Tools, kind: &Kind) -> Result<Result<Vec<String>, String>> {
    let url = format!("http://127.0.0.1:{}/v1/check", rig.shim.port);
    let bodies = KEYS.map(|key| {
        format!(r#"{{"checks":[{{"policy":"bench-scale","key":"{key}","limits":[{}]}}]}}"#, kind.limit)
    });
    let mut statuses = Vec::new();
    let commands = monitor::client_commands(&tools.redis_cli, rig.redis.port, || {
        for body in &bodies {
            let run =
                load::run(&tools.oha, &Target::post(url.clone(), Body::json(body)), &Shape::Closed(1), 1)?;
            statuses.extend(run.statuses.into_keys());
        }
        Ok(())
    })?;
    if statuses != [200, 200] {
        return Ok(Err(format!("the shim answered {statuses:?} to a check with {}", kind.limit)));
    }
    let template = redis_bench::template(&commands, "bench-scale", |a, _| {
        if a.contains(KEYS[0]) {
            a.replace(KEYS[0], RAND)
        } else {
            "bench".to_string()
        }
    })?;
    Ok(Ok(template))
}

fn measure(
    rig: &Rig,
    plan: &Plan,
    tools: &Tools,
    conn: &mut redis::Connection,
    command: &[String],
) -> Result<Vec<Point>> {
    redis::cmd("FLUSHALL").exec(conn)?;
    let empty = redis_bench::used_memory(conn)?;
    let mut loaded = 0;
    let mut points = Vec::new();
    for &keys in plan.scale_keys {
        preload(conn, command, loaded..keys)?;
        loaded = keys;
        let bytes = redis_bench::used_memory(conn)?.saturating_sub(empty);
        let port = rig.redis.port;
        let raw =
            redis_bench::run(&tools.redis_benchmark, port, CLIENTS, plan.scale_requests, keys, command)?;
        points.push(Point { keys, raw, bytes_per_key: bytes as f64 / keys as f64 });
    }
    Ok(points)
}

/// Runs `command` once for each key number in `range`, in pipelined batches.
fn preload(conn: &mut redis::Connection, command: &[String], range: std::ops::Range<u64>) -> Result<()> {
    let mut start = range.start;
    while start < range.end {
        let end = (start + BATCH).min(range.end);
        let mut pipe = redis::pipe();
        for i in start..end {
            let number = format!("{i:012}");
            let mut cmd = redis::cmd(&command[0]);
            for arg in &command[1..] {
                cmd.arg(arg.replace(RAND, &number));
            }
            pipe.add_command(cmd).ignore();
        }
        pipe.exec(conn).with_context(|| format!("preloading keys {start}..{end}"))?;
        start = end;
    }
    Ok(())
}
