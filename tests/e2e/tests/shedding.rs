//! Load shedding end to end through real Envoy, the shim and Redis.
//!
//! S4c, two Envoys and one Redis: a fleet pool of 10 whose last 20% only
//! `critical` may use. Lower classes never hold more than 8 slots, across
//! both gateways; critical requests are admitted whenever fewer than 10 are
//! held; a request the reserve holds out gets 503 with the IETF problem
//! type `temporary-reduced-capacity`.
//!
//! S4d: an upstream whose ORCA load report the test drives; the shedding
//! starts, grows and recovers on a scaled-down timeline, and never sheds
//! the critical class.

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use sluice_harness::gateway::{
    envoy_with_route_timeout, eventually, open_request, prometheus, sample, send, RoughUpstream,
};
use sluice_harness::loaded::LoadedUpstream;
use sluice_harness::{Envoy, Redis, Shim};

const WAIT: Duration = Duration::from_secs(15);

const DOC: &str = r#"{"shim": {"timeout_ms": 2000}, "failure_mode": "deny",
    "class_header": "x-priority",
    "classes": [{"name": "critical", "match": {"path_prefix": "/pay/"}}, {"name": "normal"}],
    "policies": [{"name": "pool", "limits": [{"type": "concurrency", "limit": 10, "lease": "30s",
        "reserve": {"for": "critical", "share": 0.2}}]}]}"#;

struct Fleet {
    gateways: [Envoy; 2],
    _shim: Shim,
    _upstream: RoughUpstream,
    redis: Redis,
}

impl Fleet {
    fn start() -> Fleet {
        let redis = Redis::start().expect("redis");
        let shim = Shim::start(&redis.url()).expect("shim");
        let upstream = RoughUpstream::start().expect("upstream");
        let gateway = || envoy_with_route_timeout(DOC, shim.port, upstream.port, "60s").expect("envoy");
        Fleet { gateways: [gateway(), gateway()], _shim: shim, _upstream: upstream, redis }
    }

    /// Slots held in the pool, fleet-wide.
    fn held(&self) -> u64 {
        let mut conn = self.redis.connection().expect("redis");
        redis::cmd("ZCARD").arg("sluice:{pool:}:cc:30000").query(&mut conn).expect("ZCARD")
    }

    /// A request of `class` that holds its slot (the upstream never
    /// answers `/hang`) until dropped, through gateway `n`.
    fn hold(&self, n: usize, class: &str) -> TcpStream {
        open_request(self.gateways[n % 2].port, "/hang", &[("x-priority", class)]).expect("request")
    }

    /// Holds a slot for `class` through gateway `n`, and waits until the pool holds `expect`.
    fn take(&self, n: usize, class: &str, expect: u64) -> TcpStream {
        let stream = self.hold(n, class);
        assert!(eventually(WAIT, || self.held() == expect), "held {}, expected {expect}", self.held());
        stream
    }

    /// The status of a request that is refused at once, through gateway `n`.
    fn refused(&self, n: usize, path: &str, headers: &[(&str, &str)]) -> (u16, String, Option<String>) {
        let reply = send(self.gateways[n % 2].port, "GET", path, headers).expect("request");
        let content_type = reply.header("content-type").map(str::to_string);
        (reply.status, reply.body, content_type)
    }

    fn stat(&self, name: &str) -> f64 {
        self.gateways.iter().map(|g| prometheus(g).map(|page| sample(&page, name)).unwrap_or(0.0)).sum()
    }
}

