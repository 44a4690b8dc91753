//! The end-to-end fault suite: steady traffic through real Envoy running
//! `sluice.wasm`, the real shim and real Redis, while one part fails. For
//! each fault it prints one summary line (`FAULT <name>: ...`: requests sent,
//! admitted, refused, failed, the longest wait, the busiest window or the
//! most in flight against the limit) and asserts:
//!
//! - no request waits longer than `timeout_ms` per shim call it makes, plus
//!   the upstream's own time, plus [`MARGIN`];
//! - nothing is admitted beyond the bound the README documents for that
//!   fault (its failure-modes table), judged from the upstream's own record
//!   of arrivals, and decisions are exact again once the fault is over;
//! - the shim decides again after the fault: every request of the last
//!   stretch, sent once every worker's breaker has closed, is decided by it.
//!
//! Every test starts its own processes on free ports; each takes 10 to 20 s.

use std::time::{Duration, Instant};

use sluice_harness::faults::{admissions, busiest_window, most_at_once, Sent, Tally, Target, Traffic};
use sluice_harness::gateway::{eventually, open_request, prometheus, sample, send};
use sluice_harness::recorder::{Arrival, RecordingUpstream, SLOW};
use sluice_harness::{Envoy, Redis, RedisCluster, Shim};

/// The filter's `shim.timeout_ms`: generous, so that a loaded machine's slow
/// answer is not itself a fault.
const TIMEOUT_MS: u64 = 1000;
/// What a request may wait beyond `timeout_ms` per shim call and the
/// upstream's own time: Envoy, the client and the scheduler on a loaded
/// 2-core machine. Measured waits are printed next to the bound.
const MARGIN: Duration = Duration::from_millis(1500);
/// The sliding window of faults 1, 2, 3 and 5: at most LIMIT per WINDOW.
const LIMIT: usize = 30;
const WINDOW: Duration = Duration::from_secs(2);
/// Traffic before the fault: long enough for a whole window to fill.
const BEFORE: Duration = Duration::from_millis(2500);
/// How long Redis or the shim stays down.
const OUTAGE: Duration = Duration::from_millis(2500);
/// Traffic after the fault, once every breaker has closed: a whole window and more.
const AFTER: Duration = Duration::from_millis(2500);
const CLIENTS: usize = 3;
const PAUSE: Duration = Duration::from_millis(15);
/// Each client's bound on requests, whatever happens.
const PER_CLIENT: usize = 2000;
const WAIT: Duration = Duration::from_secs(20);

/// A document whose policies answer 503 on `failure_mode: deny`, whose
/// breaker opens after 3 failures and probes again after 500 ms, and whose
/// admitted responses carry `RateLimit` (so the client can tell an admission
/// the shim counted from one `failure_mode: allow` let through).
fn document(policies: &[String]) -> String {
    document_with("", policies)
}

/// [`document`] with more top-level fields, e.g. `"over_limit_cache_slots": 0,`.
fn document_with(top: &str, policies: &[String]) -> String {
    format!(
        r#"{{"shim": {{"timeout_ms": {TIMEOUT_MS}, "failure_threshold": 3, "cooldown_ms": 500}},
            "failure_mode": "deny", "failure_status": 503, "headers": "always", {top}
            "policies": [{}]}}"#,
        policies.join(",")
    )
}

/// A sliding window of LIMIT per WINDOW on `path_prefix`, keyed by `x-api-key`.
fn window_policy(name: &str, path_prefix: &str, failure_mode: &str) -> String {
    format!(
        r#"{{"name": "{name}", "match": {{"path_prefix": "{path_prefix}"}}, "key": ["header:x-api-key"],
            "failure_mode": "{failure_mode}",
            "limits": [{{"type": "sliding_window", "limit": {LIMIT}, "window": "{}ms"}}]}}"#,
        WINDOW.as_millis()
    )
}

/// Envoy's stats page, or an empty one.
fn stats(envoy: &Envoy) -> String {
    prometheus(envoy).unwrap_or_default()
}

/// No worker's breaker is open, and if any opened, one has closed again
/// (`opened` counts every reopening after a failed probe, `closed` each
/// final closing).
fn breakers_closed(envoy: &Envoy) -> bool {
    let page = stats(envoy);
    let opened = sample(&page, "sluice_breaker_opened");
    sample(&page, "sluice_breaker_open_workers") == 0.0
        && (opened == 0.0 || sample(&page, "sluice_breaker_closed") >= 1.0)
}

