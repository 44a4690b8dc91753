//! Scenario 2, the shim alone: decisions per second through `sluice serve`
//! (oha POSTs one fixed check to `/v1/check`, in the binary wire as the
//! filter sends it) against redis-benchmark sending
//! the shim's own script call (FCALL) straight to the same Redis, with as many
//! connections; and a second shim on the same Redis with a listener, a
//! runtime and a Redis connection per thread (`--listeners per-thread`). The
//! three take turns, in a different order each round.

use anyhow::{Context, Result};
use sluice_harness::Shim;
use sluice_policies::wire::{CheckRequest, Encoding};

use super::load::{self, Body, Run, Shape, Target};
use super::monitor;
use super::plan::Plan;
use super::redis_bench::{self, Raw, RAND};
use super::setups::Rig;
use super::tools::Tools;

/// One sliding window that is never full: every decision is an admit. In
/// JSON here; sent in the binary wire ([`binary_body`]).
pub(crate) const BODY: &str = r#"{"checks":[{"policy":"bench-shim","key":"alone","limits":[{"type":"sliding_window","limit":1000000000,"window_ms":1000}]}]}"#;
/// The request id's range: wide enough that two requests rarely share one.
const IDS: u64 = 2_000_000_000;

pub(crate) struct ShimAlone {
    pub(crate) shim: Run,
    /// The same, `sluice serve --listeners per-thread`.
    pub(crate) per_thread: Run,
    pub(crate) raw: Raw,
    /// The script call replayed, with its placeholders.
    pub(crate) command: Vec<String>,
}

/// [`BODY`] in the binary wire.
pub(crate) fn binary_body() -> Result<Vec<u8>> {
    let check: CheckRequest = serde_json::from_str(BODY).context("the bench's check")?;
    Encoding::Binary.encode(&check).map_err(anyhow::Error::msg)
}

pub(crate) fn run(rig: &Rig, plan: &Plan, tools: &Tools) -> Result<ShimAlone> {
    let bytes = binary_body()?;
    let body = Body { content_type: Encoding::Binary.content_type(), bytes: &bytes };
    let target = Target::post(format!("http://127.0.0.1:{}/v1/check", rig.shim.port), body);
    let commands = monitor::client_commands(&tools.redis_cli, rig.redis.port, || {
        load::run(&tools.oha, &target, &Shape::Closed(2), 1).map(drop)
    })?;
    let command = redis_bench::template(&commands, "bench-shim", |_, _| RAND.to_string())?;

    let shim = || load::run(&tools.oha, &target, &Shape::Max { for_: plan.max }, plan.connections);
    let redis_url = rig.redis.url();
    let threaded = Shim::start_args(&["--redis", &redis_url, "--listeners", "per-thread"])?;
    let threaded_target = Target::post(format!("http://127.0.0.1:{}/v1/check", threaded.port), body);
    let per_thread =
        || load::run(&tools.oha, &threaded_target, &Shape::Max { for_: plan.max }, plan.connections);
    let raw = || {
        let port = rig.redis.port;
        redis_bench::run(&tools.redis_benchmark, port, plan.connections, plan.evalsha_requests, IDS, &command)
    };
    let (mut shims, mut threads, mut raws) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        eprintln!("bench: shim alone round {}/{}", round + 1, plan.rounds);
        // Each of the three first, second and third in turn.
        for turn in 0..3 {
            match (round + turn) % 3 {
                0 => shims.push(shim()?),
                1 => threads.push(per_thread()?),
                _ => raws.push(raw()?),
            }
        }
    }
    Ok(ShimAlone {
        shim: Run::median(&shims),
        per_thread: Run::median(&threads),
        raw: median(&raws),
        command,
    })
}

fn median(raws: &[Raw]) -> Raw {
    let mid = |f: fn(&Raw) -> f64| load::median(raws.iter().map(f));
    Raw { rps: mid(|r| r.rps), mean: mid(|r| r.mean), p50: mid(|r| r.p50), p99: mid(|r| r.p99) }
}

#[cfg(test)]
mod tests {
    /// `bench/tools/shim-callgrind.sh` sends this scenario's check; in the
    /// binary wire as hex, which must be [`super::binary_body`].
    #[test]
    fn the_callgrind_script_sends_this_check() {
        let script = include_str!("../tools/shim-callgrind.sh");
        assert!(script.contains(super::BODY), "the script's JSON body");
        let hex: String = super::binary_body().expect("encodes").iter().map(|b| format!("{b:02x}")).collect();
        assert!(script.contains(&format!("BINARY={hex}")), "the script's binary body: BINARY={hex}");
    }
}
