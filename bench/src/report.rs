//! `LATEST.md`: what ran, how noisy the machine was, every scenario's table,
//! and the targets as ratios with how far each is from its mark. The targets
//! are reported, never enforced: nothing here fails on a number.

use std::fmt::Write;

use super::gateway::Gateway;
use super::load::{Run, P50, P99, P999};
use super::noise::Noise;
use super::plan::Plan;
use super::ratio::{fig, goal, rps};
use super::scale::Outcome;
use super::setups::Setup;
use super::shed_report;
use super::shim_alone::ShimAlone;

/// Everything one bench run measured.
pub(crate) struct Results {
    pub(crate) plan: Plan,
    pub(crate) about: Vec<(&'static str, String)>,
    pub(crate) noise: Noise,
    pub(crate) seconds: f64,
    pub(crate) gateway: Gateway,
    pub(crate) shim: ShimAlone,
    pub(crate) scale: Vec<(&'static str, Outcome)>,
    pub(crate) cost: Vec<super::redis_cost::Cost>,
    pub(crate) egress: Vec<super::egress::Scenario>,
    pub(crate) shed: super::shed::Shedding,
    pub(crate) budget: super::budget::Budget,
}

/// Flat means: the largest key count's mean latency within this factor of the
/// smallest's. The mean, because redis-benchmark's percentiles come in 8 µs
/// steps, too coarse for a ratio of ~0.1 ms figures.
const FLAT: f64 = 1.2;

pub(crate) fn markdown(r: &Results, plot_file: &str, shed_plot_file: &str) -> String {
    let mut md = String::new();
    let _ = write_all(&mut md, r, plot_file)
        .and_then(|()| shed_report::section(&mut md, &r.shed, shed_plot_file));
    md
}

fn write_all(md: &mut String, r: &Results, plot_file: &str) -> std::fmt::Result {
    header(md, "latest run", &r.plan, &r.about, &r.noise, r.seconds)?;
    gateway(md, r, plot_file)?;
    super::goals::section(md, &r.gateway, &r.shim, &r.budget, &r.egress)?;
    targets(md, r)?;
    writeln!(md, "\n### One decision's CPU, part by part\n")?;
    write!(md, "{}", super::budget::markdown(&r.budget))?;
    shim(md, &r.shim)?;
    writeln!(md, "\n## 3. Redis cost per limit type\n")?;
    writeln!(md, "The script call's `usec_per_call` (INFO commandstats: FCALL as the shim runs it, EVALSHA for the rows that say so) and MEMORY USAGE per client key, each case on its allow path in one Redis:\n")?;
    write!(md, "{}", super::redis_cost::table(&r.cost))?;
    scale(md, &r.scale)?;
    egress(md, &r.egress)
}

fn egress(md: &mut String, scenarios: &[super::egress::Scenario]) -> std::fmt::Result {
    writeln!(md, "\n## 5. Egress waits\n")?;
    writeln!(
        md,
        "Workers call a mock partner that enforces its limits exactly on arrival and answers 429 beyond \
         them: through Sluice with `wait` (one gateway), or straight to the partner with a hand-written \
         limiter. \"unserved\": refused by the gateway or given up. \"span\": first to last admitted call \
         at the partner; \"÷ least\": the span over the least the partner's limits allow. Redis commands: \
         what clients sent (MONITOR), per served call.\n"
    )?;
    for s in scenarios {
        let p = &s.plan;
        let concurrency = p.limits.concurrency.is_some();
        let interval = p.limits.interval.is_some();
        let mut limits: Vec<String> =
            p.limits.windows.iter().map(|w| format!("{} per {} ms", w.limit, w.window.as_millis())).collect();
        if let Some(every) = p.limits.interval {
            limits.push(format!("one per {} ms", every.as_millis()));
        }
        if let Some(max) = p.limits.concurrency {
            limits.push(format!("{max} in flight, {} ms per call", p.delay.as_millis()));
        }
        writeln!(
            md,
            "### {}: {} workers, {} calls; the partner allows {} (least span {:.2} s)\n",
            p.scenario,
            p.workers,
            p.calls,
            limits.join(" and "),
            s.fastest.as_secs_f64()
        )?;
        write!(
            md,
            "| approach | served | unserved | partner 429s | time s | span s | ÷ least | Redis cmds/call |"
        )?;
        if interval {
            write!(md, " min gap ms | mean gap ms |")?;
        }
        if concurrency {
            write!(md, " most in flight | freed slot empty p50 ms | p99 ms |")?;
        }
        writeln!(md)?;
        write!(md, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
        if interval {
            write!(md, "---:|---:|")?;
        }
        if concurrency {
            write!(md, "---:|---:|---:|")?;
        }
        writeln!(md)?;
        let ms = |d: Option<std::time::Duration>| {
            d.map_or("–".to_string(), |d| format!("{:.1}", d.as_secs_f64() * 1e3))
        };
        for a in &s.approaches {
            let n = match &a.outcome {
                Ok(n) => n,
                Err(why) => {
                    // The first clause is enough in a table; the bench's log has it all.
                    let why = why.lines().next().unwrap_or("").split(", expected").next().unwrap_or("");
                    let why = why.replace('|', "/");
                    writeln!(md, "| {} | not measured: {why} | | | | | | |", a.approach)?;
                    continue;
                }
            };
            let ratio = if n.stopped {
                "stopped at its budget".to_string()
            } else if s.fastest.is_zero() {
                "–".to_string()
            } else {
                format!("{:.3}×", n.span.as_secs_f64() / s.fastest.as_secs_f64())
            };
            write!(
                md,
                "| {} | {} | {} | {} | {:.2} | {:.2} | {ratio} | {:.2} |",
                a.approach,
                n.served,
                n.unserved,
                n.partner_429,
                n.elapsed.as_secs_f64(),
                n.span.as_secs_f64(),
                n.redis_per_call
            )?;
            if interval {
                write!(md, " {} | {} |", ms(n.min_gap), ms(n.mean_gap))?;
            }
            if concurrency {
                write!(
                    md,
                    " {} | {} | {} |",
                    n.max_in_flight,
                    ms(n.handoff.map(|h| h.0)),
                    ms(n.handoff.map(|h| h.1))
                )?;
            }
            writeln!(md)?;
        }
        if p.feedback {
            writeln!(
                md,
                "\nEach worker sends its next call only after its last answer, so at most {} calls are on \
                 their way when the partner's first 429 comes back: the most 429s feedback should let \
                 through.",
                p.workers
            )?;
        }
        writeln!(md)?;
    }
    Ok(())
}

/// `cargo xtask bench --egress`: scenario 5 alone.
pub(crate) fn egress_markdown(
    plan: &Plan,
    about: &[(&'static str, String)],
    noise: &Noise,
    seconds: f64,
    scenarios: &[super::egress::Scenario],
) -> String {
    let mut md = String::new();
    let only = if plan.egress.iter().all(|e| e.feedback) {
        "the upstream feedback case only (`--feedback`)"
    } else {
        "egress waits only (`--egress`)"
    };
    let _ = header(&mut md, only, plan, about, noise, seconds).and_then(|()| egress(&mut md, scenarios));
    md
}

/// `cargo xtask bench --shed`: scenario 6 alone (the full run writes it too).
pub(crate) fn shed_markdown(
    plan: &Plan,
    about: &[(&'static str, String)],
    noise: &Noise,
    seconds: f64,
    shedding: &super::shed::Shedding,
    plot_file: &str,
) -> String {
    let mut md = String::new();
    let _ = header(&mut md, "load shedding (`--shed`)", plan, about, noise, seconds)
        .and_then(|()| shed_report::section(&mut md, shedding, plot_file));
    md
}

/// A page of one part run alone (`--leased`, `--budget`): the run's header, then `body`.
pub(crate) fn page(
    title: &str,
    plan: &Plan,
    about: &[(&'static str, String)],
    noise: &Noise,
    seconds: f64,
    body: &str,
) -> String {
    let mut md = String::new();
    let _ = header(&mut md, title, plan, about, noise, seconds);
    md.push('\n');
    md.push_str(body);
    md
}

fn header(
    md: &mut String,
    title: &str,
    plan: &Plan,
    about: &[(&'static str, String)],
    n: &Noise,
    seconds: f64,
) -> std::fmt::Result {
    let mode = if plan.quick { "quick (a smoke run: its numbers mean little)" } else { "full" };
    writeln!(md, "# Sluice bench: {title}\n")?;
    writeln!(md, "Written by `cargo xtask bench`; see `bench/README.md` for what each scenario measures.\n")?;
    writeln!(md, "- mode: {mode}; took {seconds:.0} s")?;
    for (what, value) in about {
        writeln!(md, "- {what}: {value}")?;
    }
    noise(md, n)
}

pub(crate) fn noise(md: &mut String, n: &Noise) -> std::fmt::Result {
    writeln!(
        md,
        "- machine noise: 1-minute load average {:.2} at the start, {:.2} at its highest; other \
         compiler processes seen in {} of {} samples (up to {} at once)",
        n.first_load, n.max_load, n.busy_samples, n.samples, n.most_compilers
    )?;
    if n.busy_samples > 0 {
        writeln!(
            md,
            "\n**Other compiles ran during this run.** The setups were interleaved so the noise hits \
             them all, but treat the numbers as rough and rerun on a quiet machine before relying on them."
        )?;
    }
    Ok(())
}

fn gateway(md: &mut String, r: &Results, plot_file: &str) -> std::fmt::Result {
    let g = &r.gateway;
    writeln!(md, "\n## 1. Gateway overhead\n")?;
    writeln!(
        md,
        "One Envoy per setup and worker count, the same upstream and load: oha with one thread and {} \
         connections, fixed rates with latency correction. Every setup at {} Envoy worker(s), all in one \
         run: each round visits every (workers, setup) pair in a rotating order. Each figure is the median \
         of {} round(s). Latencies in ms.\n",
        r.plan.connections,
        g.matrices.iter().map(|m| m.workers.to_string()).collect::<Vec<_>>().join(" and "),
        r.plan.rounds
    )?;
    if let Some(why) = &g.skipped {
        writeln!(
            md,
            "**Not measured:** the setups on Sluice's RLS and RLQS faces ((h), (h'), (j), (k)): {why}.\n"
        )?;
    }
    for m in &g.matrices {
        writeln!(md, "### {} Envoy worker(s)\n", m.workers)?;
        write!(md, "| setup | status |")?;
        for (rate, _) in &m.fixed {
            write!(md, " {rate}/s p50 | p99 | p99.9 |")?;
        }
        writeln!(md, " max req/s | other status |")?;
        write!(md, "|---|---|")?;
        for _ in &m.fixed {
            write!(md, "---:|---:|---:|")?;
        }
        writeln!(md, "---:|---:|")?;
        for &setup in &g.setups {
            write!(md, "| {} | {} |", setup.label(), setup.expected_status())?;
            let mut other = 0;
            for (i, _) in m.fixed.iter().enumerate() {
                if let Some(run) = m.at(i, setup) {
                    write!(md, " {:.2} | {:.2} | {:.2} |", run.p50, run.p99, run.p999)?;
                    other += run.other_than(setup.expected_status());
                }
            }
            if let Some(max) = m.max_of(setup) {
                other += max.other_than(setup.expected_status());
                writeln!(md, " {:.0} | {other} |", max.rate_of(setup.expected_status()))?;
            }
        }
        writeln!(md)?;
    }
    writeln!(
        md,
        "\"other status\": responses (or failures) that were not the setup's expected status, over all its runs. \
         \"max req/s\" counts the expected status only: the closed loop's median rate times that status's share of its answers.\n"
    )?;
    load_share(md, g)?;
    writeln!(md, "\n![latency percentiles per setup, one Envoy worker]({plot_file})")
}

/// How the load generator shares the two cores: oha's own CPU, in cores.
fn load_share(md: &mut String, g: &Gateway) -> std::fmt::Result {
    let cpu = |runs: Vec<&Run>| super::load::median(runs.iter().map(|r| r.load_cpu));
    write!(
        md,
        "**The load generator's share of the cores.** oha runs on the same machine with one worker thread \
         (`--worker-threads 1`): its CPU (user and system, from `getrusage`), in cores, median over the setups:"
    )?;
    for m in &g.matrices {
        let fixed: Vec<String> = m
            .fixed
            .iter()
            .map(|(rate, runs)| format!("{:.2} at {rate}/s", cpu(runs.iter().map(|(_, r)| r).collect())))
            .collect();
        let max = cpu(m.max.iter().map(|(_, r)| r).collect());
        write!(md, " {} worker(s): {}, {max:.2} at max req/s;", m.workers, fixed.join(", "))?;
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    writeln!(
        md,
        " of {cores} cores. So with two Envoy workers at max req/s, Envoy, oha, the shim (or RLS server) \
         and Redis compete for the same cores, and max req/s measures the whole machine, not Envoy alone."
    )
}

fn targets(md: &mut String, r: &Results) -> std::fmt::Result {
    let g = &r.gateway;
    writeln!(md, "\n## Earlier goals\n")?;
    writeln!(
        md,
        "The earlier waves' goals, kept as guards against a regression: ratios within this run, \
         reported, never enforced.\n"
    )?;
    writeln!(md, "| goal | measure | value | target | verdict |")?;
    writeln!(md, "|---|---|---:|---:|---|")?;
    for m in &g.matrices {
        let w = m.workers;
        for (i, (rate, _)) in m.fixed.iter().enumerate() {
            for (name, pct) in [P50, P99] {
                let base = fig(m, i, Setup::Plain, pct);
                let sluice = fig(m, i, Setup::SluiceAllow, pct) - base;
                let floor = fig(m, i, Setup::Floor, pct) - base;
                let what = format!(
                    "{w}w, {name} at {rate}/s: allow adds (d)−(a) {sluice:.2} ms ÷ the floor's (c)−(a) {floor:.2} ms"
                );
                // A difference at or below zero is noise, not a ratio.
                let ratio = if sluice > 0.0 && floor > 0.0 { sluice / floor } else { f64::NAN };
                goal(md, "added", &what, ratio, 1.3, true)?;
            }
        }
        goal(
            md,
            "req/s",
            &format!("{w}w, max req/s: allow (d) ÷ the peer (g)"),
            rps(m, Setup::SluiceAllow) / rps(m, Setup::RlsPeerAllow),
            1.5,
            false,
        )?;
        goal(
            md,
            "req/s",
            &format!("{w}w, max req/s: allow (d) ÷ the callout floor (c)"),
            rps(m, Setup::SluiceAllow) / rps(m, Setup::Floor),
            0.9,
            false,
        )?;
        for (i, (rate, _)) in m.fixed.iter().enumerate() {
            let p50 = |s: Setup| fig(m, i, s, |r| r.p50);
            goal(
                md,
                "deny",
                &format!("{w}w, p50 at {rate}/s: deny (e) ÷ Wasm deny floor (f)"),
                p50(Setup::SluiceDeny) / p50(Setup::DenyFloor),
                1.1,
                true,
            )?;
            goal(
                md,
                "deny",
                &format!("{w}w, p50 at {rate}/s: deny (e) ÷ native deny (b')"),
                p50(Setup::SluiceDeny) / p50(Setup::NativeDeny),
                1.2,
                true,
            )?;
        }
        goal(
            md,
            "deny",
            &format!("{w}w, max req/s: Wasm deny floor (f) ÷ deny (e)"),
            rps(m, Setup::DenyFloor) / rps(m, Setup::SluiceDeny),
            1.1,
            true,
        )?;
        goal(
            md,
            "deny",
            &format!("{w}w, max req/s: native deny (b') ÷ deny (e)"),
            rps(m, Setup::NativeDeny) / rps(m, Setup::SluiceDeny),
            1.2,
            true,
        )?;
        let mut worst: Option<(f64, String)> = None;
        for (i, (rate, _)) in m.fixed.iter().enumerate() {
            for (name, pct) in [P50, P99, P999] {
                let ratio = fig(m, i, Setup::SluiceLeased, pct) / fig(m, i, Setup::NativeAllow, pct);
                if ratio.is_finite() && worst.as_ref().is_none_or(|(v, _)| ratio > *v) {
                    worst = Some((ratio, format!("{name} at {rate}/s")));
                }
            }
        }
        if let Some((ratio, at)) = worst {
            goal(
                md,
                "leased",
                &format!("{w}w, leased (d'') ÷ native (b), the worst rate and percentile ({at})"),
                ratio,
                1.2,
                true,
            )?;
        }
        goal(
            md,
            "leased",
            &format!("{w}w, max req/s: native (b) ÷ leased (d'')"),
            rps(m, Setup::NativeAllow) / rps(m, Setup::SluiceLeased),
            1.2,
            true,
        )?;
        if g.skipped.is_none() {
            goal(
                md,
                "RLS",
                &format!("{w}w, max req/s: Sluice RLS (h) ÷ the peer (g)"),
                rps(m, Setup::RlsSluiceAllow) / rps(m, Setup::RlsPeerAllow),
                1.5,
                false,
            )?;
            for (i, (rate, _)) in m.fixed.iter().enumerate() {
                let p50 = |s: Setup| fig(m, i, s, |r| r.p50);
                goal(
                    md,
                    "RLS",
                    &format!("{w}w, p50 at {rate}/s: RLS deny (h') ÷ the filter's deny (e)"),
                    p50(Setup::RlsSluiceDeny) / p50(Setup::SluiceDeny),
                    1.0,
                    true,
                )?;
                goal(
                    md,
                    "RLQS",
                    &format!("{w}w, p50 at {rate}/s: RLQS allow (j) ÷ native (b)"),
                    p50(Setup::RlqsAllow) / p50(Setup::NativeAllow),
                    1.1,
                    true,
                )?;
                goal(
                    md,
                    "RLQS",
                    &format!("{w}w, p50 at {rate}/s: RLQS deny (k) ÷ native deny (b')"),
                    p50(Setup::RlqsDeny) / p50(Setup::NativeDeny),
                    1.1,
                    true,
                )?;
            }
            goal(
                md,
                "RLQS",
                &format!("{w}w, max req/s: native (b) ÷ RLQS allow (j)"),
                rps(m, Setup::NativeAllow) / rps(m, Setup::RlqsAllow),
                1.1,
                true,
            )?;
            goal(
                md,
                "RLQS",
                &format!("{w}w, max req/s: native deny (b') ÷ RLQS deny (k)"),
                rps(m, Setup::NativeDeny) / rps(m, Setup::RlqsDeny),
                1.1,
                true,
            )?;
        }
    }
    let (allow, deny) = g.redis_per_request;
    let names = g.redis_commands.join(", ");
    writeln!(
        md,
        "| | Redis commands per request, allow (d) ({names}) | {allow:.2} | ≤ 1 | {} |",
        one_at_most(allow)
    )?;
    writeln!(md, "| | Redis commands per request, deny (e) | {deny:.2} | ≤ 1 | {} |", one_at_most(deny))?;
    for (kind, outcome) in &r.scale {
        if let Outcome::Measured(points) = outcome {
            if let (Some(first), Some(last)) = (points.first(), points.last()) {
                let (last_n, first_n) = (count(last.keys), count(first.keys));
                let what = format!("{kind}: mean latency at {last_n} keys ÷ at {first_n} keys");
                goal(md, "", &what, last.raw.mean / first.raw.mean, FLAT, true)?;
            }
        }
    }
    Ok(())
}

/// One round trip at most: a denial the filter answers from its cache makes none.
fn one_at_most(per_request: f64) -> &'static str {
    if per_request <= 1.01 {
        "met"
    } else {
        "missed"
    }
}

fn shim(md: &mut String, s: &ShimAlone) -> std::fmt::Result {
    writeln!(md, "\n## 2. Shim alone\n")?;
    writeln!(md, "| path | decisions/s | p50 ms | p99 ms | other status |")?;
    writeln!(md, "|---|---:|---:|---:|---:|")?;
    let shim = &s.shim;
    writeln!(
        md,
        "| `sluice serve`, POST /v1/check (oha, HTTP/1.1) | {:.0} | {:.3} | {:.3} | {} |",
        shim.rps,
        shim.p50,
        shim.p99,
        shim.other_than(200)
    )?;
    let threaded = &s.per_thread;
    writeln!(
        md,
        "| `sluice serve --listeners per-thread`, the same | {:.0} | {:.3} | {:.3} | {} |",
        threaded.rps,
        threaded.p50,
        threaded.p99,
        threaded.other_than(200)
    )?;
    writeln!(
        md,
        "| redis-benchmark, the same script call | {:.0} | {:.3} | {:.3} | |",
        s.raw.rps, s.raw.p50, s.raw.p99
    )?;
    writeln!(
        md,
        "\nRatio shim ÷ raw: **{:.2}×**; per thread ÷ raw: **{:.2}×**. The replayed command, as the shim sent it:\n",
        shim.rps / s.raw.rps,
        threaded.rps / s.raw.rps
    )?;
    let shown: Vec<String> =
        s.command.iter().map(|a| if a.is_empty() { "''".into() } else { a.clone() }).collect();
    writeln!(md, "    {}", shown.join(" "))
}

fn scale(md: &mut String, kinds: &[(&'static str, Outcome)]) -> std::fmt::Result {
    writeln!(md, "\n## 4. Scale\n")?;
    writeln!(
        md,
        "The shim's script call replayed by redis-benchmark on keys drawn at random among N preloaded ones.\n"
    )?;
    writeln!(md, "| limit type | keys | mean ms | p50 ms | p99 ms | calls/s | Redis bytes per key |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|")?;
    for (kind, outcome) in kinds {
        match outcome {
            Outcome::Measured(points) => {
                for p in points {
                    writeln!(
                        md,
                        "| {kind} | {} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} |",
                        count(p.keys),
                        p.raw.mean,
                        p.raw.p50,
                        p.raw.p99,
                        p.raw.rps,
                        p.bytes_per_key
                    )?;
                }
            }
            Outcome::Unsupported(why) => writeln!(md, "| {kind} | not measured: {why} | | | | | |")?,
        }
    }
    Ok(())
}

/// 1000 → "1k", 1000000 → "1M".
fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}