/// Waits until the fault that ended at `over` is over for the traffic too:
/// every breaker closed and the shim deciding every target again. Returns
/// that moment, after which every request must be decided by the shim.
fn settle(fault: &str, envoy: &Envoy, traffic: &Traffic, over: Instant) -> Instant {
    let settled = eventually(WAIT, || breakers_closed(envoy) && traffic.decided_since(over));
    if !settled {
        let since: Vec<Sent> = traffic.so_far().into_iter().filter(|s| s.sent >= over).collect();
        let per_target: Vec<String> = (0..traffic.targets.len())
            .map(|i| Tally::of(since.iter().filter(|s| s.target == i)).line())
            .collect();
        panic!("{fault}: the shim never decided every target again: {per_target:#?}\n{}", envoy.log());
    }
    Instant::now()
}

/// The gateway of faults 1 to 3. Fields drop in order: Envoy first, Redis last.
struct Gateway {
    envoy: Envoy,
    shim: Shim,
    upstream: RecordingUpstream,
    redis: Redis,
}

impl Gateway {
    fn start(doc: &str) -> Gateway {
        let redis = Redis::start().expect("redis");
        let shim = Shim::start(&redis.url()).expect("shim");
        let upstream = RecordingUpstream::start().expect("upstream");
        let envoy = Envoy::start(doc, shim.port, upstream.port).expect("envoy");
        Gateway { envoy, shim, upstream, redis }
    }
}

/// What one window-limited run showed, per target group.
struct Windows {
    /// The busiest window over the whole run, and among windows that start
    /// once the fault was over.
    all: usize,
    after: usize,
}

fn windows(
    sent: &[Sent],
    upstream: &RecordingUpstream,
    which: &[usize],
    over: Instant,
    start: Instant,
) -> Windows {
    let adm = admissions(sent, upstream, which);
    Windows { all: busiest_window(&adm, WINDOW, start), after: busiest_window(&adm, WINDOW, over) }
}

/// The requests sent once the fault was over and every breaker had closed
/// were all decided by the shim: counted admissions or 429s.
fn assert_decided_after(sent: &[Sent], settled: Instant, fault: &str) {
    let tail: Vec<&Sent> = sent.iter().filter(|s| s.sent >= settled).collect();
    assert!(tail.len() >= 10, "{fault}: only {} requests after the fault", tail.len());
    let undecided: Vec<&&Sent> = tail.iter().filter(|s| !s.decided()).collect();
    assert!(undecided.is_empty(), "{fault}: not decided by the shim after the fault: {undecided:#?}");
}

fn assert_waits(tally: &Tally, bound: Duration, fault: &str) {
    assert!(
        tally.longest <= bound,
        "{fault}: a request waited {:?}, over the bound {bound:?}",
        tally.longest
    );
}

fn timeout() -> Duration {
    Duration::from_millis(TIMEOUT_MS)
}

/// For the summary line: "no", or "yes, N > limit", within or BEYOND the documented bound.
fn exceeded(most: usize, limit: usize, bound: usize) -> String {
    if most <= limit {
        "no".into()
    } else if most <= bound {
        format!("yes, {most} > {limit}, within the documented bound {bound}")
    } else {
        format!("yes, {most} > {limit}, BEYOND the documented bound {bound}")
    }
}

