//! Exactness through the whole stack: a fleet of 2 Envoys × 2 workers each
//! running the real `sluice.wasm`, one shim, one Redis, and 64 concurrent
//! clients spread over both Envoys, against every kind that promises
//! exactness (docs/policy-reference.md): the fixed window, the sliding log,
//! the token and leaky buckets (GCRA), the interval, points at a fixed cost
//! and with refunds,
//! concurrency, a concurrency pool with a reserve for the critical class, and
//! wait mode (an interval and a concurrency queue that hold requests).
//! It runs twice: each check alone, and with shared callouts
//! (`shim.shared_calls: 1`), whose run must also have shared calls.
//!
//! Every judgement is made from the far side: a recording upstream
//! (`sluice_harness::recorder`) notes each request's arrival and end on its
//! own clock, so what a limit admitted is what reached the upstream.
//!
//! - **0 over-admissions, always:** each count kind admitted at most its
//!   limit (windows and refills are far longer than the test, so the whole
//!   run is one window); concurrency never had more than its limit in flight
//!   at the upstream, the pool's lower class never more than the unreserved
//!   share.
//! - **Utilization ≥ 99%** for the count kinds (they admit exactly their
//!   limit, points at a fixed cost included); the concurrency pools reach
//!   their limit. Points with refunds promise no utilization under
//!   contention (refunds are conservative): theirs is printed.
//! - **Wait mode:** every request is answered: served (200) or refused with
//!   a reason (429 with `retry-after`), none failed, none held past its wait
//!   plus the shim call's budget; the shim never lets two sends go closer
//!   than the interval plus its margin, on Redis's clock (`egress::sends`:
//!   the gap at the upstream adds the hop from the shim, which varies with
//!   the host's load, so it is printed, not judged), and the queue holds
//!   arrival order: a request sent [`FIFO_MARGIN`] or more before another
//!   reaches the upstream first.
//!
//! Counts per kind are printed (`--nocapture`). `SLUICE_TORTURE_SCALE=N`
//! (default 1, the CI size: about a minute on a busy 2-core machine)
//! multiplies every limit, request count and wait-mode duration.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_harness::recorder::{Arrival, RecordingUpstream};
use sluice_harness::{Envoy, Redis, Shim};

const CLIENTS: usize = 64;
/// The shim call's budget (`shim.timeout_ms`): a held request is answered
/// within its wait plus this, or the filter applies the failure mode (deny,
/// a 503, counted as failed).
const SHIM_TIMEOUT_MS: u64 = 2_000;
/// How long the waiting policies hold a request at most.
const WAIT_MS: u64 = 2_000;
/// The waiting interval: at most one request per `every` at the upstream.
const EVERY_MS: u64 = 100;
/// Added to each of its slots to cover the hop from the shim to the
/// upstream on a busy machine (docs/egress-waiting.md: the margin); the
/// shim's sends are at least `EVERY_MS` plus this apart.
const MARGIN_MS: u64 = 20;
/// Two requests sent this far apart reach the shim in the order sent,
/// whatever the scheduling of the clients and the Envoy workers: the
/// documented tolerance of the FIFO claim as a client sees it.
const FIFO_MARGIN: Duration = Duration::from_millis(500);
/// A client gives up on a request after this long (far beyond any wait).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

fn scale() -> usize {
    std::env::var("SLUICE_TORTURE_SCALE").ok().and_then(|s| s.parse().ok()).filter(|n| *n >= 1).unwrap_or(1)
}

/// The sizes of one run.
#[derive(Clone, Copy)]
struct Size {
    /// The limit of each count kind.
    limit: usize,
    /// The points' capacity; each request is estimated at [`POINTS_COST`]
    /// and really costs [`POINTS_ACTUAL`] (a refund of the difference).
    points: usize,
    conc: usize,
    pool: usize,
    cwait: usize,
    wait_phase: Duration,
}

const POINTS_COST: usize = 10;
const POINTS_ACTUAL: usize = 4;

impl Size {
    fn of(scale: usize) -> Size {
        Size {
            limit: 200 * scale,
            points: 1_000 * scale,
            conc: 16,
            pool: 20,
            cwait: 8,
            wait_phase: Duration::from_secs(8 * scale as u64),
        }
    }
}

