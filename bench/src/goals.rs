//! The performance issue's goals (A to H), as ratios within one run: a view
//! of the figures the scenarios measured, never a threshold a run must pass.
//! Goal G (leases on Zipf traffic) is measured by scenario 7 alone
//! (`--leased`, `LEASED.md`), so its row here points there.

use std::fmt::Write;

use super::budget::Budget;
use super::egress::Scenario;
use super::gateway::Gateway;
use super::gateway::Matrix;
use super::load::{P50, P99};
use super::ratio::{fig, goal, rps};
use super::setups::Setup;
use super::shim_alone::ShimAlone;

/// The processes a Sluice decision's CPU is counted over (goal C).
const DECISION: [&str; 3] = ["envoy", "shim", "redis"];

pub(crate) fn section(
    md: &mut String,
    gateway: &Gateway,
    shim: &ShimAlone,
    budget: &Budget,
    egress: &[Scenario],
) -> std::fmt::Result {
    writeln!(md, "\n## Goals\n")?;
    writeln!(
        md,
        "The performance issue's goals, as ratios within this run, reported, never enforced. \
         A row is n/a when a setup it needs was not measured.\n"
    )?;
    writeln!(md, "| goal | measure | value | target | verdict |")?;
    writeln!(md, "|---|---|---:|---:|---|")?;
    for m in &gateway.matrices {
        throughput(md, m)?;
        latency(md, m, shim)?;
        if gateway.skipped.is_none() {
            rls(md, m)?;
        }
    }
    cpu(md, budget)?;
    goal(md, "E", "shim ÷ its raw script call, decisions/s", shim.shim.rps / shim.raw.rps, 0.9, false)?;
    let per_thread = shim.per_thread.rps / shim.raw.rps;
    goal(md, "E", "shim per thread ÷ its raw script call, decisions/s", per_thread, 0.9, false)?;
    waits(md, egress)?;
    writeln!(
        md,
        "| G | leased admissions on Zipf traffic | – | ≥ 25 % | scenario 7 (`--leased`, LEASED.md) |"
    )
}

/// A: the exact allow path's closed loop, without and with shared
/// callouts, against the peer and the floor.
fn throughput(md: &mut String, m: &Matrix) -> std::fmt::Result {
    let w = m.workers;
    for (setup, name) in
        [(Setup::SluiceAllow, "allow (d)"), (Setup::SluiceShared, "allow with shared callouts (d')")]
    {
        let allow = rps(m, setup);
        let peer = allow / rps(m, Setup::RlsPeerAllow);
        goal(md, "A", &format!("{w}w, max req/s: {name} ÷ the peer (g)"), peer, 1.5, false)?;
        let floor = allow / rps(m, Setup::Floor);
        goal(md, "A", &format!("{w}w, max req/s: {name} ÷ the callout floor (c)"), floor, 1.0, false)?;
    }
    Ok(())
}

/// B: at the first fixed rate, what the allow path adds against what the
/// floor adds plus one Redis call (the shim-alone scenario's raw script call).
fn latency(md: &mut String, m: &Matrix, shim: &ShimAlone) -> std::fmt::Result {
    let (w, i) = (m.workers, 0);
    let Some((rate, _)) = m.fixed.get(i) else { return Ok(()) };
    for ((name, pct), redis) in [(P50, shim.raw.p50), (P99, shim.raw.p99)] {
        let base = fig(m, i, Setup::Plain, pct);
        let sluice = fig(m, i, Setup::SluiceAllow, pct) - base;
        let floor = fig(m, i, Setup::Floor, pct) - base;
        let what = format!(
            "{w}w, {name} at {rate}/s: allow adds {sluice:.2} ms ÷ (the floor's {floor:.2} ms + one Redis call {redis:.2} ms)"
        );
        // A part at or under zero is noise (the setup measured faster than
        // plain Envoy): no ratio, rather than one divided by noise.
        let ratio =
            if sluice > 0.0 && floor > 0.0 && redis > 0.0 { sluice / (floor + redis) } else { f64::NAN };
        goal(md, "B", &what, ratio, 1.2, true)?;
    }
    Ok(())
}

/// D: the RLS face against the peer behind the same Envoy filter.
fn rls(md: &mut String, m: &Matrix) -> std::fmt::Result {
    let w = m.workers;
    let allow = rps(m, Setup::RlsSluiceAllow) / rps(m, Setup::RlsPeerAllow);
    goal(md, "D", &format!("{w}w, max req/s: RLS allow (h) ÷ the peer (g)"), allow, 1.5, false)?;
    let deny = rps(m, Setup::RlsSluiceDeny) / rps(m, Setup::RlsPeerDeny);
    goal(md, "D", &format!("{w}w, max req/s: RLS deny (h') ÷ the peer (g')"), deny, 2.0, false)
}

/// C: Envoy, shim and Redis CPU per admitted request against the floor's Envoy.
fn cpu(md: &mut String, budget: &Budget) -> std::fmt::Result {
    let part = |setup: Setup, name: &str| {
        let parts = budget.cpu.iter().find(|(s, _)| *s == setup).map(|(_, p)| p);
        parts.and_then(|p| p.get(name)).map_or(f64::NAN, |(user, system)| user + system)
    };
    let sluice: f64 = DECISION.iter().map(|&p| part(Setup::SluiceAllow, p)).sum();
    let floor = part(Setup::Floor, "envoy");
    let what = format!(
        "1w, CPU per admitted request: envoy + shim + redis {sluice:.1} µs ÷ the floor's envoy {floor:.1} µs"
    );
    goal(md, "C", &what, sluice / floor, 1.2, true)
}

/// F and H from scenario 5: a freed concurrency slot's hand-over, and the
/// gaps at the partner against the interval.
fn waits(md: &mut String, egress: &[Scenario]) -> std::fmt::Result {
    for s in egress.iter().filter(|s| !s.plan.feedback) {
        let sluice = s.approaches.iter().find(|a| a.approach.starts_with("Sluice"));
        let Some(n) = sluice.and_then(|a| a.outcome.as_ref().ok()) else { continue };
        if let (Some(every), Some(min), Some(mean)) = (s.plan.limits.interval, n.min_gap, n.mean_gap) {
            let every_ms = every.as_secs_f64() * 1e3;
            let what =
                format!("{}: smallest gap at the partner ÷ the interval ({every_ms:.0} ms)", s.plan.scenario);
            goal(md, "H", &what, min.as_secs_f64() * 1e3 / every_ms, 1.0, false)?;
            let what = format!("{}: mean gap at the partner ÷ the interval", s.plan.scenario);
            goal(md, "H", &what, mean.as_secs_f64() * 1e3 / every_ms, 1.05, true)?;
        }
        if let (Some(_), Some((_, p99))) = (s.plan.limits.concurrency, n.handoff) {
            let ms = p99.as_secs_f64() * 1e3;
            let verdict = if ms <= 1.0 { "met" } else { "missed" };
            writeln!(
                md,
                "| F | {}: a freed slot empty at p99 | {ms:.1} ms | ≤ 1 ms | {verdict} |",
                s.plan.scenario
            )?;
        }
    }
    Ok(())
}