/// Fault 1, Redis restarted: killed and started again at once on the same
/// port, empty (persistence off): the script cache and the check library
/// are gone, so the shim's next FCALL finds no function and loads the
/// library again, and the counters
/// start from zero. The shim keeps deciding; a window that spans the
/// restart admits up to 2x its limit (what it admitted before is
/// forgotten), and every window that starts after the restart at most its
/// limit. The over-limit cache is off here: it keeps denying a key that was
/// over its limit until the denial's retry-after, which hides part of the
/// reset; without it the worst case shows.
#[test]
fn redis_restarted_loses_the_counters_and_the_library_but_not_the_decisions() {
    let doc = document_with(r#""over_limit_cache_slots": 0,"#, &[window_policy("api", "/", "deny")]);
    let mut gw = Gateway::start(&doc);
    let start = Instant::now();
    let targets = vec![Target::new("/api", &[("x-api-key", "alice")])];
    let traffic = Traffic::start(gw.envoy.port, targets, CLIENTS, PAUSE, PER_CLIENT);
    std::thread::sleep(BEFORE);
    gw.redis.kill();
    gw.redis.start_again().expect("redis again");
    let over = Instant::now();
    let settled = settle("redis restarted", &gw.envoy, &traffic, over);
    std::thread::sleep(AFTER);
    let sent = traffic.finish();

    let tally = Tally::of(&sent);
    let w = windows(&sent, &gw.upstream, &[0], over, start);
    let bound = timeout() + MARGIN;
    eprintln!(
        "FAULT redis restarted: {} (bound {:.2} s); limit {LIMIT} per {WINDOW:?}: busiest window {} \
         (bound {} = 2x limit across the restart), after the restart {} (bound {LIMIT}); limit exceeded: {}",
        tally.line(),
        bound.as_secs_f64(),
        w.all,
        2 * LIMIT,
        w.after,
        exceeded(w.all, LIMIT, 2 * LIMIT),
    );
    assert_waits(&tally, bound, "redis restarted");
    assert!(w.all <= 2 * LIMIT, "over 2x the limit across the restart: {}", w.all);
    assert!(w.after <= LIMIT, "over the limit after the restart: {}", w.after);
    assert!(w.after > 0, "nothing admitted after the restart\n{}", gw.shim.log());
    assert_decided_after(&sent, settled, "redis restarted");
    assert!(
        libraries(gw.redis.port) == 1,
        "the shim never loaded its check library on the new Redis, yet decided: was it the new one?"
    );
    eprintln!("redis restarted: the shim loaded its check library again on the new Redis, then decided");
}

/// How many function libraries the Redis on `port` holds.
fn libraries(port: u16) -> usize {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
    let mut conn = client.get_connection().expect("connecting");
    let list: Vec<redis::Value> = redis::cmd("FUNCTION").arg("LIST").query(&mut conn).expect("FUNCTION LIST");
    list.len()
}

/// How many times the Redis on `port` answered NOSCRIPT (`INFO errorstats`).
fn noscript_errors(port: u16) -> u64 {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
    let mut conn = client.get_connection().expect("connecting");
    let info: String = redis::cmd("INFO").arg("errorstats").query(&mut conn).expect("INFO");
    info.lines()
        .find_map(|line| line.strip_prefix("errorstat_NOSCRIPT:count="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// One run of faults 2 and 3: two policies on one gateway, `open` with
/// `failure_mode: allow` and `shut` with `failure_mode: deny`, steady
/// traffic to both, and `outage` to take a part down for OUTAGE and bring
/// it back. Returns the requests, the gateway, and when the fault was over
/// and every breaker closed again.
fn outage_run(
    fault: &str,
    outage: impl FnOnce(&mut Gateway),
) -> (Vec<Sent>, Gateway, Instant, Instant, Instant) {
    let policies = [window_policy("open", "/open/", "allow"), window_policy("shut", "/shut/", "deny")];
    // The over-limit cache off: with it, a full window is refused locally
    // and how many checks reach the dead backend (and so whether the
    // breaker opens) depends on timing; without it every request asks.
    let mut gw = Gateway::start(&document_with(r#""over_limit_cache_slots": 0,"#, &policies));
    let start = Instant::now();
    let targets = vec![
        Target::new("/open/x", &[("x-api-key", "alice")]),
        Target::new("/shut/x", &[("x-api-key", "alice")]),
    ];
    let traffic = Traffic::start(gw.envoy.port, targets, CLIENTS, PAUSE, PER_CLIENT);
    std::thread::sleep(BEFORE);
    outage(&mut gw);
    let over = Instant::now();
    let settled = settle(fault, &gw.envoy, &traffic, over);
    std::thread::sleep(AFTER);
    let sent = traffic.finish();
    (sent, gw, start, over, settled)
}

/// What faults 2 and 3 share from Envoy's side, judged and printed as one
/// line: during the outage `open` let requests through uncounted and `shut`
/// answered 503; no request waited past the bound; the breaker opened and
/// closed again; the shim decided every request after the fault. `bound_all`
/// is the documented bound of counted admissions in a window spanning the
/// outage; windows after it hold at most the limit.
fn judge_outage(fault: &str, sent: &[Sent], gw: &Gateway, times: [Instant; 3], bound_all: usize) {
    let [start, over, settled] = times;
    let bound = timeout() + MARGIN;
    let page = stats(&gw.envoy);
    let (opened, closed) = (sample(&page, "sluice_breaker_opened"), sample(&page, "sluice_breaker_closed"));
    let mut parts = Vec::new();
    for (i, name) in [(0, "open (allow)"), (1, "shut (deny)")] {
        let tally = Tally::of(sent.iter().filter(|s| s.target == i));
        let w = windows(sent, &gw.upstream, &[i], over, start);
        parts.push(format!(
            "{name}: {}; busiest window {} counted (bound {bound_all}), after the fault {} (bound {LIMIT}), \
             limit exceeded: {}",
            tally.line(),
            w.all,
            w.after,
            exceeded(w.all, LIMIT, bound_all),
        ));
        assert_waits(&tally, bound, fault);
        assert!(w.all <= bound_all, "{fault} {name}: over the bound {bound_all}: {}", w.all);
        assert!(w.after <= LIMIT, "{fault} {name}: over the limit after the fault: {}", w.after);
    }
    eprintln!(
        "FAULT {fault} for {:.1} s: wait bound {:.2} s, limit {LIMIT} per {WINDOW:?}; breaker opened {opened}, \
         closed {closed}; {}",
        OUTAGE.as_secs_f64(),
        bound.as_secs_f64(),
        parts.join("; ")
    );
    let open = Tally::of(sent.iter().filter(|s| s.target == 0));
    let shut = Tally::of(sent.iter().filter(|s| s.target == 1));
    assert!(open.failure_allowed > 0, "{fault}: failure_mode allow let nothing through: {}", open.line());
    assert_eq!(open.failed, 0, "{fault}: failure_mode allow refused requests: {}", open.line());
    assert_eq!(shut.failure_allowed, 0, "{fault}: failure_mode deny let requests through uncounted");
    let answered_503 = shut.failures.get("503").copied().unwrap_or(0);
    assert!(answered_503 > 0, "{fault}: deny answered no 503: {}", shut.line());
    assert_eq!(shut.failed, answered_503, "{fault}: {}", shut.line());
    assert!(opened >= 1.0 && closed >= 1.0, "{fault}: breaker opened {opened}, closed {closed}");
    assert_decided_after(sent, settled, fault);
}

/// Fault 2, Redis down for OUTAGE (killed), then back on the same port,
/// empty. During the outage each request follows its policy's
/// `failure_mode` (`open` lets it through, `shut` answers 503) and each
/// worker's breaker opens after 3 failures, then closes once Redis answers.
/// Counted admissions: up to 2x the limit in a window spanning the outage
/// (the counters were lost), at most the limit in any window after it; the
/// `failure_mode: allow` admissions come on top, uncounted, only until the
/// shim decides again.
#[test]
fn redis_down_for_seconds_follows_failure_mode_and_the_breaker() {
    let fault = "redis down";
    let (sent, gw, start, over, settled) = outage_run(fault, |gw| {
        gw.redis.kill();
        std::thread::sleep(OUTAGE);
        gw.redis.start_again().expect("redis again");
    });
    judge_outage(fault, &sent, &gw, [start, over, settled], 2 * LIMIT);
}

/// Fault 3, the shim SIGKILLed and started again on the same port after
/// OUTAGE: from Envoy's side the same as fault 2 (failure modes, breaker
/// open then closed), but Redis kept its counters, so counted admissions
/// never exceed the limit in any window, across the outage too. A check the
/// dead shim had run but never answered stays charged: it can only refuse more.
#[test]
fn the_shim_killed_and_restarted_follows_failure_mode_and_keeps_the_counts() {
    let fault = "shim killed";
    let (sent, gw, start, over, settled) = outage_run(fault, |gw| {
        gw.shim.kill();
        std::thread::sleep(OUTAGE);
        gw.shim.start_again().expect("shim again");
    });
    judge_outage(fault, &sent, &gw, [start, over, settled], LIMIT);
}

/// Fault 4, an Envoy SIGKILLed while its requests hold every slot of a
/// concurrency limit (3 in flight, leases of 2 s) on a hanging upstream: it
/// never releases them. Steady traffic through a second Envoy is refused
/// while the dead Envoy's leases stand, and admitted again once they expire:
/// the next checks reclaim all 3 (counted as `reclaimed`), within the lease
/// (plus MARGIN) of the kill. Judged at the upstream: never more than 3 in
/// flight, counting each of the dead Envoy's requests as holding its slot
/// until its lease could first have expired.
#[test]
fn a_killed_envoy_holding_leases_gets_every_slot_back_within_the_lease() {
    const SLOTS: usize = 3;
    let lease = Duration::from_secs(2);
    let pool = format!(
        r#"{{"name": "pool", "limits": [{{"type": "concurrency", "limit": {SLOTS}, "lease": "{}ms"}}]}}"#,
        lease.as_millis()
    );
    let doc = document(&[pool]);
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let upstream = RecordingUpstream::start().expect("upstream");
    let mut doomed = Envoy::start(&doc, shim.port, upstream.port).expect("envoy");
    let survivor = Envoy::start(&doc, shim.port, upstream.port).expect("second envoy");

    let held_from = Instant::now();
    let traces: Vec<String> = (0..SLOTS).map(|i| (1_000_000 + i).to_string()).collect();
    let _hanging: Vec<_> = traces
        .iter()
        .map(|t| open_request(doomed.port, "/hang", &[("x-trace", t)]).expect("request"))
        .collect();
    assert!(eventually(WAIT, || upstream.in_flight("/hang") == SLOTS), "the slots were never all taken");
    let refused = send(survivor.port, "GET", "/slow", &[]).expect("request");
    assert_eq!(refused.status, 429, "every slot is held by the doomed Envoy: {refused:?}");

    let targets = vec![Target::new("/slow", &[])];
    let traffic = Traffic::start(survivor.port, targets, SLOTS + 1, Duration::from_millis(10), PER_CLIENT);
    std::thread::sleep(Duration::from_millis(500));
    doomed.kill();
    let killed = Instant::now();
    let reclaimed = || sample(&stats(&survivor), r#"sluice_reclaimed{policy="pool"}"#);
    assert!(eventually(lease + WAIT, || reclaimed() >= SLOTS as f64), "reclaimed {}", reclaimed());
    std::thread::sleep(Duration::from_millis(1500));
    let sent = traffic.finish();

    // Every slot is back: the survivor can hold all of them at once.
    let before = upstream.in_flight("/hang");
    let mine: Vec<_> =
        (0..SLOTS).map(|_| open_request(survivor.port, "/hang", &[]).expect("request")).collect();
    let all_back = eventually(WAIT, || upstream.in_flight("/hang") == before + SLOTS);
    assert!(all_back, "only {} of {SLOTS} slots usable", upstream.in_flight("/hang") - before);
    drop(mine);

    let tally = Tally::of(&sent);
    let arrivals = upstream.arrivals();
    let admitted_at: Vec<Instant> = sent
        .iter()
        .filter(|s| s.admitted())
        .filter_map(|s| arrivals.iter().find(|a| a.trace == Some(s.trace)).map(|a| a.arrived))
        .collect();
    let first = admitted_at.iter().min().copied().expect("nothing admitted after the kill");
    let back_after = first.saturating_duration_since(killed);
    // The dead Envoy's requests hold their slots at least until held_from +
    // lease; the survivor's from arrival to answer at the upstream, which
    // lies inside their leases.
    let doomed_trace = |a: &Arrival| a.trace.is_some_and(|t| traces.contains(&t.to_string()));
    let intervals: Vec<(Instant, Instant)> = arrivals
        .iter()
        .map(|a| {
            (a.arrived, if doomed_trace(a) { held_from + lease } else { a.left.unwrap_or_else(Instant::now) })
        })
        .collect();
    let most = most_at_once(&intervals);
    let page = stats(&survivor);
    let reclaimed = sample(&page, r#"sluice_reclaimed{policy="pool"}"#);
    let release_failed = sample(&page, r#"sluice_release_failed{policy="pool"}"#);
    // A check and, for an admitted request, its release; plus the upstream's own time.
    let bound = 2 * timeout() + SLOW + MARGIN;
    eprintln!(
        "FAULT envoy killed holding {SLOTS} leases: {} (bound {:.2} s); first admission {:.2} s after the kill \
         (lease {:.1} s, bound {:.1} s); reclaimed {reclaimed}, release_failed {release_failed}; \
         most in flight at the upstream {most} (limit {SLOTS}); limit exceeded: {}",
        tally.line(),
        bound.as_secs_f64(),
        back_after.as_secs_f64(),
        lease.as_secs_f64(),
        (lease + MARGIN).as_secs_f64(),
        exceeded(most, SLOTS, SLOTS),
    );
    assert_waits(&tally, bound, "envoy killed");
    assert!(tally.refused > 0, "the survivor was never refused while the leases stood");
    assert!(back_after <= lease + MARGIN, "the slots came back {back_after:?} after the kill");
    assert!(most <= SLOTS, "{most} in flight at once, limit {SLOTS}");
    assert!(
        reclaimed >= SLOTS as f64 && reclaimed <= SLOTS as f64 + release_failed,
        "reclaimed {reclaimed} (release_failed {release_failed})"
    );
}

/// Fault 5, a Redis Cluster master SIGKILLed (3 masters with a replica each,
/// `cluster-node-timeout` 1 s): its replica is promoted within seconds, and
/// the shim (`--redis-cluster`) finds the new master and decides again. The
/// keys on the dead master follow `failure_mode: deny` meanwhile, and so, for
/// a cooldown, do the other keys on a worker whose breaker opened: the
/// breaker is per worker, not per Redis node (a few of their checks also
/// waited out `timeout_ms` in the shim while the master was dying). Replication
/// is asynchronous, so the promoted replica may miss the last writes: a
/// window spanning the failover admits up to 2x its limit, a window after it
/// at most its limit.
#[test]
fn a_cluster_master_killed_fails_over_and_the_shim_follows() {
    let fault = "cluster failover";
    let mut cluster = RedisCluster::start_with_replicas(1000).expect("cluster");
    let shim = Shim::start_cluster(&cluster.urls()).expect("shim");
    let upstream = RecordingUpstream::start().expect("upstream");
    let envoy = Envoy::start(&document(&[window_policy("ha", "/", "deny")]), shim.port, upstream.port)
        .expect("envoy");
    let keys = ["alice", "bob", "carol", "dave"];
    let targets = keys.iter().map(|k| Target::new("/api", &[("x-api-key", k)])).collect();
    let tag = |key: &str| format!("{{ha:{key}}}");
    let dead = cluster.master_of(&tag("alice")).expect("master");
    let start = Instant::now();
    let traffic = Traffic::start(envoy.port, targets, CLIENTS, PAUSE, PER_CLIENT);
    std::thread::sleep(BEFORE);
    cluster.kill(dead).expect("kill");
    let killed = Instant::now();
    let new_master = cluster.wait_failover(&tag("alice"), dead, Duration::from_secs(30)).expect("failover");
    let over = Instant::now();
    eprintln!("{fault}: master {dead} killed, replica {new_master} promoted after {:?}", over - killed);
    let settled = settle(fault, &envoy, &traffic, over);
    std::thread::sleep(AFTER);
    let sent = traffic.finish();
    eprintln!("{fault}: the promoted replica answered NOSCRIPT {} times", noscript_errors(new_master));

    let bound = timeout() + MARGIN;
    let tally = Tally::of(&sent);
    assert_waits(&tally, bound, fault);
    let (mut lines, mut most) = (Vec::new(), 0);
    for (i, key) in keys.iter().enumerate() {
        let w = windows(&sent, &upstream, &[i], over, start);
        let on_dead = cluster.master_of(&tag(key)).ok() == Some(new_master);
        assert!(w.all <= 2 * LIMIT, "{fault} {key}: over 2x the limit: {}", w.all);
        assert!(w.after <= LIMIT, "{fault} {key}: over the limit after the failover: {}", w.after);
        most = most.max(w.all);
        let failed = Tally::of(sent.iter().filter(|s| s.target == i)).failed;
        lines.push(format!(
            "{key}{}: busiest {}/{}, failed {failed}",
            if on_dead { " (failed over)" } else { "" },
            w.all,
            w.after
        ));
    }
    eprintln!(
        "FAULT {fault} (replica promoted after {:.1} s): {} (bound {:.2} s); limit {LIMIT} per {WINDOW:?} \
         per key, busiest window over the whole run/after the failover (bounds {}/{LIMIT}): {}; limit exceeded: {}",
        (over - killed).as_secs_f64(),
        tally.line(),
        bound.as_secs_f64(),
        2 * LIMIT,
        lines.join(", "),
        exceeded(most, LIMIT, 2 * LIMIT),
    );
    assert_decided_after(&sent, settled, fault);
}
