//! Wait precision at the partner (`--jitter`): how late a held call reaches
//! the partner after its slot, and whether any two calls come closer than
//! the partner's interval, on the host as it is and with busy processes
//! beside Envoy.
//!
//! One gateway (the shim and Envoy with the real template) and the mock
//! partner of `sluice_harness::partner`, which enforces an `interval` on
//! arrival by its own clock. The policy states the interval with `wait` and
//! the default margin (or the one asked), and a second limit that never
//! binds, a `sliding_window` of 1,000,000 per hour: it is charged at the
//! same slot as the interval, and its sorted set keeps every call's slot on
//! Redis's clock (`TIME`, µs since the epoch). The partner's arrivals,
//! turned to the same wall clock (one host), each paired with the latest slot at or before it,
//! give each call's lateness: slot to arrival, which is the shim's wake-up,
//! its answer, the filter's resume and Envoy's forward. The smallest
//! lateness is the path's constant part; what a margin must cover is the
//! rest, its jitter (p99, p99.9, max).
//!
//! The shim's own part is read from its `/metrics` when it has them:
//! `sluice_wait_late_seconds` (slot to wake-up, as the shim bounds it) and
//! `sluice_wait_shifted` (confirmations that found a late send in their
//! way and waited longer).
//!
//! "Busy" runs [`BUSY`] spinning processes (`sh -c 'while :; do :; done'`)
//! for the whole run, at normal priority, on the machine's 2 cores.

use std::io::{Read, Write};
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Result;
use sluice_harness::egress::{Busy, Caller, Gateway, Workers};
use sluice_harness::partner::Limits;
use sluice_harness::{Partner, Redis};

/// Spinning processes beside Envoy in a busy run.
pub(crate) const BUSY: usize = 2;
const PATH: &str = "/v42/orders";
const ACCOUNT: &str = "jitter";

/// One run: an interval, a margin (`None`: the default), calls and load.
#[derive(Clone, Debug)]
pub(crate) struct Case {
    pub(crate) interval: Duration,
    pub(crate) margin_ms: Option<u64>,
    pub(crate) workers: usize,
    pub(crate) calls: usize,
    pub(crate) busy: bool,
}

#[derive(Debug)]
pub(crate) struct Measured {
    pub(crate) case: Case,
    pub(crate) served: usize,
    pub(crate) partner_429: usize,
    /// Slot to arrival at the partner, µs: min, p50, p99, p99.9, max.
    pub(crate) late: Option<[f64; 5]>,
    /// Arrivals paired with the latest slot at or before them.
    pub(crate) paired: usize,
    pub(crate) min_gap: Option<Duration>,
    pub(crate) mean_gap: Option<Duration>,
    /// Gaps under the interval at the partner.
    pub(crate) short_gaps: usize,
    /// The shim's own wake-up lateness, µs, p50 and p99 from its
    /// histogram's buckets (upper bounds), if it has the metric.
    pub(crate) shim_late: Option<(f64, f64)>,
    /// The shim's Redis calls, µs, p50 and p99 (bucket upper bounds).
    pub(crate) redis_call: Option<(f64, f64)>,
    /// Confirmations that waited behind a late send, if the shim counts them.
    pub(crate) shifted: Option<u64>,
    /// 1-minute load average at the end of the run.
    pub(crate) load: f64,
}

/// The quick instrument: 20 ms, idle and busy; the full one adds 100 ms and 1 s.
pub(crate) fn cases(quick: bool, margin_ms: Option<u64>) -> Vec<Case> {
    let mut cases = Vec::new();
    let sizes: &[(u64, usize)] = if quick { &[(20, 400)] } else { &[(20, 1000), (100, 200), (1000, 30)] };
    for &(every, calls) in sizes {
        for busy in [false, true] {
            cases.push(Case { interval: Duration::from_millis(every), margin_ms, workers: 10, calls, busy });
        }
    }
    cases
}

pub(crate) fn run(cases: &[Case]) -> Result<Vec<Measured>> {
    let mut all = Vec::new();
    for case in cases {
        eprintln!(
            "bench: jitter: interval {:?}, margin {}, {} calls, {}",
            case.interval,
            case.margin_ms.map_or("default".into(), |m| format!("{m} ms")),
            case.calls,
            if case.busy { "busy" } else { "idle" }
        );
        let measured = one(case)?;
        eprintln!("bench:   {}", row(&measured));
        all.push(measured);
    }
    Ok(all)
}

