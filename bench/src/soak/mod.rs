//! The soak (`cargo xtask soak --minutes N`): steady mixed traffic through
//! Envoy (2 workers) running `sluice.wasm`, over one shim and one Redis, for
//! N minutes, with a key space that keeps growing (over a million distinct
//! keys in 20 minutes), leased mode, waiters and shedding all active (the
//! mix is in `traffic`).
//!
//! Every few seconds it samples the shim's RSS and open fds, Redis's
//! `used_memory` and DBSIZE, the pool's leases, the shim's waiters, and the
//! `api` p50 and p99 (`sample`). It passes only if each series is flat after
//! warm-up (`judge`: a fitted slope beyond the tolerance below, beyond
//! noise, fails), the bounded ones within their bounds, and if a SCAN after
//! the run finds every Sluice key with a TTL. The tolerances are stated in
//! docs/reliability.md (Soak). Writes SOAK.md and soak.png.

mod judge;
mod plot;
mod report;
mod sample;
mod traffic;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use sluice_harness::{Envoy, Redis, Shim};

use self::judge::{judge, Tolerance, Verdict};
use self::sample::{Probe, Sample, SERIES};
use self::traffic::{Traffic, MIX};

pub(crate) const PLOT: &str = "soak.png";

/// The part of the run left out of the judgement: a quarter, at least 30 s
/// (the key space fills to what its TTLs allow, the allocator and
/// connection pools settle).
fn warmup(seconds: f64) -> f64 {
    (seconds / 4.0).max(30.0)
}

/// Samples every 2 s in a run of up to 2 minutes, else every 5 s.
fn every(seconds: f64) -> Duration {
    Duration::from_secs(if seconds <= 120.0 { 2 } else { 5 })
}

/// The tolerances of each series in [`SERIES`]; the keys' bound from what
/// the TTLs allow at the fastest measured rate of fresh keys.
fn tolerances(fresh_per_s: f64) -> [Tolerance; 8] {
    let keys_bound = fresh_per_s * traffic::API_KEYS as f64 * traffic::API_TTL_S as f64 * 1.5 + 1_000.0;
    let waiters_bound = MIX.wait * traffic::WAIT_MS as f64 / 1000.0 * 1.5;
    [
        // shim RSS: MiB per hour; a rise under one MiB is never counted as growth.
        Tolerance { per_hour: 32.0, bound: None, step: 1.0 },
        // shim fds per hour.
        Tolerance { per_hour: 60.0, bound: None, step: 1.0 },
        // Redis used_memory: MiB per hour.
        Tolerance { per_hour: 32.0, bound: None, step: 1.0 },
        // Redis keys: 10% of the bound per hour, and never over the bound.
        Tolerance { per_hour: keys_bound * 0.1, bound: Some(keys_bound), step: 1.0 },
        // Pool leases: never over the pool.
        Tolerance {
            per_hour: traffic::POOL_LIMIT as f64,
            bound: Some(traffic::POOL_LIMIT as f64),
            step: 1.0,
        },
        // Waiters: never more than a wait's worth of arrivals (with slack).
        // Each partner's line moves by a waiter as calls arrive and go, on
        // its own: together they show a rise of one waiter per partner by
        // themselves.
        Tolerance {
            per_hour: waiters_bound * 0.5,
            bound: Some(waiters_bound),
            step: traffic::PARTNERS as f64,
        },
        // Latency: ms per hour.
        Tolerance { per_hour: 20.0, bound: None, step: 1.0 },
        Tolerance { per_hour: 100.0, bound: None, step: 1.0 },
    ]
}

pub(crate) struct Soak {
    pub(crate) seconds: f64,
    pub(crate) warmup: f64,
    pub(crate) samples: Vec<Sample>,
    pub(crate) verdicts: Vec<(&'static str, &'static str, Verdict)>,
    pub(crate) totals: traffic::Totals,
    /// Keys scanned after the run, and those without a TTL (a few examples).
    pub(crate) scanned: u64,
    pub(crate) without_ttl: u64,
    pub(crate) without_examples: Vec<String>,
    /// Waiters and pool leases once the traffic stopped and settled.
    pub(crate) after_waiters: f64,
    pub(crate) after_leases: f64,
    /// Envoy's leased-mode counters for the `tenants` policy: spent from leases, granted.
    pub(crate) leased: (f64, f64),
}

impl Soak {
    pub(crate) fn passed(&self) -> bool {
        self.verdicts.iter().all(|(_, _, v)| v.pass)
            && self.without_ttl == 0
            && self.after_waiters == 0.0
            && self.after_leases == 0.0
    }
}

