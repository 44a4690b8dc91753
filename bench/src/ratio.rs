//! A goal's figures as ratios: a setup's figure in a run's matrix, and a
//! ratio's row in a Markdown goals table with its target and verdict.

use std::fmt::Write;

use super::gateway::Matrix;
use super::load::Run;
use super::setups::Setup;

/// `setup`'s figure `f` at the `i`th fixed rate with `workers` workers.
pub(crate) fn fig(m: &Matrix, i: usize, setup: Setup, f: fn(&Run) -> f64) -> f64 {
    m.at(i, setup).map_or(f64::NAN, f)
}

pub(crate) fn rps(m: &Matrix, setup: Setup) -> f64 {
    m.max_of(setup).map_or(f64::NAN, |r| r.rate_of(setup.expected_status()))
}

/// A goal's ratio row; `at_most`: the target is an upper bound (else a lower bound).
pub(crate) fn goal(
    md: &mut String,
    goal: &str,
    what: &str,
    value: f64,
    target: f64,
    at_most: bool,
) -> std::fmt::Result {
    write!(md, "| {goal} ")?;
    row(md, what, value, target, at_most)
}

/// A ratio row; `at_most`: the target is an upper bound (else a lower bound).
pub(crate) fn row(md: &mut String, what: &str, value: f64, target: f64, at_most: bool) -> std::fmt::Result {
    let (sign, met) = if at_most { ("≤", value <= target) } else { ("≥", value >= target) };
    let verdict = if !value.is_finite() {
        "n/a".to_string()
    } else if met {
        "met".to_string()
    } else {
        format!("missed by {:.0}%", (value / target - 1.0).abs() * 100.0)
    };
    let shown = if value.is_finite() { format!("{value:.2}×") } else { "–".to_string() };
    writeln!(md, "| {what} | {shown} | {sign} {target}× | {verdict} |")
}
