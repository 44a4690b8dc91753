//! The egress shape of S0, S1 and S2 (SCENARIOS.md): many workers calling one
//! third party through the gateway. [`Egress`] starts one Redis, one or more
//! gateways (each its own shim and Envoy, rendered like every other test's)
//! and the [`Partner`] behind them; [`Workers`] are the callers, and
//! [`Caller`] sends single calls a test controls one by one.
//!
//! Every call carries the account header and a sequence number, and comes
//! back as a [`Call`]: its status, whether the partner or the gateway
//! answered, its `retry-after`, and how long the gateway held it (the
//! `server-timing: sluice;dur=<ms>` of a held call).
//!
//! [`Busy`] spins processes beside them, for a loaded gateway host.
//!
//! The Redis helpers see what the gateways do in Redis without knowing their
//! key layout: [`activity`] counts the commands Redis has run (to know that
//! a call has reached Redis and taken its place), [`leftovers`] lists the
//! non-empty collections under a prefix (to know that nothing is left
//! behind), [`sends`] reads back when the shims let a policy's calls go.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::partner::{self, Partner};
use crate::{Envoy, Redis, Shim};

/// One gateway: its own shim and Envoy. Envoy drops first.
pub struct Gateway {
    pub envoy: Envoy,
    pub shim: Shim,
}

impl Gateway {
    /// A shim on `redis` and an Envoy running `policy_json` in front of the
    /// partner on `partner_port`. The policy is parsed first, so a document
    /// the filter would refuse fails here with the parser's message instead
    /// of Envoy's exit.
    pub fn start(policy_json: &str, redis: &Redis, partner_port: u16) -> anyhow::Result<Gateway> {
        if let Err(err) = sluice_policies::parse(policy_json) {
            anyhow::bail!("the policy document is refused: {err}");
        }
        let shim = Shim::start(&redis.url())?;
        let envoy = Envoy::start(policy_json, shim.port, partner_port)?;
        Ok(Gateway { envoy, shim })
    }

    /// Its shim's `GET /metrics` page.
    pub fn metrics(&self) -> anyhow::Result<String> {
        match crate::probe::http_get(self.shim.port, "/metrics") {
            Some((200, page)) => Ok(page),
            other => anyhow::bail!("GET /metrics: {other:?}"),
        }
    }
}

/// How many waiting checks the shim on `port` holds now (`sluice_waiters`).
pub fn waiters(port: u16) -> Option<u64> {
    let (_, page) = crate::probe::http_get(port, "/metrics").filter(|(status, _)| *status == 200)?;
    page.lines().find_map(|l| l.strip_prefix("sluice_waiters ")?.trim().parse::<f64>().ok()).map(|n| n as u64)
}

/// A histogram of a metrics page: cumulative counts by upper bound (s).
#[derive(Clone, Debug, Default)]
pub struct Histogram(pub Vec<(f64, f64)>);

impl Histogram {
    /// `name`'s buckets on `page` (empty if absent).
    pub fn of(page: &str, name: &str) -> Histogram {
        let prefix = format!("{name}_bucket{{le=\"");
        let mut buckets: Vec<(f64, f64)> = page
            .lines()
            .filter_map(|l| {
                let (le, count) = l.strip_prefix(&prefix)?.split_once("\"} ")?;
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
                Some((le, count.split(' ').next()?.parse().ok()?))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Histogram(buckets)
    }

    /// What was observed after `before` was read.
    pub fn since(&self, before: &Histogram) -> Histogram {
        Histogram(
            self.0
                .iter()
                .map(|&(le, n)| (le, n - before.0.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1)))
                .collect(),
        )
    }

    pub fn count(&self) -> f64 {
        self.0.last().map_or(0.0, |b| b.1)
    }

    /// The upper bound (ms) of the bucket quantile `q` falls in.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        let total = self.count();
        self.0.iter().find(|(_, c)| *c >= q * total && *c > 0.0).map_or(f64::NAN, |(le, _)| le * 1e3)
    }

