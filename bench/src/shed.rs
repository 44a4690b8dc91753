//! Scenario 6, load shedding (S4d): the mock service of `overloaded`,
//! overloaded by the class mix of `shed_load` through real Envoy with
//! `sluice.wasm`, the shim and Redis, once with the utilization shedder on
//! and once with it off, one run after the other with the same load.
//!
//! Each run offers the overload phase, then a calm phase in which the
//! shedding recovers. Both runs' documents have the same classes and the
//! same never-reached limit (so the filter does the same work); only the
//! first has `shed`, reading the upstream's ORCA report, with the
//! controller's timings scaled down (`DELAY`, `RAMP`, `RECOVERY`).
//!
//! While a run goes, a sampler reads Envoy's `sluice_class_shed_permille`
//! gauges and the upstream's utilization every `SAMPLE_EVERY`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use sluice_harness::gateway::{prometheus, sample, send};
use sluice_harness::{Envoy, Redis, Shim};

use super::overloaded::Overloaded;
use super::plan;
use super::shed_load::{self, Answer, Sent, CLASSES};

/// The controller's timings, scaled down from the scenario's 28 s, 92 s
/// and 180 s so that a run takes well under a minute.
pub(crate) const DELAY: &str = "2s";
pub(crate) const RAMP: &str = "6s";
pub(crate) const RECOVERY: &str = "6s";
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

pub(crate) struct Shedding {
    pub(crate) plan: plan::Shed,
    /// Shedder on, then off.
    pub(crate) runs: [Run; 2],
}

pub(crate) struct Run {
    pub(crate) sent: Vec<Sent>,
    pub(crate) samples: Vec<Sample>,
}

/// One look at the gateway and the upstream, `at` from the run's start.
pub(crate) struct Sample {
    pub(crate) at: Duration,
    /// Per class, the fraction Envoy says it sheds now, 0 to 1.
    pub(crate) shed: [f64; 3],
    pub(crate) utilization: f64,
}

/// One class's requests due in the overload phase, by answer.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) offered: usize,
    pub(crate) served: usize,
    pub(crate) shed: usize,
    pub(crate) refused: usize,
    pub(crate) failed: usize,
}

pub(crate) fn run(plan: &plan::Shed) -> Result<Shedding> {
    let redis = Redis::start()?;
    let shim = Shim::start(&redis.url())?;
    eprintln!(
        "bench: shedding: {} slots of {} ms ({:.0} requests/s at most), {} offered for {} s, then {} for {} s",
        plan.slots,
        plan.work.as_millis(),
        plan.capacity(),
        plan.overload_rate,
        plan.overload.as_secs(),
        plan.calm_rate,
        plan.calm.as_secs()
    );
    let on = one_run(plan, &shim, true)?;
    let off = one_run(plan, &shim, false)?;
    Ok(Shedding { plan: plan.clone(), runs: [on, off] })
}

fn one_run(plan: &plan::Shed, shim: &Shim, shedder: bool) -> Result<Run> {
    let upstream = Overloaded::start(plan.slots, plan.work, plan.queue)?;
    let envoy = Envoy::start(&document(shedder), shim.port, upstream.port)?;
    for class in &CLASSES {
        let reply = send(envoy.port, "GET", &format!("{}warm-up", class.path), &[])?;
        ensure!(reply.status == 200, "the warm-up request got {}: {}", reply.status, reply.body);
    }
    let phases = [(plan.overload_rate, plan.overload), (plan.calm_rate, plan.calm)];
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let (sent, samples) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| watch(&envoy, &upstream, start, &stop));
        let sent = shed_load::drive(envoy.port, start, &phases);
        stop.store(true, Ordering::SeqCst);
        (sent, sampler.join().unwrap_or_default())
    });
    let run = Run { sent: sent?, samples };
    for (i, class) in CLASSES.iter().enumerate() {
        let t = run.tally(plan, i);
        eprintln!(
            "bench:   shedder {}: {}: offered {}, served {}, shed {}, refused by the upstream {}, failed {}",
            if shedder { "on" } else { "off" },
            class.name,
            t.offered,
            t.served,
            t.shed,
            t.refused,
            t.failed
        );
    }
    Ok(run)
}