/// The count kinds: (policy, path, limit JSON, admissions the limit allows).
fn count_kinds(size: Size) -> Vec<(&'static str, String, usize)> {
    let l = size.limit;
    vec![
        ("fixed", format!(r#"{{"type": "fixed_window", "limit": {l}, "window": "365d"}}"#), l),
        ("sliding", format!(r#"{{"type": "sliding_window", "limit": {l}, "window": "1h"}}"#), l),
        ("token", format!(r#"{{"type": "token_bucket", "rate": 1, "per": "1d", "burst": {l}}}"#), l),
        ("leaky", format!(r#"{{"type": "leaky_bucket", "capacity": {l}, "drain": "365d"}}"#), l),
        ("interval", r#"{"type": "interval", "every": "365d"}"#.to_string(), 1),
        (
            "cost",
            format!(
                r#"{{"type": "points", "capacity": {}, "refill": "365d", "cost": {POINTS_COST}}}"#,
                l * POINTS_COST
            ),
            l,
        ),
    ]
}

/// The fleet's document; `shared_calls` is `shim.shared_calls` (0: every
/// check alone).
fn document(size: Size, shared_calls: u32) -> String {
    let policy = |name: &str, extra: &str, limit: &str| {
        format!(
            r#"{{"name": "{name}", "match": {{"path_prefix": "/{name}/"}}, {extra} "limits": [{limit}]}}"#
        )
    };
    let mut policies: Vec<String> = count_kinds(size).iter().map(|(n, l, _)| policy(n, "", l)).collect();
    policies.push(policy(
        "points",
        "",
        &format!(
            r#"{{"type": "points", "capacity": {}, "refill": "365d", "cost": {POINTS_COST},
                "actual_cost_header": "x-actual-cost"}}"#,
            size.points
        ),
    ));
    policies.push(policy(
        "conc",
        "",
        &format!(r#"{{"type": "concurrency", "limit": {}, "lease": "30s"}}"#, size.conc),
    ));
    policies.push(policy(
        "pool",
        "",
        &format!(
            r#"{{"type": "concurrency", "limit": {}, "lease": "30s", "reserve": {{"for": "critical", "share": 0.25}}}}"#,
            size.pool
        ),
    ));
    let wait = |margin: &str| format!(r#""wait": {{"timeout": "{WAIT_MS}ms"{margin}}},"#);
    // The sliding window never binds: its log records each send the shim
    // lets go, on Redis's clock (`sluice_harness::egress::sends`).
    policies.push(policy(
        "iwait",
        &wait(&format!(r#", "margin": "{MARGIN_MS}ms""#)),
        &format!(
            r#"{{"type": "interval", "every": "{EVERY_MS}ms"}},
               {{"type": "sliding_window", "limit": 1000000, "window": "1h"}}"#
        ),
    ));
    policies.push(policy(
        "cwait",
        &wait(""),
        &format!(r#"{{"type": "concurrency", "limit": {}, "lease": "30s"}}"#, size.cwait),
    ));
    format!(
        r#"{{"shim": {{"timeout_ms": {SHIM_TIMEOUT_MS}, "shared_calls": {shared_calls}}}, "failure_mode": "deny", "verdict_header": true,
            "classes": [{{"name": "critical", "match": {{"path_prefix": "/pool/critical/"}}}}, {{"name": "batch"}}],
            "policies": [{}]}}"#,
        policies.join(",\n")
    )
}

/// The fleet: Envoys drop first, Redis last.
struct Fleet {
    envoys: Vec<Envoy>,
    shim: Shim,
    upstream: RecordingUpstream,
    redis: Redis,
}

impl Fleet {
    fn start(doc: &str) -> Fleet {
        if let Err(err) = sluice_policies::parse(doc) {
            panic!("the torture document is refused: {err}\n{doc}");
        }
        let redis = Redis::start().expect("redis");
        let shim = Shim::start(&redis.url()).expect("shim");
        let upstream = RecordingUpstream::start().expect("recording upstream");
        let envoys = (0..2).map(|_| Envoy::start(doc, shim.port, upstream.port).expect("envoy")).collect();
        Fleet { envoys, shim, upstream, redis }
    }

    fn ports(&self) -> Vec<u16> {
        self.envoys.iter().map(|e| e.port).collect()
    }

    fn logs(&self) -> String {
        let tail = |log: String| {
            log.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
        };
        let mut all = format!("--- shim ---\n{}\n", tail(self.shim.log()));
        for (i, envoy) in self.envoys.iter().enumerate() {
            all.push_str(&format!("--- envoy {i} ---\n{}\n", tail(envoy.log())));
        }
        all
    }

    /// What reached the upstream on paths under `/name/`.
    fn arrivals(&self, name: &str) -> Vec<Arrival> {
        let prefix = format!("/{name}/");
        self.upstream.arrivals().into_iter().filter(|a| a.path.starts_with(&prefix)).collect()
    }
}

/// One request as the client saw it.
#[derive(Clone, Debug)]
struct Reply {
    trace: u64,
    /// `None`: no answer (an error or the client's timeout).
    status: Option<u16>,
    retry_after: Option<String>,
    verdict: Option<String>,
    sent: Instant,
    done: Instant,
}

async fn send(client: &reqwest::Client, port: u16, path: &str, trace: u64) -> Reply {
    let sent = Instant::now();
    let answer = client
        .get(format!("http://127.0.0.1:{port}{path}"))
        .header("x-trace", trace.to_string())
        .send()
        .await;
    let (status, retry_after, verdict) = match answer {
        Ok(resp) => {
            let header =
                |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
            let out = (Some(resp.status().as_u16()), header("retry-after"), header("x-sluice-verdict"));
            let _ = resp.bytes().await;
            out
        }
        Err(_) => (None, None, None),
    };
    Reply { trace, status, retry_after, verdict, sent, done: Instant::now() }
}

/// `total` requests from [`CLIENTS`] clients, client `c` through Envoy `c % 2`;
/// request `seq` goes to `path(seq)`. All the replies.
async fn hammer(
    ports: &[u16],
    total: usize,
    path: impl Fn(usize) -> String + Send + Sync + 'static,
) -> Vec<Reply> {
    let client = reqwest::Client::builder().timeout(CLIENT_TIMEOUT).build().expect("client");
    let next = Arc::new(AtomicUsize::new(0));
    let path = Arc::new(path);
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (client, next, path, port) =
                (client.clone(), next.clone(), path.clone(), ports[c % ports.len()]);
            tokio::spawn(async move {
                let mut replies = Vec::new();
                loop {
                    let seq = next.fetch_add(1, Ordering::Relaxed);
                    if seq >= total {
                        return replies;
                    }
                    replies.push(send(&client, port, &path(seq), seq as u64).await);
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("client task"));
    }
    all
}

/// [`CLIENTS`] clients sending for `phase`, client `c` to `path(c)`; a
/// refused client pauses `pause` before its next request.
async fn keep_sending(
    ports: &[u16],
    phase: Duration,
    path: impl Fn(usize) -> &'static str + Send + Sync + 'static,
    pause: Duration,
) -> Vec<Reply> {
    let client = reqwest::Client::builder().timeout(CLIENT_TIMEOUT).build().expect("client");
    let next = Arc::new(AtomicUsize::new(0));
    let end = Instant::now() + phase;
    let path = Arc::new(path);
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (client, next, path, port) =
                (client.clone(), next.clone(), path.clone(), ports[c % ports.len()]);
            tokio::spawn(async move {
                let mut replies = Vec::new();
                while Instant::now() < end {
                    let seq = next.fetch_add(1, Ordering::Relaxed);
                    let reply = send(&client, port, path(c), seq as u64).await;
                    if reply.status != Some(200) {
                        tokio::time::sleep(pause).await;
                    }
                    replies.push(reply);
                }
                replies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("client task"));
    }
    all
}

fn count(replies: &[Reply], status: u16) -> usize {
    replies.iter().filter(|r| r.status == Some(status)).count()
}

/// A refusal with a reason: the policy's denial (429) or the pool's
/// shedding of a lower class (503), each with `retry-after` and the
/// filter's verdict, never a failure mode's.
fn refused(r: &Reply) -> bool {
    let verdict = matches!(r.verdict.as_deref(), Some("denied" | "cache_denied" | "shed"));
    matches!(r.status, Some(429 | 503)) && r.retry_after.is_some() && verdict
}

/// Every reply is a 200 or a refusal with a reason: nothing failed.
fn assert_answered(what: &str, replies: &[Reply], fleet: &Fleet) {
    let bad: Vec<&Reply> =
        replies.iter().filter(|r| !(r.status == Some(200) || refused(r))).take(5).collect();
    assert!(
        bad.is_empty(),
        "{what}: answers neither 200 nor a refusal with a reason: {bad:?}\n{}",
        fleet.logs()
    );
}

/// The most requests in flight at once by the upstream's record, among `arrivals`.
fn peak_in_flight(arrivals: &[&Arrival]) -> usize {
    let mut events: Vec<(Instant, i64)> = Vec::new();
    for a in arrivals {
        events.push((a.arrived, 1));
        // Still in flight at the end of the run: it never left.
        events.push((a.left.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)), -1));
    }
    // An end and an arrival at the same instant: the end first.
    events.sort();
    let (mut now, mut peak) = (0i64, 0i64);
    for (_, delta) in events {
        now += delta;
        peak = peak.max(now);
    }
    peak as usize
}

/// Served requests that reached the upstream out of the order they were
/// sent in, although sent at least [`FIFO_MARGIN`] apart.
fn fifo_inversions(replies: &[Reply], arrivals: &[Arrival]) -> usize {
    let arrived: std::collections::HashMap<u64, Instant> =
        arrivals.iter().filter_map(|a| Some((a.trace?, a.arrived))).collect();
    let mut served: Vec<(Instant, Instant)> = replies
        .iter()
        .filter(|r| r.status == Some(200))
        .filter_map(|r| Some((r.sent, *arrived.get(&r.trace)?)))
        .collect();
    served.sort();
    // For each request, the latest arrival among those sent FIFO_MARGIN or more before it.
    let (mut inversions, mut earlier, mut latest) = (0, 0, None::<Instant>);
    for j in 0..served.len() {
        while earlier < j && served[earlier].0 + FIFO_MARGIN <= served[j].0 {
            latest = latest.max(Some(served[earlier].1));
            earlier += 1;
        }
        if latest.is_some_and(|l| l > served[j].1) {
            inversions += 1;
        }
    }
    inversions
}

#[test]
fn a_fleet_of_envoys_keeps_every_exact_limit() {
    keeps_every_exact_limit(0);
}

/// The same run and claims with shared callouts: each worker keeps one
/// check call out, and the checks that come meanwhile go together in the
/// next. Nothing the run asserts may change.
#[test]
fn a_fleet_of_envoys_sharing_callouts_keeps_every_exact_limit() {
    keeps_every_exact_limit(1);
}

fn keeps_every_exact_limit(shared_calls: u32) {
    let size = Size::of(scale());
    let fleet = Fleet::start(&document(size, shared_calls));
    let ports = fleet.ports();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime");
    println!(
        "FLEET 2 envoys x 2 workers, 1 shim, 1 redis, {CLIENTS} clients; scale {}; shared_calls {shared_calls}",
        scale()
    );

    // The count kinds and points, all at once: three times what each allows.
    let kinds = count_kinds(size);
    let mut names: Vec<&'static str> = kinds.iter().map(|(n, _, _)| *n).collect();
    names.push("points");
    let per_kind = 3 * size.limit.max(size.points / POINTS_ACTUAL);
    let paths: Vec<String> = names
        .iter()
        .map(|n| if *n == "points" { format!("/{n}/x?actual={POINTS_ACTUAL}") } else { format!("/{n}/x") })
        .collect();
    let started = Instant::now();
    let replies =
        runtime.block_on(hammer(&ports, per_kind * names.len(), move |seq| paths[seq % paths.len()].clone()));
    println!("  counted kinds: {} requests in {:.1} s", replies.len(), started.elapsed().as_secs_f64());
    assert_answered("counted kinds", &replies, &fleet);
    for (name, _, allows) in &kinds {
        let mine: Vec<&Reply> = replies
            .iter()
            .filter(|r| r.trace as usize % names.len() == names.iter().position(|n| n == name).unwrap_or(0))
            .collect();
        let ok = mine.iter().filter(|r| r.status == Some(200)).count();
        let reached = fleet.arrivals(name).len();
        let cached = mine.iter().filter(|r| r.verdict.as_deref() == Some("cache_denied")).count();
        println!(
            "  {name:<9} sent {:>5}  reached the upstream {reached:>5}  allows {allows:>5}  over {:>3}  \
             utilization {:>6.2}%  (denied from the cache {cached})",
            mine.len(),
            reached.saturating_sub(*allows),
            100.0 * reached as f64 / *allows as f64,
        );
        assert_eq!(ok, reached, "{name}: every 200 reached the upstream once");
        assert!(reached <= *allows, "{name}: {reached} reached the upstream, over the limit of {allows}");
        assert!(
            reached as f64 >= 0.99 * *allows as f64,
            "{name}: {reached} of {allows} admitted, under 99% utilization"
        );
    }
    // Points: what reached the upstream cost POINTS_ACTUAL each; the refunds
    // of the estimate's excess may lag the last responses, so drain what is
    // left one request at a time once they are in.
    std::thread::sleep(Duration::from_millis(1_000));
    let drained = runtime.block_on(async {
        let client = reqwest::Client::builder().timeout(CLIENT_TIMEOUT).build().expect("client");
        let mut drained = Vec::new();
        loop {
            let reply =
                send(&client, ports[drained.len() % 2], &format!("/points/x?actual={POINTS_ACTUAL}"), 0)
                    .await;
            let served = reply.status == Some(200);
            drained.push(reply);
            if !served || drained.len() > size.points {
                return drained;
            }
        }
    });
    assert_answered("points drain", &drained, &fleet);
    let spent = fleet.arrivals("points").len() * POINTS_ACTUAL;
    println!(
        "  points    reached the upstream {} ({} in the drain), true cost {spent} of {} points: over {}  \
         utilization {:.2}%",
        spent / POINTS_ACTUAL,
        count(&drained, 200),
        size.points,
        spent.saturating_sub(size.points),
        100.0 * spent as f64 / size.points as f64
    );
    // Refunds are conservative (docs/architecture.md, points): a refund
    // gives back at most what the request's charge still holds, less every
    // refund landed since its check, its own or a later request's; under
    // contention early requests get back less than their excess. So the
    // claim here is the upper bound only; the utilization is printed.
    assert!(spent <= size.points, "points: {spent} spent of {}", size.points);

    // Concurrency and the pool with a reserve: each admitted request holds
    // its slot 100 ms at the upstream.
    let (conc, pool) = (size.conc, size.pool);
    let started = Instant::now();
    let phase = size.wait_phase / 2;
    let replies = runtime.block_on(keep_sending(
        &ports,
        phase,
        |c| match c % 4 {
            0 | 1 => "/conc/x?slow",
            2 => "/pool/critical/x?slow",
            _ => "/pool/batch/x?slow",
        },
        Duration::from_millis(10),
    ));
    println!("  concurrency: {} requests in {:.1} s", replies.len(), started.elapsed().as_secs_f64());
    assert_answered("concurrency", &replies, &fleet);
    let conc_arrivals = fleet.arrivals("conc");
    let conc_peak = peak_in_flight(&conc_arrivals.iter().collect::<Vec<_>>());
    let pool_arrivals = fleet.arrivals("pool");
    let pool_peak = peak_in_flight(&pool_arrivals.iter().collect::<Vec<_>>());
    let batch: Vec<&Arrival> = pool_arrivals.iter().filter(|a| a.path.starts_with("/pool/batch/")).collect();
    let batch_peak = peak_in_flight(&batch);
    let batch_allows = pool - (pool as f64 * 0.25).round() as usize;
    println!(
        "  conc      served {:>5}  peak in flight {conc_peak} of {conc}\n  \
         pool      served {:>5}  peak in flight {pool_peak} of {pool}; batch {} served, peak {batch_peak} of {batch_allows}",
        conc_arrivals.len(),
        pool_arrivals.len(),
        batch.len()
    );
    assert!(conc_peak <= conc, "concurrency: {conc_peak} in flight at the upstream, over {conc}");
    assert!(pool_peak <= pool, "pool: {pool_peak} in flight at the upstream, over {pool}");
    assert!(batch_peak <= batch_allows, "pool: batch had {batch_peak} in flight, over its {batch_allows}");
    assert_eq!(conc_peak, conc, "concurrency: the pool was never full");
    assert_eq!(pool_peak, pool, "pool: never full");
    // (The batch class need not reach its share: critical requests compete for the same slots.)

    // Wait mode: an interval and a concurrency queue that hold requests.
    for (name, path) in [("iwait", "/iwait/x"), ("cwait", "/cwait/x?slow")] {
        let started = Instant::now();
        let replies = runtime.block_on(keep_sending(
            &ports,
            size.wait_phase,
            move |_| path,
            Duration::from_millis(100),
        ));
        let elapsed = started.elapsed();
        assert_answered(name, &replies, &fleet);
        let budget = Duration::from_millis(WAIT_MS + SHIM_TIMEOUT_MS);
        let late: Vec<&Reply> = replies.iter().filter(|r| r.done - r.sent > budget).collect();
        let longest = replies.iter().map(|r| r.done - r.sent).max().unwrap_or_default();
        let arrivals = fleet.arrivals(name);
        let served = count(&replies, 200);
        let inversions = fifo_inversions(&replies, &arrivals);
        let mut times: Vec<Instant> = arrivals.iter().map(|a| a.arrived).collect();
        times.sort();
        let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
        let min_gap = gaps.iter().min().copied().unwrap_or_default();
        let peak = peak_in_flight(&arrivals.iter().collect::<Vec<_>>());
        println!(
            "  {name:<9} {} requests in {:.1} s: served {served}, refused with retry-after {}, failed {}, \
             longest answer {} ms (budget {} ms); FIFO inversions {inversions}; smallest gap {:.1} ms; peak in flight {peak}",
            replies.len(),
            elapsed.as_secs_f64(),
            replies.iter().filter(|r| refused(r)).count(),
            replies.len() - served - replies.iter().filter(|r| refused(r)).count(),
            longest.as_millis(),
            budget.as_millis(),
            min_gap.as_secs_f64() * 1000.0,
        );
        assert_eq!(served, arrivals.len(), "{name}: every 200 reached the upstream once");
        assert!(
            late.is_empty(),
            "{name}: {} answers later than the wait plus the shim's budget: {:?}",
            late.len(),
            late.first()
        );
        assert_eq!(inversions, 0, "{name}: served out of arrival order");
        if name == "iwait" {
            let span =
                times.last().copied().zip(times.first().copied()).map(|(l, f)| l - f).unwrap_or_default();
            let slots = span.as_secs_f64() / Duration::from_millis(EVERY_MS + MARGIN_MS).as_secs_f64();
            println!("  iwait     {served} served over {:.2} s: {:.1}% of the slots the interval plus margin allow", span.as_secs_f64(), 100.0 * (served as f64 - 1.0) / slots);
            let sends = sluice_harness::egress::sends(&fleet.redis, name).expect("the shim's sends");
            let send_gaps: Vec<u64> = sends.windows(2).map(|w| w[1] - w[0]).collect();
            let smallest = send_gaps.iter().min().copied().unwrap_or_default();
            println!(
                "  iwait     {} sends at the shim, smallest gap {:.3} ms",
                sends.len(),
                smallest as f64 / 1000.0
            );
            assert_eq!(sends.len(), served, "iwait: the shim's sends are not the requests served");
            let close: Vec<&u64> =
                send_gaps.iter().filter(|&&gap| gap < (EVERY_MS + MARGIN_MS) * 1000).collect();
            assert!(
                close.is_empty(),
                "iwait: sends closer than the interval plus margin at the shim (µs): {close:?}"
            );
        } else {
            assert!(peak <= size.cwait, "cwait: {peak} in flight at the upstream, over {}", size.cwait);
        }
        assert!(served > 0, "{name}: nothing served");
    }
    let (batches, checks) = batched(&fleet.shim.metrics().expect("the shim's metrics"));
    println!("  shared callouts: {checks} checks in {batches} batches");
    if shared_calls == 0 {
        assert_eq!(batches, 0, "checks went in batches with shared callouts off");
    } else {
        assert!(checks > batches, "no batch carried more than one check: nothing was shared");
    }
}

/// The shim's `sluice_batch_checks`: (batches, the checks they carried).
fn batched(metrics: &str) -> (u64, u64) {
    let sample = |name: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    };
    (sample("sluice_batch_checks_count"), sample("sluice_batch_checks_sum"))
}
