//! SOAK.md: the run's header, the verdict of each series, the traffic's
//! outcomes, and the TTL scan.

use std::fmt::Write;

use super::traffic::{Class, MIX};
use super::{Soak, PLOT};
use crate::noise::Noise;

pub(crate) fn markdown(soak: &Soak, about: &[(&'static str, String)], noise: &Noise) -> String {
    let mut md = String::new();
    let _ = write_all(&mut md, soak, about, noise);
    md
}

fn write_all(md: &mut String, s: &Soak, about: &[(&'static str, String)], noise: &Noise) -> std::fmt::Result {
    let verdict = if s.passed() { "passed" } else { "FAILED" };
    writeln!(md, "# Sluice soak: {:.0} minutes, {verdict}\n", s.seconds / 60.0)?;
    writeln!(
        md,
        "Written by `cargo xtask soak --minutes N` (`bench/src/soak/`); what it checks and the \
         tolerances: [docs/reliability.md](../../docs/reliability.md#soak).\n"
    )?;
    writeln!(
        md,
        "- took {:.0} s of traffic; warm-up (not judged) {:.0} s; {} samples",
        s.seconds,
        s.warmup,
        s.samples.len()
    )?;
    for (what, value) in about {
        writeln!(md, "- {what}: {value}")?;
    }
    crate::report::noise(md, noise)?;
    writeln!(
        md,
        "- setup: one Envoy (2 workers) running `sluice.wasm`, one shim, one Redis, an in-process upstream; \
         offered {:.0} requests/s: api {:.0}, lease {:.0}, wait {:.0}, pool {:.0}\n",
        MIX.api + MIX.lease + MIX.wait + MIX.pool,
        MIX.api,
        MIX.lease,
        MIX.wait,
        MIX.pool
    )?;
    writeln!(md, "![the soak's series]({PLOT})\n")?;
    writeln!(md, "## Flat after warm-up\n")?;
    md.push_str(&table(s));
    writeln!(md)?;
    writeln!(md, "## Traffic\n")?;
    let t = &s.totals;
    writeln!(
        md,
        "{} requests answered; {} distinct rate-limit keys sent ({} fresh `api` requests, {} keys each); \
         {} answered by a failure mode or not at all; ticks skipped because a class had too many in flight: {}.\n",
        Class::ALL.iter().map(|c| t.of(*c)).sum::<u64>(),
        t.distinct_keys(),
        t.fresh,
        super::traffic::API_KEYS,
        t.failures(),
        t.skipped.values().sum::<u64>(),
    )?;
    writeln!(md, "| class | outcome (status, verdict) | requests |\n|---|---|---:|")?;
    for ((class, outcome), n) in &t.outcomes {
        writeln!(md, "| {} | {outcome} | {n} |", class.name())?;
    }
    writeln!(
        md,
        "\nLeased mode (`tenants`): {:.0} requests admitted from leases, {:.0} tokens granted (Envoy's counters).\n",
        s.leased.0, s.leased.1
    )?;
    writeln!(md, "## After the run\n")?;
    writeln!(
        md,
        "- SCAN of every `sluice:*` key: {} keys, {} without a TTL{}",
        s.scanned,
        s.without_ttl,
        if s.without_examples.is_empty() {
            String::new()
        } else {
            format!(" (e.g. {:?})", s.without_examples)
        }
    )?;
    writeln!(
        md,
        "- 2 s after the traffic stopped: {} waiters held, {} pool leases held (both must be 0)",
        s.after_waiters, s.after_leases
    )
}

/// The verdicts as a Markdown table.
pub(crate) fn table(s: &Soak) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| series | unit | samples judged | first | last | mean | max | slope /h | slope /h, 95% low | tolerance /h | bound | verdict |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for (name, unit, v) in &s.verdicts {
        let bound = v.tolerance.bound.map_or("—".to_string(), |b| format!("{b:.0}"));
        let _ = writeln!(
            md,
            "| {name} | {unit} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.1} | {bound} | {} {} |",
            v.samples,
            v.first,
            v.last,
            v.mean,
            v.max,
            v.slope_per_hour,
            v.slope_low_per_hour,
            v.tolerance.per_hour,
            if v.pass { "pass:" } else { "FAIL:" },
            v.why
        );
    }
    md
}