/// Samples until `stop`.
fn watch(envoy: &Envoy, upstream: &Overloaded, start: Instant, stop: &AtomicBool) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut next = start;
    while !stop.load(Ordering::SeqCst) {
        let page = prometheus(envoy).unwrap_or_default();
        let gauge = |class: &str| sample(&page, &format!("sluice_class_shed_permille{{class=\"{class}\"}}"));
        samples.push(Sample {
            at: start.elapsed(),
            shed: [0, 1, 2].map(|i| gauge(CLASSES[i].name) / 1000.0),
            utilization: upstream.utilization(),
        });
        next += SAMPLE_EVERY;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    samples
}

impl Run {
    /// The requests of class `class` due in the overload phase.
    fn overload<'a>(&'a self, plan: &plan::Shed, class: usize) -> impl Iterator<Item = &'a Sent> {
        let end = plan.overload;
        self.sent.iter().filter(move |s| s.class == class && s.due < end)
    }

    pub(crate) fn tally(&self, plan: &plan::Shed, class: usize) -> Tally {
        let mut t = Tally::default();
        for s in self.overload(plan, class) {
            t.offered += 1;
            match s.answer {
                Answer::Served => t.served += 1,
                Answer::Shed => t.shed += 1,
                Answer::Refused => t.refused += 1,
                Answer::Failed => t.failed += 1,
            }
        }
        t
    }

    /// The `p` quantile (0 to 1) of the latency of `class`'s served
    /// requests due in the overload phase from `from` on, in ms; None if
    /// none was served.
    pub(crate) fn served_latency(
        &self,
        plan: &plan::Shed,
        class: usize,
        from: Duration,
        p: f64,
    ) -> Option<f64> {
        let served = self.overload(plan, class).filter(|s| s.answer == Answer::Served && s.due >= from);
        quantile(served.map(|s| s.latency.as_secs_f64() * 1000.0).collect(), p)
    }

    /// The p50 latency in ms of `class`'s served requests due in each
    /// second of the run (every phase): (the second's middle, p50).
    pub(crate) fn latency_by_second(&self, class: usize) -> Vec<(f64, f64)> {
        let last = self.sent.iter().map(|s| s.due.as_secs()).max().unwrap_or(0);
        (0..=last)
            .filter_map(|second| {
                let due = self
                    .sent
                    .iter()
                    .filter(|s| s.class == class && s.answer == Answer::Served && s.due.as_secs() == second);
                let p50 = quantile(due.map(|s| s.latency.as_secs_f64() * 1000.0).collect(), 0.5)?;
                Some((second as f64 + 0.5, p50))
            })
            .collect()
    }
}

fn quantile(mut values: Vec<f64>, p: f64) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let last = values.len().checked_sub(1)?;
    values.get((last as f64 * p).round() as usize).copied()
}

/// The classes of `shed_load`, one policy with a limit never reached (so
/// each admitted request costs one shim call, on both runs), and with the
/// shedder on, `shed` reading the upstream's ORCA report.
fn document(shedder: bool) -> String {
    let classes: Vec<String> = CLASSES
        .iter()
        .enumerate()
        .map(|(i, c)| match i + 1 < CLASSES.len() {
            true => format!(r#"{{"name": "{}", "match": {{"path_prefix": "{}"}}}}"#, c.name, c.path),
            false => format!(r#"{{"name": "{}"}}"#, c.name),
        })
        .collect();
    let shed = if shedder {
        format!(
            r#""shed": {{"signal": {{"orca": "cpu_utilization"}},
                "controller": {{"delay": "{DELAY}", "ramp": "{RAMP}", "recovery": "{RECOVERY}"}}}},"#
        )
    } else {
        String::new()
    };
    format!(
        r#"{{"shim": {{"timeout_ms": 1000}}, "failure_mode": "deny", "classes": [{}],
            "policies": [{{"name": "service", {shed}
                "limits": [{{"type": "fixed_window", "limit": 1000000000, "window": "1s"}}]}}]}}"#,
        classes.join(", ")
    )
}
