//! Two shims behind one Envoy cluster, restarted one after the other under
//! steady traffic, as a rolling deployment does: SIGTERM, wait for the exit,
//! start again, wait until Envoy sees it healthy, then the next.
//!
//! What makes it lose nothing (`envoy/demo.yaml`, `docs/reliability.md`):
//! Envoy health-checks each shim's `/healthz`; a shim given SIGTERM answers
//! 503 there for its `--drain-delay-ms` while it still serves every call, so
//! Envoy takes it out of rotation before it stops accepting; then it
//! answers what is in flight and exits. Calls go to the other shim meanwhile.
//!
//! Claims, each asserted, with the counts printed on a `RESTART` line:
//! - no request fails or is decided by `failure_mode` (here `deny`, 503):
//!   every one is decided by a shim (a counted admission or a 429);
//! - exactness holds throughout: no window of any key admits more than its
//!   limit, judged from the upstream's own record of arrivals;
//! - each shim exits by itself within its drain (delay + timeout) and
//!   logs that it drained;
//! - with egress `wait`, the draining shim gives back the reservations of
//!   the held calls it refuses, whatever their order, and leaves no
//!   phantom slot: a fresh call afterwards gets the slot right after the
//!   last real call.

use std::time::{Duration, Instant};

use sluice_harness::egress::{leftovers, sends, waiters, Call, Caller};
use sluice_harness::faults::{admissions, busiest_window, Tally, Target, Traffic};
use sluice_harness::gateway::{eventually, send};
use sluice_harness::partner::Limits;
use sluice_harness::recorder::RecordingUpstream;
use sluice_harness::{Envoy, Partner, Redis, Shim};

const LIMIT: usize = 30;
const WINDOW: Duration = Duration::from_secs(2);
const CLIENTS: usize = 3;
const PAUSE: Duration = Duration::from_millis(15);
const PER_CLIENT: usize = 6000;
/// Envoy's health check interval here, and the shims' drain delay: over ten
/// intervals, so a loaded machine's late check still lands inside it.
const HEALTH_INTERVAL: &str = "0.2s";
const DRAIN_DELAY_MS: &str = "3000";
const DRAIN_TIMEOUT_MS: &str = "5000";
const WAIT: Duration = Duration::from_secs(30);

fn document() -> String {
    format!(
        r#"{{"shim": {{"timeout_ms": 1000, "failure_threshold": 3, "cooldown_ms": 500}},
            "failure_mode": "deny", "failure_status": 503, "headers": "always",
            "policies": [{{"name": "roll", "match": {{"path_prefix": "/"}}, "key": ["header:x-api-key"],
              "limits": [{{"type": "sliding_window", "limit": {LIMIT}, "window": "{}ms"}}]}}]}}"#,
        WINDOW.as_millis()
    )
}

/// Whether Envoy's shim cluster counts the shim on `port` healthy.
fn healthy(envoy: &Envoy, port: u16) -> bool {
    let Ok(page) = send(envoy.admin_port, "GET", "/clusters", &[]) else { return false };
    let flag = format!("sluice_shim::127.0.0.1:{port}::health_flags::healthy");
    page.body.lines().any(|line| line.trim() == flag)
}

