//! Scenario 6's section of the report: what ran, each class's fate with
//! the shedder on and off, the critical class's latency, when the shedding
//! started and ended, and the plot. Shared by `SHED.md` (`--shed`) and
//! `LATEST.md`. Nothing here judges a number.

use std::fmt::Write;
use std::time::Duration;

use super::shed::{Run, Shedding, DELAY, RAMP, RECOVERY};
use super::shed_load::CLASSES;

pub(crate) fn section(md: &mut String, s: &Shedding, plot_file: &str) -> std::fmt::Result {
    let p = &s.plan;
    let [on, off] = &s.runs;
    writeln!(md, "\n## 6. Load shedding\n")?;
    writeln!(
        md,
        "A mock service with {} slots of {} ms each ({:.0} requests/s at most) and a queue of {} \
         (beyond it, it answers 503 at once) reports its utilization (requests inside over slots, \
         capped at 1) in the ORCA header `endpoint-load-metrics`. An open-loop mix of classes \
         ({}) is offered at {} requests/s ({:.1}× its capacity) for {} s, then at {} requests/s for \
         {} s, through one Envoy (2 workers) with `sluice.wasm`, the shim and Redis. Shedder on: the \
         policy's `shed` reads `{{\"orca\": \"cpu_utilization\"}}`, high 0.8, low 0.7, with timings \
         scaled down to delay {DELAY}, ramp {RAMP}, recovery {RECOVERY} (the defaults are 28 s, 92 s, \
         180 s). Shedder off: the same document without `shed`. Same load, one run after the other. \
         Reproduce with `cargo xtask bench --shed`.\n",
        p.slots,
        p.work.as_millis(),
        p.capacity(),
        p.queue,
        CLASSES.iter().map(|c| format!("{} {} %", c.name, c.per_ten * 10)).collect::<Vec<_>>().join(", "),
        p.overload_rate,
        f64::from(p.overload_rate) / p.capacity(),
        p.overload.as_secs(),
        p.calm_rate,
        p.calm.as_secs()
    )?;
    writeln!(
        md,
        "Requests due in the overload phase, as shares of those offered: admitted (200 from the \
         service), shed (Sluice's 503), refused by the service (its queue was full), failed \
         (anything else).\n"
    )?;
    writeln!(md, "| class | offered | on: admitted | on: shed | on: refused | on: failed | off: admitted | off: shed | off: refused | off: failed |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for (i, class) in CLASSES.iter().enumerate() {
        write!(md, "| {} | {} |", class.name, on.tally(p, i).offered)?;
        for run in [on, off] {
            let t = run.tally(p, i);
            let share = |n: usize| format!("{:.1} %", 100.0 * n as f64 / t.offered.max(1) as f64);
            write!(
                md,
                " {} | {} | {} | {} |",
                share(t.served),
                share(t.shed),
                share(t.refused),
                share(t.failed)
            )?;
        }
        writeln!(md)?;
    }
    if on.tally(p, 0).offered != off.tally(p, 0).offered {
        writeln!(md, "\n(\"offered\" is the shedder-on run's; the other run's differs slightly.)")?;
    }

    writeln!(
        md,
        "\nThe critical class's latency in ms, from each request's scheduled time, of its served \
         requests due in the whole overload phase (the first seconds, before the shedding drains the \
         queue, included) and in its second half:\n"
    )?;
    writeln!(md, "| | shedder on | shedder off | off ÷ on |")?;
    writeln!(md, "|---|---:|---:|---:|")?;
    let half = p.overload / 2;
    for (name, from, q) in [
        ("p50, whole overload", Duration::ZERO, 0.5),
        ("p99, whole overload", Duration::ZERO, 0.99),
        ("p50, second half", half, 0.5),
        ("p99, second half", half, 0.99),
    ] {
        let (a, b) = (on.served_latency(p, 0, from, q), off.served_latency(p, 0, from, q));
        let ms = |v: Option<f64>| v.map_or("none served".to_string(), |v| format!("{v:.1}"));
        let ratio = match (a, b) {
            (Some(a), Some(b)) if a > 0.0 => format!("{:.1}×", b / a),
            _ => "n/a".to_string(),
        };
        writeln!(md, "| {name} | {} | {} | {ratio} |", ms(a), ms(b))?;
    }

    writeln!(md, "\nWith the shedder on, from Envoy's `sluice_class_shed_permille` gauges (sampled every 250 ms, seconds from the start of the load):\n")?;
    writeln!(
        md,
        "| class | first shed | most shed | mean shed, last half of the overload | nothing shed again |"
    )?;
    writeln!(md, "|---|---:|---:|---:|---:|")?;
    for (i, class) in CLASSES.iter().enumerate() {
        let t = timeline(on, i, p.overload.as_secs_f64());
        let at = |v: Option<f64>| v.map_or("never".to_string(), |v| format!("{v:.2} s"));
        writeln!(
            md,
            "| {} | {} | {:.1} % | {:.1} % | {} |",
            class.name,
            at(t.first),
            100.0 * t.most,
            100.0 * t.settled,
            if t.first.is_none() { "n/a".to_string() } else { at(t.cleared) }
        )?;
    }
    writeln!(md, "\n![shed fraction over time, critical latency]({plot_file})")
}

struct Timeline {
    first: Option<f64>,
    most: f64,
    /// The mean over the overload phase's second half.
    settled: f64,
    /// After the overload phase, the first sample shedding none.
    cleared: Option<f64>,
}

fn timeline(run: &Run, class: usize, overload: f64) -> Timeline {
    let points: Vec<(f64, f64)> = run.samples.iter().map(|s| (s.at.as_secs_f64(), s.shed[class])).collect();
    let late: Vec<f64> =
        points.iter().filter(|(t, _)| *t >= overload / 2.0 && *t < overload).map(|(_, f)| *f).collect();
    Timeline {
        first: points.iter().find(|(_, f)| *f > 0.0).map(|(t, _)| *t),
        most: points.iter().map(|(_, f)| *f).fold(0.0, f64::max),
        settled: late.iter().sum::<f64>() / late.len().max(1) as f64,
        cleared: points.iter().find(|(t, f)| *t >= overload && *f == 0.0).map(|(t, _)| *t),
    }
}
