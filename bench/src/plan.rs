//! How much of each scenario to run: the full run (about 33 minutes on 2
//! cores, 15 of them scenario 1's setups at two worker counts, 6 the three
//! S0 egress runs, 3 scenario 7) or `--quick` (about 4 minutes: every
//! scenario once with one-second runs, so each change can be checked
//! against the goals' ratios before a full run; its numbers are rough).

use std::time::Duration;

use sluice_harness::partner::Limits;

pub(crate) struct Plan {
    pub(crate) quick: bool,
    /// Fixed request rates for the latency percentiles.
    pub(crate) rates: &'static [u32],
    /// How long each fixed-rate measurement runs.
    pub(crate) fixed: Duration,
    /// How long each maximum-throughput measurement runs.
    pub(crate) max: Duration,
    /// How often every measurement is repeated; setups are interleaved in a
    /// different order each round, and the median round is reported.
    pub(crate) rounds: usize,
    /// Connections for the fixed-rate and maximum-throughput runs, and for
    /// the shim and raw EVALSHA comparison.
    pub(crate) connections: u32,
    /// Requests per raw EVALSHA measurement (redis-benchmark counts, not times).
    pub(crate) evalsha_requests: u64,
    /// Distinct keys for the scale scenario.
    pub(crate) scale_keys: &'static [u64],
    /// Requests per scale measurement.
    pub(crate) scale_requests: u64,
    /// Decisions per case of the Redis cost scenario.
    pub(crate) cost_calls: usize,
    /// The egress scenarios, S0, S1 and S2a.
    pub(crate) egress: Vec<Egress>,
    /// Scenario 6, load shedding.
    pub(crate) shed: Shed,
}

/// Scenario 6: an upstream of `slots` slots held `work` each (so
/// `slots / work` requests a second at most) and a queue of `queue`,
/// offered `overload_rate` requests a second of a class mix for
/// `overload`, then `calm_rate` for `calm` to show the recovery.
#[derive(Clone, Debug)]
pub(crate) struct Shed {
    pub(crate) slots: u32,
    pub(crate) work: Duration,
    pub(crate) queue: u32,
    pub(crate) overload_rate: u32,
    pub(crate) overload: Duration,
    pub(crate) calm_rate: u32,
    pub(crate) calm: Duration,
}

impl Shed {
    /// The most requests a second the upstream serves.
    pub(crate) fn capacity(&self) -> f64 {
        f64::from(self.slots) / self.work.as_secs_f64()
    }
}

/// 200 requests a second of capacity with a queue of one second, offered
/// 2.5 times that, then 0.4 times; `--quick` only shortens the phases.
fn shed(quick: bool) -> Shed {
    let (overload, calm) = if quick { (secs(6), secs(2)) } else { (secs(30), secs(10)) };
    Shed { slots: 8, work: ms(40), queue: 200, overload_rate: 500, overload, calm_rate: 80, calm }
}

/// One egress scenario: the partner's limits (Sluice's policy states the
/// same ones), how slow it answers, and the callers.
#[derive(Clone, Debug)]
pub(crate) struct Egress {
    pub(crate) scenario: &'static str,
    pub(crate) limits: Limits,
    pub(crate) delay: Duration,
    pub(crate) workers: usize,
    pub(crate) calls: usize,
    /// Upstream feedback: Sluice's policy states twice the partner's
    /// windows (the operator guessed wrong), run with feedback off and on.
    pub(crate) feedback: bool,
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// S0 at full scale takes at least 115 s per approach by construction (600
/// calls at 300 a minute); `--quick` scales the windows down.
fn egress(quick: bool) -> Vec<Egress> {
    let (s0, s0_workers, s0_calls) = if quick {
        (Limits::default().window(5, secs(1)).window(12, secs(3)), 10, 24)
    } else {
        (Limits::default().window(25, secs(5)).window(300, secs(60)), 20, 600)
    };
    let (s1_workers, s1_calls) = if quick { (5, 20) } else { (10, 100) };
    let (s2a_limit, s2a_workers, s2a_calls, s2a_delay) =
        if quick { (10, 40, 200, 50) } else { (50, 200, 2000, 100) };
    let (feedback_limit, feedback_window, feedback_workers, feedback_calls) =
        if quick { (3, 1, 6, 15) } else { (12, 5, 20, 100) };
    vec![
        Egress {
            scenario: "S0",
            limits: s0,
            delay: Duration::ZERO,
            workers: s0_workers,
            calls: s0_calls,
            feedback: false,
        },
        Egress {
            scenario: "S1",
            limits: Limits::default().interval(ms(100)),
            delay: Duration::ZERO,
            workers: s1_workers,
            calls: s1_calls,
            feedback: false,
        },
        Egress {
            scenario: "S2a",
            limits: Limits::default().concurrency(s2a_limit),
            delay: ms(s2a_delay),
            workers: s2a_workers,
            calls: s2a_calls,
            feedback: false,
        },
        Egress {
            scenario: "Feedback (the policy states twice the partner's limit)",
            limits: Limits::default().window(feedback_limit, secs(feedback_window)),
            delay: Duration::ZERO,
            workers: feedback_workers,
            calls: feedback_calls,
            feedback: true,
        },
    ]
}

impl Plan {
    pub(crate) fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                rates: &[500, 2000],
                fixed: Duration::from_secs(1),
                max: Duration::from_secs(1),
                rounds: 1,
                connections: 16,
                evalsha_requests: 20_000,
                scale_keys: &[1_000, 10_000],
                scale_requests: 10_000,
                cost_calls: 2_000,
                egress: egress(true),
                shed: shed(true),
            }
        } else {
            Plan {
                quick,
                rates: &[500, 2000],
                fixed: Duration::from_secs(5),
                max: Duration::from_secs(4),
                rounds: 3,
                connections: 16,
                evalsha_requests: 200_000,
                scale_keys: &[1_000, 100_000, 1_000_000],
                scale_requests: 100_000,
                cost_calls: 20_000,
                egress: egress(false),
                shed: shed(false),
            }
        }
    }
}