fn document(case: &Case) -> String {
    let margin = case.margin_ms.map_or(String::new(), |m| format!(r#", "margin": "{m}ms""#));
    format!(
        r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "policies": [
            {{"name": "partner-api", "match": {{"path_prefix": "/v42/"}}, "key": ["header:x-account"],
              "wait": {{"timeout": "60s"{margin}}},
              "limits": [{{"type": "interval", "every": "{}ms"}},
                         {{"type": "sliding_window", "limit": 1000000, "window": "1h"}}]}}]}}"#,
        case.interval.as_millis()
    )
}

fn one(case: &Case) -> Result<Measured> {
    let redis = Redis::start()?;
    let partner = Partner::start(Limits::default().interval(case.interval))?;
    let gateway = Gateway::start(&document(case), &redis, partner.port)?;
    // Warm up (scripts loaded, pools open) as another account.
    let warm = Caller::new(PATH, "warm-up", Duration::from_secs(10))?.send(gateway.envoy.port, 0, 0, &[])?;
    anyhow::ensure!(warm.served(), "the warm-up call was not served: {warm:?}");
    let busy = if case.busy { Some(Busy::start(BUSY)?) } else { None };
    let workers = Workers {
        workers: case.workers,
        calls: case.calls,
        path: PATH.into(),
        account: ACCOUNT.into(),
        timeout: Duration::from_secs(120),
    };
    let run = workers.run(&[gateway.envoy.port])?;
    let load = load_average();
    drop(busy);
    let log = partner.log().of(ACCOUNT);
    let slots = slots(&redis)?;
    // Every call reserved a slot, admitted by the partner or not.
    let arrivals: Vec<f64> = log
        .0
        .iter()
        .map(|a| partner.wall(a.at).duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_micros() as f64))
        .collect();
    // Each arrival with the latest slot at or before it: a request given a
    // new slot leaves its old one unused (in the past, it stays charged).
    let mut late: Vec<f64> = arrivals
        .iter()
        .filter_map(|at| {
            let before = slots.partition_point(|slot| slot <= at);
            before.checked_sub(1).map(|i| at - slots[i])
        })
        .collect();
    let paired = late.len();
    late.sort_by(f64::total_cmp);
    let gaps = log.gaps();
    let metrics = http_get(gateway.shim.port, "/metrics").unwrap_or_default();
    Ok(Measured {
        served: run.count(|c| c.served()),
        partner_429: log.refused(),
        late: (!late.is_empty()).then(|| {
            [late[0], pick(&late, 0.5), pick(&late, 0.99), pick(&late, 0.999), late[late.len() - 1]]
        }),
        paired,
        min_gap: log.min_gap(),
        mean_gap: (!gaps.is_empty()).then(|| gaps.iter().sum::<Duration>() / gaps.len() as u32),
        short_gaps: gaps.iter().filter(|g| **g < case.interval).count(),
        shim_late: histogram_quantiles(&metrics, "sluice_wait_late_seconds"),
        redis_call: histogram_quantiles(&metrics, "sluice_redis_call_seconds"),
        shifted: counter(&metrics, "sluice_wait_shifted_total"),
        load,
        case: case.clone(),
    })
}

/// Every slot of the run's account, ascending: the largest sorted set.
fn slots(redis: &Redis) -> Result<Vec<f64>> {
    let mut conn = redis.connection()?;
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn)?;
    let mut best: Vec<f64> = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn)?;
        if kind != "zset" {
            continue;
        }
        let scored: Vec<(String, f64)> =
            redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).arg("WITHSCORES").query(&mut conn)?;
        if scored.len() > best.len() {
            best = scored.into_iter().map(|(_, score)| score).collect();
        }
    }
    Ok(best)
}

fn pick(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    Some(body)
}