    /// p50, p99 and max (bucket upper bounds, ms) and the count, for a log line.
    pub fn line(&self) -> String {
        format!(
            "n {}, p50 <= {:.2} ms, p99 <= {:.2} ms, max <= {:.2} ms",
            self.count(),
            self.quantile_ms(0.5),
            self.quantile_ms(0.99),
            self.quantile_ms(1.0)
        )
    }
}

/// Gateways, the partner behind them and the Redis they share, in drop
/// order: the gateways stop first, Redis last.
pub struct Egress {
    pub gateways: Vec<Gateway>,
    pub partner: Partner,
    pub redis: Redis,
}

impl Egress {
    /// `gateways` gateways running `policy_json`, all sharing one Redis, all
    /// forwarding to `partner`.
    pub fn start(policy_json: &str, gateways: usize, partner: Partner) -> anyhow::Result<Egress> {
        let redis = Redis::start()?;
        let started = (0..gateways)
            .map(|_| Gateway::start(policy_json, &redis, partner.port))
            .collect::<anyhow::Result<Vec<Gateway>>>()?;
        Ok(Egress { gateways: started, partner, redis })
    }

    /// The gateways' listener ports.
    pub fn ports(&self) -> Vec<u16> {
        self.gateways.iter().map(|g| g.envoy.port).collect()
    }

    /// Every gateway's Envoy and shim log, for failure messages.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for (i, g) in self.gateways.iter().enumerate() {
            all.push_str(&format!("--- gateway {i}: envoy ---\n{}\n", tail(&g.envoy.log(), 60)));
            all.push_str(&format!("--- gateway {i}: shim ---\n{}\n", tail(&g.shim.log(), 30)));
        }
        all
    }
}

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// One call's outcome, as the client saw it.
#[derive(Clone, Debug)]
pub struct Call {
    pub seq: u64,
    /// Index of the gateway it went through.
    pub gateway: usize,
    /// `None` when the call failed without an answer (see `error`).
    pub status: Option<u16>,
    pub error: Option<String>,
    /// The answer came from the partner ([`partner::MARK`] present), not the gateway.
    pub from_partner: bool,
    pub retry_after: Option<String>,
    /// `server-timing: sluice;dur=<ms>`: how long the gateway held it.
    pub held_ms: Option<f64>,
    /// Since the run (or the [`Caller`]) started.
    pub sent: Duration,
    pub done: Duration,
}

impl Call {
    /// The partner answered 200.
    pub fn served(&self) -> bool {
        self.status == Some(200) && self.from_partner
    }

    /// A 429 the gateway answered itself.
    pub fn refused_by_gateway(&self) -> bool {
        self.status == Some(429) && !self.from_partner
    }

    /// A 429 from the partner, passed through.
    pub fn refused_by_partner(&self) -> bool {
        self.status == Some(429) && self.from_partner
    }
}

/// `sluice;dur=12.5` (possibly among other metrics) to 12.5.
pub fn server_timing_ms(value: &str) -> Option<f64> {
    value.split(',').find_map(|metric| {
        let mut parts = metric.split(';').map(str::trim);
        (parts.next()? == "sluice").then_some(())?;
        parts.find_map(|param| param.strip_prefix("dur=")?.trim_matches('"').parse().ok())
    })
}

/// Sends calls and keeps them in flight while the test does other things.
pub struct Caller {
    runtime: Runtime,
    target: Target,
}

/// What every call shares: the client (its connection pools), the path and
/// account, and the clock calls are timed by.
#[derive(Clone)]
struct Target {
    client: reqwest::Client,
    path: String,
    account: String,
    started: Instant,
}

impl Target {
    fn call(
        &self,
        port: u16,
        gateway: usize,
        seq: u64,
        extra: &[(&str, String)],
    ) -> impl Future<Output = Call> {
        let mut request = self
            .client
            .get(format!("http://127.0.0.1:{port}{}", self.path))
            .header(partner::ACCOUNT, &self.account)
            .header(partner::SEQ, seq.to_string());
        for (name, value) in extra {
            request = request.header(*name, value);
        }
        call(request, gateway, seq, self.started)
    }
}