#[test]
fn rolling_restart_of_two_shims_fails_no_request_and_stays_exact() {
    let redis = Redis::start().expect("redis");
    let args = |url: &str| {
        vec![
            "--redis".to_string(),
            url.to_string(),
            "--drain-delay-ms".into(),
            DRAIN_DELAY_MS.into(),
            "--drain-timeout-ms".into(),
            DRAIN_TIMEOUT_MS.into(),
        ]
    };
    let start_shim = || {
        let a = args(&redis.url());
        Shim::start_args(&a.iter().map(String::as_str).collect::<Vec<_>>()).expect("shim")
    };
    let mut shims = [start_shim(), start_shim()];
    let upstream = RecordingUpstream::start().expect("upstream");
    let second = format!(
        "- endpoint: {{address: {{socket_address: {{address: \"127.0.0.1\", port_value: {}}}}}}}",
        shims[1].port
    );
    let envoy = Envoy::start_with(
        &document(),
        shims[0].port,
        upstream.port,
        &[("SHIM_MORE_ENDPOINTS", second), ("SHIM_HEALTH_INTERVAL", HEALTH_INTERVAL.to_string())],
    )
    .expect("envoy");
    assert!(
        eventually(WAIT, || shims.iter().all(|s| healthy(&envoy, s.port))),
        "Envoy never saw both shims healthy\n{}",
        envoy.log()
    );

    let keys = ["alice", "bob", "carol", "dave"];
    let targets = keys.iter().map(|k| Target::new("/api", &[("x-api-key", k)])).collect();
    let start = Instant::now();
    let traffic = Traffic::start(envoy.port, targets, CLIENTS, PAUSE, PER_CLIENT);
    std::thread::sleep(Duration::from_millis(2500));
    let mut drains = Vec::new();
    for shim in &mut shims {
        let stopped = Instant::now();
        let status = shim.terminate(WAIT).expect("the shim exits after its drain");
        drains.push(stopped.elapsed());
        assert!(status.success(), "the shim exited with {status}\n{}", shim.log());
        assert!(shim.log().contains("drained"), "{}", shim.log());
        shim.restart().expect("the shim starts again");
        assert!(
            eventually(WAIT, || healthy(&envoy, shim.port)),
            "Envoy never saw the restarted shim healthy"
        );
        std::thread::sleep(Duration::from_millis(1000));
    }
    std::thread::sleep(Duration::from_millis(2500));
    let sent = traffic.finish();

    let tally = Tally::of(&sent);
    let mut busiest = 0;
    for (i, key) in keys.iter().enumerate() {
        let most = busiest_window(&admissions(&sent, &upstream, &[i]), WINDOW, start);
        assert!(most <= LIMIT, "{key}: {most} admitted in one window, limit {LIMIT}");
        busiest = busiest.max(most);
    }
    let drains: Vec<String> = drains.iter().map(|d| format!("{:.1} s", d.as_secs_f64())).collect();
    eprintln!(
        "RESTART two shims, one after the other (drain delay {DRAIN_DELAY_MS} ms, health check every \
         {HEALTH_INTERVAL}): {}; busiest window {busiest} (limit {LIMIT} per {WINDOW:?} per key); \
         SIGTERM to exit: {}",
        tally.line(),
        drains.join(", ")
    );
    assert!(tally.admitted > 0 && tally.refused > 0, "the traffic never reached the limit: {}", tally.line());
    assert_eq!(tally.failed, 0, "failed requests: {}", tally.line());
    assert_eq!(tally.failure_allowed, 0, "requests let through by failure_mode: {}", tally.line());
}