/// `name`'s value in an OpenMetrics page (summed over labels).
fn counter(page: &str, name: &str) -> Option<u64> {
    let values: Vec<u64> = page
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// p50 and p99 of a histogram, in µs, as the upper bounds of the buckets
/// they fall in.
fn histogram_quantiles(page: &str, name: &str) -> Option<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut buckets: Vec<(f64, f64)> = page
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.split(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    let at = |q: f64| buckets.iter().find(|(_, c)| *c >= q * total).map_or(f64::INFINITY, |(le, _)| le * 1e6);
    Some((at(0.5), at(0.99)))
}

fn ms(us: f64) -> String {
    format!("{:.2}", us / 1000.0)
}

/// One line for the log and one table row.
pub(crate) fn row(m: &Measured) -> String {
    let c = &m.case;
    let late = m.late.map_or(" | | | |".into(), |[min, p50, p99, p999, max]| {
        format!(
            "{} | {} | {} | {} | {}",
            ms(min),
            ms(p50 - min),
            ms(p99 - min),
            ms(p999 - min),
            ms(max - min)
        )
    });
    let gap = |g: Option<Duration>| g.map_or(String::new(), |g| format!("{:.2}", g.as_secs_f64() * 1000.0));
    let shim = m.shim_late.map_or("not counted".into(), |(p50, p99)| format!("≤{} / ≤{}", ms(p50), ms(p99)));
    let redis = m.redis_call.map_or(String::new(), |(p50, p99)| format!("≤{} / ≤{}", ms(p50), ms(p99)));
    format!(
        "| {} ms | {} | {} | {:.1} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        c.interval.as_millis(),
        c.margin_ms.map_or("default".into(), |m| format!("{m} ms")),
        if c.busy { format!("busy ({BUSY} spinners)") } else { "as is".into() },
        m.load,
        m.served,
        c.calls,
        m.paired,
        late,
        gap(m.min_gap),
        gap(m.mean_gap),
        m.short_gaps,
        m.partner_429,
        shim,
        redis,
        m.shifted.map_or("not counted".into(), |n| n.to_string()),
    )
}

pub(crate) const HEADER: &str = "| interval | margin | host | load | served | paired | late min ms | jitter p50 ms | p99 ms | p99.9 ms | max ms | min gap ms | mean gap ms | gaps under | partner 429s | shim wake late p50 / p99 ms | shim's Redis call p50 / p99 ms | shifted |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|";

/// The concurrency hand-over: `slots` in flight at a partner that takes
/// `delay` per call, `workers` callers through one gateway queueing for
/// them; how long each freed slot stays empty at the partner (its answer
/// finishing to the next call arriving: the filter's release, the shim's
/// release script handing the slot to the head waiter, its wake-up by
/// pub/sub, and the waiter's forward).
#[derive(Clone, Debug)]
pub(crate) struct Handover {
    pub(crate) slots: u32,
    pub(crate) delay: Duration,
    pub(crate) workers: usize,
    pub(crate) calls: usize,
    pub(crate) busy: bool,
}

pub(crate) fn handover_cases(quick: bool) -> Vec<Handover> {
    let calls = if quick { 300 } else { 1000 };
    [false, true]
        .into_iter()
        .map(|busy| Handover { slots: 10, delay: Duration::from_millis(50), workers: 40, calls, busy })
        .collect()
}

/// One run, as a table row.
pub(crate) fn handover(case: &Handover) -> Result<String> {
    eprintln!(
        "bench: hand-over: {} slots, {:?} per call, {} workers, {} calls, {}",
        case.slots,
        case.delay,
        case.workers,
        case.calls,
        if case.busy { "busy" } else { "idle" }
    );
    let redis = Redis::start()?;
    let partner = Partner::start_with_delay(Limits::default().concurrency(case.slots), case.delay)?;
    let doc = format!(
        r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "policies": [
            {{"name": "partner-api", "match": {{"path_prefix": "/v42/"}}, "key": ["header:x-account"],
              "wait": {{"timeout": "60s"}},
              "limits": [{{"type": "concurrency", "limit": {}, "lease": "30s"}}]}}]}}"#,
        case.slots
    );
    let gateway = Gateway::start(&doc, &redis, partner.port)?;
    let warm = Caller::new(PATH, "warm-up", Duration::from_secs(10))?.send(gateway.envoy.port, 0, 0, &[])?;
    anyhow::ensure!(warm.served(), "the warm-up call was not served: {warm:?}");
    let busy = if case.busy { Some(Busy::start(BUSY)?) } else { None };
    let workers = Workers {
        workers: case.workers,
        calls: case.calls,
        path: PATH.into(),
        account: ACCOUNT.into(),
        timeout: Duration::from_secs(120),
    };
    let run = workers.run(&[gateway.envoy.port])?;
    let load = load_average();
    drop(busy);
    let log = partner.log().of(ACCOUNT);
    let mut empty: Vec<f64> = log.handoffs().iter().map(|d| d.as_secs_f64() * 1e6).collect();
    empty.sort_by(f64::total_cmp);
    let q = |p: f64| if empty.is_empty() { String::new() } else { ms(pick(&empty, p)) };
    let row = format!(
        "| {} | {} ms | {} | {} | {:.1} | {}/{} | {} | {} | {} | {} | {} | {} |",
        case.slots,
        case.delay.as_millis(),
        case.workers,
        if case.busy { format!("busy ({BUSY} spinners)") } else { "as is".into() },
        load,
        run.count(|c| c.served()),
        case.calls,
        log.refused(),
        log.max_in_flight(),
        empty.len(),
        q(0.5),
        q(0.99),
        q(0.999),
    );
    eprintln!("bench:   {row}");
    Ok(row)
}

pub(crate) const HANDOVER_HEADER: &str = "| slots | partner's time per call | workers | host | load | served | partner 429s | most in flight | hand-overs | freed slot empty p50 ms | p99 ms | p99.9 ms |\n|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|";
