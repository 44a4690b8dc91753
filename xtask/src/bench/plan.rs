//! How much of each scenario to run: the full run (about 8 minutes on 2
//! cores) or `--quick` (about a minute, to prove the bench works; its numbers
//! mean little).

use std::time::Duration;

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
            }
        }
    }
}