/// Runs the soak for `seconds` and writes SOAK.md and soak.png to `dir`.
///
/// With `judge_latency` false (the quick run in `cargo xtask test`, where a
/// test never passes or fails on a timing), p50 and p99 are sampled,
/// plotted and reported, but not judged.
pub(crate) fn run(
    seconds: f64,
    judge_latency: bool,
    dir: &Path,
    font: &Path,
    about: impl FnOnce(f64) -> Vec<(&'static str, String)>,
) -> Result<()> {
    let sampler = crate::noise::Sampler::start();
    let doc = traffic::document();
    sluice_policies::parse(&doc)
        .map_err(|e| anyhow::anyhow!("the soak's policy document is refused: {e}"))?;
    let redis = Redis::start()?;
    let shim = Shim::start(&redis.url())?;
    let upstream = traffic::upstream()?;
    let envoy = Envoy::start(&doc, shim.port, upstream.port)?;
    let mut probe =
        Probe { shim_pid: shim.pid(), shim_port: shim.port, redis: redis.connection()?, pool_key: None };

    let step = every(seconds);
    eprintln!("soak: {seconds:.0} s of traffic, a sample every {} s", step.as_secs());
    let traffic = Traffic::start(envoy.port, MIX)?;
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut last = started;
    while started.elapsed().as_secs_f64() < seconds {
        std::thread::sleep(step.saturating_sub(last.elapsed()));
        let span = last.elapsed().as_secs_f64();
        last = Instant::now();
        let sample = probe.sample(started.elapsed().as_secs_f64(), traffic.take_window(), span)?;
        if samples.len() % 12 == 0 {
            eprintln!(
                "soak: {:>5.0} s  rss {:.1} MiB  fds {}  redis {:.1} MiB  keys {}  leases {}  waiters {}  p50 {:.1} ms  p99 {:.1} ms  {:.0} req/s",
                sample.at, sample.rss_mib, sample.fds, sample.redis_mib, sample.keys, sample.leases,
                sample.waiters, sample.p50_ms, sample.p99_ms, sample.rate
            );
        }
        samples.push(sample);
    }
    let totals = traffic.stop();
    let ran = started.elapsed().as_secs_f64();
    // What is left once the traffic stopped: every waiter answered, every lease released.
    std::thread::sleep(Duration::from_secs(2));
    let after = probe.sample(ran, Default::default(), 1.0)?;
    let page = sluice_harness::gateway::prometheus(&envoy)?;
    let stat =
        |name: &str| sluice_harness::gateway::sample(&page, &format!(r#"sluice_{name}{{policy="tenants"}}"#));
    let leased = (stat("leased"), stat("lease_granted"));
    let (scanned, without_ttl, without_examples) = sample::ttl_scan(&mut probe.redis)?;

    let warm = warmup(seconds);
    // The keys alive at a moment are those of the last TTL, so their bound
    // follows the fastest the traffic went, not the run's average: a busy
    // machine slows the load for minutes, and the key count follows it.
    let answered_per_s = samples.iter().map(|s| s.rate).filter(|r| r.is_finite());
    let (peak, mean, n) =
        answered_per_s.fold((0.0_f64, 0.0_f64, 0.0_f64), |(p, m, n), r| (p.max(r), m + r, n + 1.0));
    let peak_over_mean = if n > 0.0 && mean > 0.0 { (peak / (mean / n)).max(1.0) } else { 1.0 };
    let fresh_per_s = totals.fresh as f64 / ran * peak_over_mean;
    let verdicts = SERIES
        .iter()
        .zip(tolerances(fresh_per_s))
        .map(|((name, unit, value), tol)| {
            let points: Vec<(f64, f64)> = samples.iter().map(|s| (s.at, value(s))).collect();
            let mut verdict = judge(&points, warm, tol);
            if *unit == "ms" && !judge_latency {
                verdict.pass = true;
                verdict.why = format!("not judged in a quick run (a timing): {}", verdict.why);
            }
            (*name, *unit, verdict)
        })
        .collect();
    let soak = Soak {
        seconds: ran,
        warmup: warm,
        samples,
        verdicts,
        totals,
        scanned,
        without_ttl,
        without_examples,
        after_waiters: after.waiters,
        after_leases: after.leases,
        leased,
    };
    drop(envoy);
    let noise = sampler.finish();
    let about = about(ran);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    plot::draw(&dir.join(PLOT), font, &soak)?;
    let md = dir.join("SOAK.md");
    std::fs::write(&md, report::markdown(&soak, &about, &noise))
        .with_context(|| format!("writing {}", md.display()))?;
    eprintln!("soak: wrote {} and {PLOT}", md.display());
    eprintln!("{}", report::table(&soak));
    if !soak.passed() {
        bail!("the soak failed: see {}", md.display());
    }
    Ok(())
}