/// Twenty `normal` requests at once through two gateways: the pool holds
/// exactly 8 of them, and the other 12 get 503 at once.
#[test]
fn lower_classes_never_hold_more_than_their_share() {
    let fleet = Fleet::start();
    let mut streams: Vec<TcpStream> = (0..20).map(|n| fleet.hold(n, "normal")).collect();
    // An admitted request hangs (the upstream never answers); a refused one
    // is answered at once.
    let statuses: Vec<Option<u16>> = streams.iter_mut().map(status_within_a_second).collect();
    let refused: Vec<u16> = statuses.iter().flatten().copied().collect();
    assert_eq!(refused, vec![503; 12], "the 12 beyond the share are refused with 503");
    assert_eq!(fleet.held(), 8, "normal requests hold 8 slots");
    assert_eq!(fleet.stat(r#"sluice_class_denied{class="normal"}"#), 12.0);
}

/// The status line of the answer on `stream`, if one comes within a second.
fn status_within_a_second(stream: &mut TcpStream) -> Option<u16> {
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Critical requests are admitted whenever fewer than 10 slots are held,
/// and only then; a normal request never while 8 or more are.
#[test]
fn critical_requests_use_the_reserve() {
    let fleet = Fleet::start();
    let mut held: Vec<TcpStream> = (0..8).map(|n| fleet.take(n, "normal", n as u64 + 1)).collect();

    let (status, body, content_type) = fleet.refused(0, "/catalog", &[]);
    assert_eq!(status, 503, "a ninth normal request: {body}");
    assert_eq!(content_type.as_deref(), Some("application/problem+json"));
    let problem: serde_json::Value = serde_json::from_str(&body).expect("problem json");
    assert_eq!(problem["type"], "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity");
    assert_eq!(problem["class"], "normal");

    held.push(fleet.take(0, "critical", 9));
    held.push(fleet.take(1, "critical", 10));
    // A payment is critical by its path.
    assert_eq!(fleet.refused(0, "/pay/3", &[]).0, 503, "the whole pool is held");

    // One normal request ends: 9 held. A normal request is still refused;
    // a critical one takes the tenth slot.
    held.remove(0);
    assert!(eventually(WAIT, || fleet.held() == 9), "held {}", fleet.held());
    assert_eq!(fleet.refused(1, "/catalog", &[]).0, 503, "9 held: above the normal share of 8");
    held.push(fleet.take(1, "critical", 10));
    assert_eq!(fleet.stat(r#"sluice_class_allowed{class="critical"}"#), 3.0);
    drop(held);
    assert!(eventually(WAIT, || fleet.held() == 0), "every slot comes back");
}

/// The utilization shedder (S4d), with the scenario's timeline scaled down:
/// shedding starts 2 s into trouble and reaches every class but `critical`
/// 4 s later; it takes 4 s to recover. The upstream reports its load in the
/// ORCA header, as the test sets it.
const SHEDDING: &str = r#"{"shim": {"timeout_ms": 2000}, "failure_mode": "deny",
    "class_header": "x-priority",
    "classes": [{"name": "critical"}, {"name": "normal"}, {"name": "batch"}],
    "policies": [{"name": "svc",
        "shed": {"signal": {"orca": "cpu_utilization"},
                 "controller": {"delay": "2s", "ramp": "4s", "recovery": "4s"}},
        "limits": [{"type": "concurrency", "limit": 1000, "lease": "30s"}]}]}"#;

const CLASSES: [&str; 3] = ["critical", "normal", "batch"];

/// What one request of the steady traffic got.
struct Sample {
    at: Instant,
    class: usize,
    status: u16,
}

/// Sends one request of each class, in turn, through `envoy` until `done`
/// holds of what was sent so far (or `within` runs out: false).
fn drive(
    envoy: &Envoy,
    samples: &mut Vec<Sample>,
    within: Duration,
    done: impl Fn(&[Sample]) -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    let from = samples.len();
    while Instant::now() < deadline {
        for (class, name) in CLASSES.iter().enumerate() {
            let reply = send(envoy.port, "GET", "/", &[("x-priority", name)]).expect("request");
            samples.push(Sample { at: Instant::now(), class, status: reply.status });
        }
        if done(&samples[from..]) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn shed(samples: &[Sample], class: usize) -> usize {
    samples.iter().filter(|s| s.class == class && s.status == 503).count()
}

/// Under steady traffic of every class: nothing is shed while the load is
/// low; once it is high, nothing for the delay, then the least important
/// class first, then the next, up to every request of both; the critical
/// class never. When the load falls, the shedding falls until nothing is shed.
#[test]
fn the_shedder_starts_grows_and_recovers_on_its_timeline() {
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let upstream = LoadedUpstream::start(0.5).expect("upstream");
    let envoy = Envoy::start(SHEDDING, shim.port, upstream.port).expect("envoy");
    let mut samples = Vec::new();

    // Low load: a few report periods, nothing shed.
    let calm = drive(&envoy, &mut samples, Duration::from_secs(3), |_| false);
    assert!(!calm);
    assert_eq!(samples.iter().filter(|s| s.status != 200).count(), 0, "shed under low load");

    // High load: batch is shed first, then normal, then all of both.
    upstream.set_load(0.95);
    let trouble = Instant::now();
    let all_shed = |s: &[Sample]| {
        let last: Vec<&Sample> = s.iter().rev().take(3 * 5).collect();
        last.len() == 15 && last.iter().all(|x| x.class == 0 || x.status == 503)
    };
    let reached = drive(&envoy, &mut samples, Duration::from_secs(30), all_shed);
    assert!(reached, "never shed every non-critical request\n{}", envoy.log());
    let first = |class| samples.iter().find(|s| s.class == class && s.status == 503).map(|s| s.at);
    let (batch, normal) = (first(2).expect("batch shed"), first(1).expect("normal shed"));
    assert!(
        batch - trouble >= Duration::from_secs(2),
        "shed {:?} into trouble, before the 2 s delay",
        batch - trouble
    );
    assert!(batch < normal, "the least important class goes first");
    assert_eq!(shed(&samples, 0), 0, "the critical class is never shed");

    // Low load again: the shedding falls until nothing is shed.
    upstream.set_load(0.3);
    let recovered = |s: &[Sample]| {
        let last: Vec<&Sample> = s.iter().rev().take(3 * 5).collect();
        last.len() == 15 && last.iter().all(|x| x.status == 200)
    };
    assert!(drive(&envoy, &mut samples, Duration::from_secs(30), recovered), "never recovered");
    assert_eq!(shed(&samples, 0), 0, "the critical class is never shed");

    let page = prometheus(&envoy).expect("stats");
    assert!(sample(&page, r#"sluice_class_shed{class="batch"}"#) > 0.0);
    assert_eq!(sample(&page, r#"sluice_class_shed{class="critical"}"#), 0.0);
    assert_eq!(sample(&page, r#"sluice_shed{policy="svc"}"#), (shed(&samples, 1) + shed(&samples, 2)) as f64);
}