impl Caller {
    /// Calls `GET path` with `x-account: account`; each call gives up after `timeout`.
    pub fn new(path: &str, account: &str, timeout: Duration) -> anyhow::Result<Caller> {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let client = reqwest::Client::builder().timeout(timeout).build()?;
        let target = Target { client, path: path.into(), account: account.into(), started: Instant::now() };
        Ok(Caller { runtime, target })
    }

    /// Starts call `seq` through the gateway on `port` (index `gateway`),
    /// with `extra` headers.
    pub fn spawn(&self, port: u16, gateway: usize, seq: u64, extra: &[(&str, String)]) -> JoinHandle<Call> {
        self.runtime.spawn(self.target.call(port, gateway, seq, extra))
    }

    /// Waits for a spawned call.
    pub fn join(&self, call: JoinHandle<Call>) -> anyhow::Result<Call> {
        Ok(self.runtime.block_on(call)?)
    }

    /// Sends call `seq` and waits for it.
    pub fn send(
        &self,
        port: u16,
        gateway: usize,
        seq: u64,
        extra: &[(&str, String)],
    ) -> anyhow::Result<Call> {
        self.join(self.spawn(port, gateway, seq, extra))
    }
}

async fn call(request: reqwest::RequestBuilder, gateway: usize, seq: u64, started: Instant) -> Call {
    let sent = started.elapsed();
    let mut call = Call {
        seq,
        gateway,
        status: None,
        error: None,
        from_partner: false,
        retry_after: None,
        held_ms: None,
        sent,
        done: sent,
    };
    match request.send().await {
        Ok(response) => {
            let header = |name: &str| {
                response.headers().get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            };
            call.status = Some(response.status().as_u16());
            call.from_partner = header(partner::MARK).is_some();
            call.retry_after = header("retry-after");
            call.held_ms = header("server-timing").as_deref().and_then(server_timing_ms);
            if let Err(err) = response.bytes().await {
                call.error = Some(format!("reading the body: {err}"));
            }
        }
        Err(err) => call.error = Some(format!("{err:#}")),
    }
    call.done = started.elapsed();
    call
}

/// Workers that each call as fast as answers come, until `calls` calls
/// have been sent in all. Worker `i` goes through gateway `i % gateways`.
/// Sequence numbers are taken in the order calls are sent.
#[derive(Clone, Debug)]
pub struct Workers {
    pub workers: usize,
    pub calls: usize,
    pub path: String,
    pub account: String,
    /// Each call gives up after this long.
    pub timeout: Duration,
}

/// What a [`Workers`] run produced.
#[derive(Clone, Debug)]
pub struct Run {
    /// Every call, in order of sequence number.
    pub calls: Vec<Call>,
    /// From the first call sent to the last answer.
    pub elapsed: Duration,
}

impl Run {
    pub fn count(&self, what: impl Fn(&Call) -> bool) -> usize {
        self.calls.iter().filter(|c| what(c)).count()
    }

    /// The calls that were not served, for failure messages (at most 10).
    pub fn unserved(&self) -> Vec<&Call> {
        self.calls.iter().filter(|c| !c.served()).take(10).collect()
    }
}

impl Workers {
    pub fn run(&self, ports: &[u16]) -> anyhow::Result<Run> {
        anyhow::ensure!(!ports.is_empty(), "no gateway to call");
        let caller = Caller::new(&self.path, &self.account, self.timeout)?;
        let next = Arc::new(AtomicU64::new(0));
        let total = self.calls as u64;
        let started = Instant::now();
        let mut workers = Vec::with_capacity(self.workers);
        for worker in 0..self.workers {
            let (target, next) = (caller.target.clone(), next.clone());
            let (gateway, port) = (worker % ports.len(), ports[worker % ports.len()]);
            workers.push(caller.runtime.spawn(async move {
                let mut calls = Vec::new();
                loop {
                    let seq = next.fetch_add(1, Ordering::SeqCst);
                    if seq >= total {
                        return calls;
                    }
                    calls.push(target.call(port, gateway, seq, &[]).await);
                }
            }));
        }
        let mut calls = Vec::with_capacity(self.calls);
        for worker in workers {
            calls.extend(caller.runtime.block_on(worker).context("a worker panicked")?);
        }
        let elapsed = started.elapsed();
        calls.sort_by_key(|c| c.seq);
        Ok(Run { calls, elapsed })
    }
}

