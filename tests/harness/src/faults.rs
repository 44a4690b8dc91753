//! Steady traffic through a gateway while a test injects a fault, and the
//! judges of what came out: how many requests were admitted, refused and
//! failed, the longest any request waited, and whether any limit was
//! exceeded, judged from the upstream's own record ([`RecordingUpstream`]).
//!
//! [`Traffic`] runs a few client threads, each sending requests in turn
//! (round robin over its targets, a short pause between them) until stopped
//! or a bounded count is reached. Every request carries an `x-trace` id, so
//! its client-side record ([`Sent`]) joins the upstream's ([`Arrival`]).
//! While it runs, [`Traffic::decided_since`] tells whether the shim decides
//! again after a fault.
//!
//! The judges never trust timings to be small: a request's limit check
//! happened at some moment between when the client sent it and when the
//! upstream saw it, so a request is counted in a window only if both ends
//! fall inside it ([`busiest_window`]); a count over the limit is then a
//! certain over-admission, never an artefact of a slow machine.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::recorder::{Arrival, RecordingUpstream};

/// A client gives up on a request after this long (then it counts as failed).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);

/// Where requests go: a path and its headers.
#[derive(Clone, Debug)]
pub struct Target {
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Target {
    pub fn new(path: &str, headers: &[(&str, &str)]) -> Target {
        let headers = headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        Target { path: path.to_string(), headers }
    }
}

/// One request as its client saw it.
#[derive(Clone, Debug)]
pub struct Sent {
    pub trace: u64,
    /// Which of the traffic's targets.
    pub target: usize,
    pub sent: Instant,
    /// Until the whole response (or the error).
    pub took: Duration,
    /// `None` when the request failed without a response.
    pub status: Option<u16>,
    /// An admitted response carrying `ratelimit` (the policy document has
    /// `headers: always`): the shim decided and counted it. An admitted
    /// response without it was let through by `failure_mode: allow`.
    pub counted: bool,
    pub error: Option<String>,
}

impl Sent {
    pub fn admitted(&self) -> bool {
        self.status == Some(200)
    }

    /// Decided by the shim: a counted admission or a 429.
    pub fn decided(&self) -> bool {
        self.status == Some(429) || (self.admitted() && self.counted)
    }
}

/// Steady traffic from `clients` threads to `targets` on `127.0.0.1:port`.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    record: Arc<Mutex<Vec<Sent>>>,
    pub targets: Vec<Target>,
}

impl Traffic {
    /// Starts `clients` threads, each sending at most `per_client` requests
    /// with `pause` between them, cycling through `targets` from its own
    /// offset.
    pub fn start(
        port: u16,
        targets: Vec<Target>,
        clients: usize,
        pause: Duration,
        per_client: usize,
    ) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicU64::new(1));
        let record = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|client| {
                let (stop, next, targets) = (stop.clone(), next.clone(), targets.clone());
                let record = record.clone();
                std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
                    let Ok(runtime) = runtime else { return };
                    let client = Client { port, targets: &targets, offset: client, record: &record };
                    runtime.block_on(client.run(pause, per_client, &stop, &next));
                })
            })
            .collect();
        Traffic { stop, threads, record, targets }
    }

    /// The shim decides again: for every target, a request sent after
    /// `since` was admitted and counted (a 429 may come from the over-limit
    /// cache, without asking the shim), and the latest one answered was
    /// decided by the shim.
    pub fn decided_since(&self, since: Instant) -> bool {
        let Ok(record) = self.record.lock() else { return false };
        (0..self.targets.len()).all(|target| {
            let answered: Vec<&Sent> =
                record.iter().filter(|s| s.target == target && s.sent >= since).collect();
            let latest = answered.iter().max_by_key(|s| s.sent + s.took);
            answered.iter().any(|s| s.admitted() && s.counted) && latest.is_some_and(|s| s.decided())
        })
    }

    /// The requests answered so far, in the order they were recorded.
    pub fn so_far(&self) -> Vec<Sent> {
        self.record.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Stops the clients (each finishes its request in flight) and returns
    /// every request's record, in the order sent.
    pub fn finish(mut self) -> Vec<Sent> {
        self.stop.store(true, Ordering::SeqCst);
        for thread in std::mem::take(&mut self.threads) {
            let _ = thread.join();
        }
        let mut all = self.record.lock().map(|r| r.clone()).unwrap_or_default();
        all.sort_by_key(|s| s.sent);
        all
    }
}

impl Drop for Traffic {
    /// Stops the clients also when a test fails before [`Traffic::finish`].
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One client thread's loop.
struct Client<'a> {
    port: u16,
    targets: &'a [Target],
    offset: usize,
    record: &'a Mutex<Vec<Sent>>,
}

