//! Key footprint: what Redis holds per client key for each limit kind, at
//! scale (`cargo xtask bench --footprint`: 100k client keys; `--footprint
//! --million`: 1M). Each kind fills a fresh Redis through the real check
//! library (`FCALL`, pipelined), one admitted decision per client key, then
//! reads `used_memory` against the empty Redis's: the delta over the client
//! keys is the bytes per client, over `DBSIZE` the bytes per Redis key
//! (allocator overhead and the keyspace's dictionary included, as an
//! operator's `maxmemory` sees it). The concurrency queue is filled through
//! `lua/scripts/acquire.lua`: each client holds its one slot and has one
//! request queued behind it.

use anyhow::{Context, Result};
use sluice_policies::wire::WireLimit;
use sluice_shim::scripts::Scripts;

use sluice_policies::units::Millis;

use crate::redis_cost::case_keys;

/// An hour: every case's state outlives the fill, so each client's keys
/// are all there when measured.
const HOUR: Millis = Millis(3_600_000);

/// Every limit kind, one limit each, with state that lives an hour.
fn cases() -> Vec<(&'static str, WireLimit)> {
    vec![
        ("fixed_window 100/1h", WireLimit::FixedWindow { limit: 100, window_ms: HOUR, cost: 1 }),
        (
            "sliding_window 100/1h (exact log, one entry)",
            WireLimit::SlidingWindow { limit: 100, window_ms: HOUR, approximate: false },
        ),
        (
            "sliding_window approximate 100/1h",
            WireLimit::SlidingWindow { limit: 100, window_ms: HOUR, approximate: true },
        ),
        ("token_bucket 1/1h burst 100 (GCRA)", WireLimit::TokenBucket { rate: 1, per_ms: HOUR, burst: 100 }),
        ("points 1000/1h, cost 10", WireLimit::Points { capacity: 1000, refill_ms: HOUR, cost: 10 }),
        ("interval 1h", WireLimit::Interval { every_ms: HOUR }),
        ("concurrency 50, lease 1h (one lease)", WireLimit::Concurrency { limit: 50, lease_ms: HOUR }),
    ]
}

/// Commands per pipeline.
const BATCH: usize = 1_000;

pub(crate) struct Footprint {
    pub case: String,
    pub clients: usize,
    pub keys: u64,
    pub bytes: u64,
}

fn used_memory(conn: &mut redis::Connection) -> Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query(conn)?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("no used_memory in INFO memory")
}

fn dbsize(conn: &mut redis::Connection) -> Result<u64> {
    Ok(redis::cmd("DBSIZE").query(conn)?)
}

/// Flushes Redis, runs `fill(client, pipe)` for every client in pipelines,
/// and measures what it left.
fn measure(
    conn: &mut redis::Connection,
    case: &str,
    clients: usize,
    fill: impl Fn(usize, &mut redis::Pipeline) -> Result<()>,
) -> Result<Footprint> {
    redis::cmd("FLUSHALL").arg("SYNC").query::<()>(conn)?;
    let before = used_memory(conn)?;
    for start in (0..clients).step_by(BATCH) {
        let mut pipe = redis::pipe();
        for client in start..(start + BATCH).min(clients) {
            fill(client, &mut pipe)?;
        }
        pipe.query::<()>(conn).with_context(|| format!("{case}: filling from client {start}"))?;
    }
    let after = used_memory(conn)?;
    let footprint = Footprint {
        case: case.to_string(),
        clients,
        keys: dbsize(conn)?,
        bytes: after.saturating_sub(before),
    };
    eprintln!(
        "footprint: {case}: {} keys, {:.0} bytes per client",
        footprint.keys,
        footprint.bytes as f64 / clients as f64
    );
    Ok(footprint)
}

pub(crate) fn run(conn: &mut redis::Connection, clients: usize) -> Result<Vec<Footprint>> {
    let scripts = Scripts::new();
    let _: String = scripts.check.prepare_invoke().load().query(conn).context("FUNCTION LOAD")?;
    let mut out = Vec::new();
    for (name, limit) in cases() {
        let limits = [limit];
        out.push(measure(conn, name, clients, |client, pipe| {
            let mut inv = scripts.check.prepare_invoke();
            inv.arg("").arg(format!("r{client}"));
            for (key, alg) in case_keys(&limits, client)? {
                let (kind, [a, b, c, d]) = alg.script_args(0);
                inv.key(key).arg(kind).arg(a).arg(b).arg(c).arg(d);
            }
            pipe.add_command(inv.fcall()).ignore();
            Ok(())
        })?);
    }
    let acquire = &scripts.acquire;
    let _: String = acquire.prepare_invoke().load(conn).context("SCRIPT LOAD acquire")?;
    let queue = [WireLimit::Concurrency { limit: 1, lease_ms: HOUR }];
    out.push(measure(
        conn,
        "concurrency 1, lease 1h: one holder and one queued waiter (wait mode)",
        clients,
        |client, pipe| {
            let (key, _) = case_keys(&queue, client)?.into_iter().next().context("a concurrency key")?;
            for id in ["holder", "waiter"] {
                pipe.cmd("EVALSHA")
                    .arg(acquire.get_hash())
                    .arg(1)
                    .arg(&key)
                    .arg("")
                    .arg(format!("{id}{client}"))
                    .arg(1)
                    .arg(HOUR.0 * 1_000)
                    .arg(HOUR.0 * 1_000)
                    .arg("sluice:footprint")
                    .ignore();
            }
            Ok(())
        },
    )?);
    Ok(out)
}

pub(crate) fn table(rows: &[Footprint]) -> String {
    let mut s = String::from(
        "| limit | client keys | Redis keys | used_memory delta | bytes per client | bytes per Redis key |\n| --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {:.1} MiB | {:.0} | {:.0} |\n",
            r.case,
            r.clients,
            r.keys,
            r.bytes as f64 / (1024.0 * 1024.0),
            r.bytes as f64 / r.clients as f64,
            r.bytes as f64 / r.keys.max(1) as f64
        );
    }
    s
}