/// Regression (issue 37): 40 calls held on an `interval` of 250 ms (the
/// default margin, 4 ms; wait 15 s) across two shims behind one Envoy; 3 s in, the shim holding more
/// of them gets SIGTERM with `--drain-delay-ms`. It serves the calls whose slots come before its
/// hold deadline and refuses the rest (429 with a retry-after), giving
/// their reservations back all at once, in no order, between the slots the
/// other shim still holds. A give-back used to undo a reservation only if
/// it was the newest, so the bucket stayed up to 8 slots past the last
/// real call and a fresh call waited for slots nobody used. Now: every call
/// is served or refused with a retry-after (none failed), the two shims
/// never let two calls go less than the interval plus the margin apart
/// (their sends on Redis's clock, from the log of a sliding window that
/// never binds; the partner only records: the way to it varies by more
/// than 4 ms on a loaded host), nothing stays held in Redis, the bucket
/// lies exactly at the real sends' end, and a fresh call sent while the
/// key is still busy is held for the slot right after the last real call
/// (that end plus the margin, read from Redis while it is held).
#[test]
fn a_drain_that_refuses_held_calls_leaves_no_phantom_slot() {
    const PATH: &str = "/v42/orders";
    const ACCOUNT: &str = "alice";
    let redis = Redis::start().expect("redis");
    let args = [
        "--redis".to_string(),
        redis.url(),
        "--drain-delay-ms".into(),
        DRAIN_DELAY_MS.into(),
        "--drain-timeout-ms".into(),
        "3000".into(),
    ];
    let start_shim = || Shim::start_args(&args.iter().map(String::as_str).collect::<Vec<_>>()).expect("shim");
    let mut shims = [start_shim(), start_shim()];
    let partner = Partner::start(Limits::default()).expect("partner");
    let document = r#"{"shim": {"timeout_ms": 2000}, "failure_mode": "deny", "failure_status": 503,
        "policies": [{"name": "drained", "match": {"path_prefix": "/v42/"}, "key": ["header:x-account"],
          "wait": {"timeout": "15s"},
          "limits": [{"type": "interval", "every": "250ms"},
                     {"type": "sliding_window", "limit": 1000000, "window": "1h"}]}]}"#;
    // The default margin, in µs.
    const MARGIN_US: u64 = 4_000;
    let second = format!(
        "- endpoint: {{address: {{socket_address: {{address: \"127.0.0.1\", port_value: {}}}}}}}",
        shims[1].port
    );
    let envoy = Envoy::start_with(
        document,
        shims[0].port,
        partner.port,
        &[("SHIM_MORE_ENDPOINTS", second), ("SHIM_HEALTH_INTERVAL", HEALTH_INTERVAL.to_string())],
    )
    .expect("envoy");
    assert!(
        eventually(WAIT, || shims.iter().all(|s| healthy(&envoy, s.port))),
        "Envoy never saw both shims healthy\n{}",
        envoy.log()
    );
    let caller = Caller::new(PATH, ACCOUNT, WAIT).expect("a client");
    let pending: Vec<_> = (0..40).map(|seq| caller.spawn(envoy.port, 0, seq, &[])).collect();
    std::thread::sleep(Duration::from_secs(3));
    // The shim holding more of them drains (however Envoy spread them).
    let held: Vec<u64> = shims.iter().map(|s| waiters(s.port).unwrap_or(0)).collect();
    let (draining, other) = if held[0] >= held[1] { (0, 1) } else { (1, 0) };
    let status = shims[draining].terminate(WAIT).expect("the shim exits after its drain");
    assert!(status.success() && shims[draining].log().contains("drained"), "{}", shims[draining].log());
    let calls: Vec<Call> = pending.into_iter().map(|c| caller.join(c).expect("a call")).collect();
    let served = calls.iter().filter(|c| c.served()).count();
    let refused: Vec<&Call> = calls.iter().filter(|c| c.refused_by_gateway()).collect();
    let log = partner.log();
    eprintln!(
        "DRAIN with held calls ({held:?} held by the two shims at SIGTERM): {served} served, {} refused with a retry-after {:?}; \
         smallest gap at the partner {:?}",
        refused.len(),
        refused.iter().map(|c| c.retry_after.clone().unwrap_or_default()).collect::<Vec<_>>(),
        log.min_gap()
    );
    assert_eq!(served + refused.len(), calls.len(), "failed calls: {calls:?}");
    assert!(refused.iter().all(|c| c.retry_after.is_some()), "refused without a retry-after: {refused:?}");
    assert!(!refused.is_empty(), "the drain refused no held call: the case is not exercised");
    let sent = sends(&redis, "drained").expect("the shims' sends");
    let close: Vec<u64> =
        sent.windows(2).map(|w| w[1] - w[0]).filter(|&gap| gap < 250_000 + MARGIN_US).collect();
    eprintln!("DRAIN: smallest gap at the shims' sends {:?} µs", sent.windows(2).map(|w| w[1] - w[0]).min());
    assert_eq!(sent.len(), served, "the shims' sends are not the calls served");
    assert!(close.is_empty(), "sends closer than the interval plus margin at the shims (µs): {close:?}");
    let held = leftovers(&redis, "sluice:{drained:*:held").expect("KEYS");
    assert!(held.is_empty(), "reservations left held: {held:?}");
    // Nothing phantom: the bucket is what the real sends make it, and a
    // fresh call sent while the key is still busy is held for the slot right
    // after the last real call (the real sends' tat plus the margin).
    let mut conn = redis.connection().expect("redis connection");
    let sent_keys: Vec<String> =
        redis::cmd("KEYS").arg("sluice:{drained:*:sent").query(&mut conn).expect("KEYS");
    let [sent_key] = &sent_keys[..] else { panic!("one bucket expected: {sent_keys:?}") };
    let key = sent_key.trim_end_matches(":sent");
    let (tat, sends): (Option<u64>, Option<u64>) = redis::pipe()
        .cmd("GET")
        .arg(key)
        .cmd("HGET")
        .arg(sent_key)
        .arg("s")
        .query(&mut conn)
        .expect("GET, HGET");
    assert_eq!(tat, sends, "the bucket lies past the real sends: a phantom slot");
    let fresh = caller.spawn(envoy.port, 0, 40, &[]);
    let mut fresh_slot = None;
    while fresh_slot.is_none() && !fresh.is_finished() {
        let held: Vec<(String, u64)> = redis::cmd("ZRANGE")
            .arg(format!("{key}:held"))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(&mut conn)
            .expect("ZRANGE");
        fresh_slot = held.first().map(|&(_, slot)| slot);
        std::thread::sleep(Duration::from_millis(1));
    }
    let fresh = caller.join(fresh).expect("a fresh call");
    eprintln!("FRESH call after the drain: held for slot {fresh_slot:?}; the real sends' end {sends:?}");
    assert!(fresh.served(), "{fresh:?}\n{}", shims[other].log());
    match fresh_slot {
        // Held: its slot is the one right after the last real call.
        Some(slot) => assert_eq!(Some(slot), sends.map(|s| s + MARGIN_US), "the fresh call's slot"),
        // Sent at once: the key was no longer busy when it came.
        None => assert!(fresh.held_ms.is_none_or(|ms| ms == 0.0), "{fresh:?}"),
    }
}