impl Client<'_> {
    async fn run(&self, pause: Duration, per_client: usize, stop: &AtomicBool, next: &AtomicU64) {
        let Ok(http) = reqwest::Client::builder().timeout(CLIENT_TIMEOUT).build() else { return };
        for n in 0..per_client {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let target = (self.offset + n) % self.targets.len();
            let sent = self.send(&http, target, next.fetch_add(1, Ordering::Relaxed)).await;
            if let Ok(mut record) = self.record.lock() {
                record.push(sent);
            }
            tokio::time::sleep(pause).await;
        }
    }

    async fn send(&self, http: &reqwest::Client, target: usize, trace: u64) -> Sent {
        let mut request = http.get(format!("http://127.0.0.1:{}{}", self.port, self.targets[target].path));
        for (name, value) in &self.targets[target].headers {
            request = request.header(name, value);
        }
        let sent = Instant::now();
        let result = request.header("x-trace", trace.to_string()).send().await;
        let (status, counted, error) = match result {
            Ok(response) => {
                let status = response.status().as_u16();
                let counted = response.headers().contains_key("ratelimit");
                match response.bytes().await {
                    Ok(_) => (Some(status), counted, None),
                    Err(e) => (None, false, Some(e.to_string())),
                }
            }
            Err(e) => (None, false, Some(e.to_string())),
        };
        Sent { trace, target, sent, took: sent.elapsed(), status, counted, error }
    }
}

/// An admitted request that the shim counted: when its client sent it and
/// when the upstream saw it. Its limit check happened in between.
#[derive(Clone, Copy, Debug)]
pub struct Admission {
    pub sent: Instant,
    pub arrived: Instant,
}

/// The counted admissions of the requests sent to the targets `which`,
/// joined with the upstream's record. Panics if an admitted request never
/// reached the upstream, which would make the record meaningless.
pub fn admissions(sent: &[Sent], upstream: &RecordingUpstream, which: &[usize]) -> Vec<Admission> {
    let arrivals: std::collections::HashMap<u64, Arrival> =
        upstream.arrivals().into_iter().filter_map(|a| Some((a.trace?, a))).collect();
    sent.iter()
        .filter(|s| s.admitted() && s.counted && which.contains(&s.target))
        .map(|s| {
            let arrival =
                arrivals.get(&s.trace).unwrap_or_else(|| panic!("admitted {s:?} never reached the upstream"));
            Admission { sent: s.sent, arrived: arrival.arrived }
        })
        .collect()
}

/// The most admissions certainly inside one interval `window` long that
/// starts at or after `from`: for each admission's send time `t >= from`,
/// those sent at or after `t` that reached the upstream before `t + window`.
/// An exact sliding window of `limit` per `window` never lets this exceed `limit`.
pub fn busiest_window(admissions: &[Admission], window: Duration, from: Instant) -> usize {
    admissions
        .iter()
        .filter(|a| a.sent >= from)
        .map(|start| {
            let end = start.sent + window;
            admissions.iter().filter(|a| a.sent >= start.sent && a.arrived < end).count()
        })
        .max()
        .unwrap_or(0)
}

/// The most intervals `[start, end)` that overlap at one moment.
pub fn most_at_once(intervals: &[(Instant, Instant)]) -> usize {
    let mut edges: Vec<(Instant, i32)> = intervals.iter().flat_map(|&(s, e)| [(s, 1), (e, -1)]).collect();
    // At one instant an end comes before a start: [s, e) intervals that touch do not overlap.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most.max(0) as usize
}

/// What a fault did to the traffic, for the summary line.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub sent: usize,
    /// Admitted and counted by the shim.
    pub admitted: usize,
    /// Admitted by `failure_mode: allow`, uncounted.
    pub failure_allowed: usize,
    /// 429.
    pub refused: usize,
    /// Any other status, or no response.
    pub failed: usize,
    pub longest: Duration,
    /// The statuses and errors of the failed requests, for the line.
    pub failures: std::collections::BTreeMap<String, usize>,
}

impl Tally {
    pub fn of<'a>(sent: impl IntoIterator<Item = &'a Sent>) -> Tally {
        let mut t = Tally::default();
        for s in sent {
            t.sent += 1;
            t.longest = t.longest.max(s.took);
            match s.status {
                Some(200) if s.counted => t.admitted += 1,
                Some(200) => t.failure_allowed += 1,
                Some(429) => t.refused += 1,
                other => {
                    t.failed += 1;
                    let what = other.map_or_else(|| "error".to_string(), |s| s.to_string());
                    *t.failures.entry(what).or_default() += 1;
                }
            }
        }
        t
    }

    /// `sent N, admitted A (+F by failure_mode allow), refused R, failed X (503 x3), longest wait W`
    pub fn line(&self) -> String {
        let failures: Vec<String> = self.failures.iter().map(|(what, n)| format!("{what} x{n}")).collect();
        let failures =
            if failures.is_empty() { String::new() } else { format!(" ({})", failures.join(", ")) };
        format!(
            "sent {}, admitted {} (+{} by failure_mode allow), refused {}, failed {}{failures}, longest wait {:.2} s",
            self.sent,
            self.admitted,
            self.failure_allowed,
            self.refused,
            self.failed,
            self.longest.as_secs_f64()
        )
    }
}
