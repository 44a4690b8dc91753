//! Redis behind Sentinel (a master, a replica, three sentinels, quorum 2,
//! `down-after-milliseconds` 1000), steady traffic through real Envoy and
//! the real shim (`--redis-sentinel ... --sentinel-master sluice`), and the
//! master SIGKILLed. The sentinels promote the replica; the shim's next call
//! after its connection broke asks them for the master again and decides.
//!
//! It prints one `FAULT sentinel failover` line: when the sentinels named
//! the new master, when the shim decided again (the first counted admission
//! sent after the kill, for each key), the requests decided meanwhile by
//! `failure_mode` (here `deny`, 503), and the busiest window. It asserts:
//!
//! - the shim follows: once the failover is over and every breaker closed,
//!   every request is decided by the shim, within a generous bound (30 s);
//! - no request waits longer than `timeout_ms` per shim call plus a margin;
//! - replication is asynchronous, so the promoted replica may miss the last
//!   writes before the kill: a window spanning the failover admits up to 2x
//!   its limit (what the master took and never passed on is forgotten),
//!   and every window that starts after it at most its limit.

use std::time::{Duration, Instant};

use sluice_harness::faults::{admissions, busiest_window, Sent, Tally, Target, Traffic};
use sluice_harness::gateway::{eventually, prometheus, sample};
use sluice_harness::recorder::RecordingUpstream;
use sluice_harness::sentinel::{RedisSentinel, MASTER_NAME};
use sluice_harness::{Envoy, Shim};

const TIMEOUT_MS: u64 = 1000;
const MARGIN: Duration = Duration::from_millis(1500);
const LIMIT: usize = 30;
const WINDOW: Duration = Duration::from_secs(2);
const BEFORE: Duration = Duration::from_millis(2500);
const AFTER: Duration = Duration::from_millis(2500);
const CLIENTS: usize = 3;
const PAUSE: Duration = Duration::from_millis(15);
const PER_CLIENT: usize = 4000;
/// The generous bound on following the new master, from the kill.
const FOLLOW_WITHIN: Duration = Duration::from_secs(30);

fn document() -> String {
    format!(
        r#"{{"shim": {{"timeout_ms": {TIMEOUT_MS}, "failure_threshold": 3, "cooldown_ms": 500}},
            "failure_mode": "deny", "failure_status": 503, "headers": "always",
            "policies": [{{"name": "ha", "match": {{"path_prefix": "/"}}, "key": ["header:x-api-key"],
              "limits": [{{"type": "sliding_window", "limit": {LIMIT}, "window": "{}ms"}}]}}]}}"#,
        WINDOW.as_millis()
    )
}

fn breakers_closed(envoy: &Envoy) -> bool {
    let page = prometheus(envoy).unwrap_or_default();
    let opened = sample(&page, "sluice_breaker_opened");
    sample(&page, "sluice_breaker_open_workers") == 0.0
        && (opened == 0.0 || sample(&page, "sluice_breaker_closed") >= 1.0)
}

#[test]
fn a_sentinel_failover_is_followed_by_the_shim() {
    let fault = "sentinel failover";
    let mut redis = RedisSentinel::start(1000).expect("sentinel");
    let sentinels = redis.sentinels();
    let shim =
        Shim::start_args(&["--redis-sentinel", &sentinels, "--sentinel-master", MASTER_NAME]).expect("shim");
    let upstream = RecordingUpstream::start().expect("upstream");
    let envoy = Envoy::start(&document(), shim.port, upstream.port).expect("envoy");
    let keys = ["alice", "bob", "carol", "dave"];
    let targets = keys.iter().map(|k| Target::new("/api", &[("x-api-key", k)])).collect();
    let start = Instant::now();
    let traffic = Traffic::start(envoy.port, targets, CLIENTS, PAUSE, PER_CLIENT);
    std::thread::sleep(BEFORE);
    let old = redis.master_port;
    redis.kill_master();
    let killed = Instant::now();
    let promoted = redis.wait_failover(FOLLOW_WITHIN).unwrap_or_else(|e| panic!("{e}\n{}", redis.logs()));
    let over = Instant::now();
    let settled = eventually(FOLLOW_WITHIN, || breakers_closed(&envoy) && traffic.decided_since(over));
    assert!(settled, "{fault}: the shim never decided every key again\n{}\n{}", shim.log(), redis.logs());
    let settled = Instant::now();
    std::thread::sleep(AFTER);
    let sent = traffic.finish();

    // The shim followed when, for every key, a request sent after the kill
    // was admitted and counted by it.
    let followed = (0..keys.len())
        .map(|i| {
            sent.iter()
                .filter(|s| s.target == i && s.sent >= killed && s.admitted() && s.counted)
                .map(|s| s.sent + s.took)
                .min()
                .expect("a counted admission after the kill")
        })
        .max()
        .expect("keys");
    let follow = followed - killed;
    assert!(follow <= FOLLOW_WITHIN, "{fault}: followed after {follow:?}");
    let meanwhile = Tally::of(sent.iter().filter(|s| s.sent >= killed && s.sent < followed));
    let tally = Tally::of(&sent);
    let bound = Duration::from_millis(TIMEOUT_MS) + MARGIN;
    assert!(tally.longest <= bound, "{fault}: a request waited {:?}", tally.longest);

    let (mut most_all, mut most_after) = (0, 0);
    for (i, key) in keys.iter().enumerate() {
        let adm = admissions(&sent, &upstream, &[i]);
        let all = busiest_window(&adm, WINDOW, start);
        let after = busiest_window(&adm, WINDOW, over);
        assert!(all <= 2 * LIMIT, "{fault} {key}: over 2x the limit across the failover: {all}");
        assert!(after <= LIMIT, "{fault} {key}: over the limit after the failover: {after}");
        most_all = most_all.max(all);
        most_after = most_after.max(after);
    }
    let tail: Vec<&Sent> = sent.iter().filter(|s| s.sent >= settled).collect();
    assert!(tail.len() >= 10, "{fault}: only {} requests after the failover", tail.len());
    assert!(tail.iter().all(|s| s.decided()), "{fault}: undecided after the failover");
    eprintln!(
        "FAULT {fault}: master {old} killed; sentinels named {promoted_port} after {:.1} s; the shim decided every key again \
         {:.1} s after the kill; meanwhile: {}; whole run: {}; limit {LIMIT} per {WINDOW:?} per key, busiest window \
         over the whole run/after the failover: {most_all}/{most_after} (bounds {}/{LIMIT})",
        promoted.as_secs_f64(),
        follow.as_secs_f64(),
        meanwhile.line(),
        tally.line(),
        2 * LIMIT,
        promoted_port = redis.replica_port,
    );
}