/// Commands Redis has run so far (`INFO commandstats`), not counting the
/// ones the tests use to look (INFO, KEYS, TYPE, the length queries): when
/// it grows, a gateway has done something in Redis. Redis counts the
/// commands a script runs too, so the growth is at least, not exactly, the
/// number of calls the gateways made.
pub fn activity(redis: &Redis) -> anyhow::Result<u64> {
    const LOOKING: &[&str] = &[
        "info", "ping", "scan", "type", "zcard", "llen", "scard", "hlen", "xlen", "strlen", "pttl", "ttl",
        "client", "hello", "select", "command", "zrange", "hgetall", "get", "keys",
    ];
    let mut conn = redis.connection()?;
    let info: String = redis::cmd("INFO").arg("commandstats").query(&mut conn)?;
    let mut total = 0;
    for line in info.lines() {
        let Some((name, stats)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else {
            continue;
        };
        let base = name.split('|').next().unwrap_or(name);
        if LOOKING.contains(&base) {
            continue;
        }
        let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="));
        total += calls.and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    }
    Ok(total)
}

/// Waits until [`activity`] has grown by `at_least` since `since`; false
/// after `within`.
pub fn await_activity(redis: &Redis, since: u64, at_least: u64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if activity(redis).is_ok_and(|now| now >= since + at_least) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// When the shims let policy `policy`'s calls go, in µs on Redis's clock,
/// ascending, from the log of its (exact) sliding window: a held call's
/// entry moves to its send as a shim confirms it (`lua/scripts/confirm.lua`)
/// and a refused one's is given back. A test adds a window that never binds
/// (say 1,000,000 an hour) to have this record. The policy must have one
/// key and one sliding window.
pub fn sends(redis: &Redis, policy: &str) -> anyhow::Result<Vec<u64>> {
    let mut conn = redis.connection()?;
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("sluice:{{{policy}:*}}:sw:*")).query(&mut conn)?;
    let [key] = keys.as_slice() else { anyhow::bail!("{policy}: not one sliding log: {keys:?}") };
    let log: Vec<(String, u64)> =
        redis::cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES").query(&mut conn)?;
    Ok(log.into_iter().map(|(_, at)| at).collect())
}

/// Every key matching `pattern` that is a non-empty collection (sorted
/// set, list, set, hash or stream), with its type and length: what is left
/// of waiters, reservations and leases.
pub fn leftovers(redis: &Redis, pattern: &str) -> anyhow::Result<Vec<(String, String, u64)>> {
    let mut conn = redis.connection()?;
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(&mut conn)?;
    let mut found = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn)?;
        let len_command = match kind.as_str() {
            "zset" => "ZCARD",
            "list" => "LLEN",
            "set" => "SCARD",
            "hash" => "HLEN",
            "stream" => "XLEN",
            _ => continue,
        };
        let len: u64 = redis::cmd(len_command).arg(&key).query(&mut conn)?;
        if len > 0 {
            found.push((key, kind, len));
        }
    }
    Ok(found)
}

/// Spinning processes (`sh -c 'while :; do :; done'`) at normal priority:
/// a busy gateway host. Killed (by their own ids) when dropped.
pub struct Busy(Vec<std::process::Child>);

impl Busy {
    pub fn start(n: usize) -> anyhow::Result<Busy> {
        let mut children = Vec::new();
        for _ in 0..n {
            children.push(
                std::process::Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .context("starting a busy process")?,
            );
        }
        Ok(Busy(children))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::server_timing_ms;

    #[test]
    fn server_timing() {
        assert_eq!(server_timing_ms("sluice;dur=12.5"), Some(12.5));
        assert_eq!(server_timing_ms("cdn;dur=1, sluice;desc=\"held\";dur=340"), Some(340.0));
        assert_eq!(server_timing_ms("cdn;dur=1"), None);
    }
}
