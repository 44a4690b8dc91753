//! The filter's cost per request, in the wasmtime host, for each request
//! shape of `sluice_wasm_host::shapes`: first a table of the host calls by
//! kind, the bytes copied, the buffers the host allocated in the guest and
//! the wasm operators run (counted, exact), then criterion's timing of the
//! time spent in the filter's callbacks, host calls included.
//!
//! ```text
//! cargo xtask build                                            # dist/sluice.wasm
//! cargo bench -p sluice-wasm-host --bench filter               # counts, then timings
//! cargo bench -p sluice-wasm-host --bench filter -- --counts   # the counts alone, and each
//!                                                              # shape's work cut at its host calls
//! SLUICE_DIST=<dir> cargo bench ...                            # another build's sluice.wasm
//! cargo bench -p sluice-wasm-host --bench filter -- --compare <dir>
//!     # <dir>/sluice.wasm against dist/sluice.wasm, side by side in one process
//! ```
//!
//! `--compare` prints both builds' counts, then times them interleaved: for
//! each shape, rounds of a batch of requests on one build then the other
//! (the order alternating), and reports each build's median time per
//! request over the rounds and their ratio. Both builds see the same load,
//! so the ratio means more than two criterion runs made minutes apart.
//!
//! The time is what criterion measures with `iter_custom`: the callbacks'
//! wall time only, not the host's own work between them (building the
//! scripted answer, the header maps). It moves with the machine's load;
//! compare builds side by side in one run, and trust the counts first.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use criterion::Criterion;
use sluice_wasm_host::costs::number;
use sluice_wasm_host::shapes::{measure_wasm, Driver, Shape};
use sluice_wasm_host::PerRequest;

/// Requests counted per shape; the counts are the same for each, so few do.
const COUNTED: u64 = 100;

/// Rounds of `--compare`, and requests per build per round.
const ROUNDS: usize = 101;
const BATCH: u64 = 1000;

fn counts(wasm: Option<&Path>) -> Vec<(Shape, PerRequest)> {
    Shape::ALL
        .iter()
        .map(|&shape| {
            let costs = measure_wasm(shape, COUNTED, wasm.map(Path::to_path_buf))
                .unwrap_or_else(|err| panic!("{shape:?}: {err:#}"));
            (shape, costs.per(COUNTED))
        })
        .collect()
}

/// A markdown table: one column per shape, one row per kind of host call,
/// then the totals.
fn print_counts(counted: &[(Shape, PerRequest)], wasm: Option<&Path>) {
    let wasm = match wasm {
        Some(path) => path.display().to_string(),
        None => {
            sluice_harness::paths::dist("sluice.wasm").map(|p| p.display().to_string()).unwrap_or_default()
        }
    };
    println!("\nThe filter's cost per request ({wasm}):\n");
    let header: Vec<&str> = counted.iter().map(|(s, _)| s.name()).collect();
    println!("| per request | {} |", header.join(" | "));
    println!("|---|{}", "---:|".repeat(counted.len()));
    let kinds: BTreeSet<&str> = counted.iter().flat_map(|(_, c)| c.calls.keys().copied()).collect();
    let row = |label: &str, cell: &dyn Fn(&PerRequest) -> String| {
        let cells: Vec<String> = counted.iter().map(|(_, c)| cell(c)).collect();
        println!("| {label} | {} |", cells.join(" | "));
    };
    for kind in kinds {
        row(&format!("`{kind}`"), &|c| number(c.calls.get(kind).copied().unwrap_or(0.0)));
    }
    row("**host calls**", &|c| format!("**{}**", number(c.host_calls())));
    row("bytes copied out of the guest", &|c| c.bytes_in.to_string());
    row("bytes copied into the guest", &|c| c.bytes_out.to_string());
    row("buffers the host allocated in the guest", &|c| number(c.allocations));
    row("callbacks", &|c| number(c.callbacks));
    row("wasm operators (fuel)", &|c| c.fuel.to_string());
    println!();
}

/// One request of each shape, its guest work cut at each host call.
fn print_traces() {
    for shape in Shape::ALL {
        let mut driver = Driver::new(shape).unwrap_or_else(|err| panic!("{shape:?}: {err:#}"));
        driver.trace(true);
        driver.request().unwrap_or_else(|err| panic!("{shape:?}: {err:#}"));
        println!("{}: wasm operators up to each host call", shape.name());
        let mut callback = "";
        let mut line = String::new();
        for part in driver.take_costs().trace {
            if part.callback != callback {
                if !line.is_empty() {
                    println!("{line}");
                }
                callback = part.callback;
                line = format!("  {}:", callback.trim_start_matches("proxy_"));
            }
            line += &format!(" {} {},", part.until.trim_start_matches("proxy_"), part.ops);
        }
        println!("{line}\n");
    }
}

fn timings(c: &mut Criterion) {
    let mut group = c.benchmark_group("filter_request");
    for shape in Shape::ALL {
        let mut driver = Driver::new(shape).unwrap_or_else(|err| panic!("{shape:?}: {err:#}"));
        group.bench_function(shape.id(), |b| {
            b.iter_custom(|iters| {
                driver.take_costs();
                for _ in 0..iters {
                    driver.request().unwrap_or_else(|err| panic!("{shape:?}: {err:#}"));
                }
                driver.take_costs().busy
            })
        });
    }
    group.finish();
}

/// `before` against `dist/sluice.wasm`, interleaved: the median time per
/// request of each, in µs, and the ratio.
fn compare(before: &Path) {
    print_counts(&counts(Some(before)), Some(before));
    print_counts(&counts(None), None);
    println!(
        "Time in the filter's callbacks per request, median of {ROUNDS} interleaved rounds of {BATCH}:\n"
    );
    println!("| shape | {} | dist/sluice.wasm | ratio |", before.display());
    println!("|---|---:|---:|---:|");
    for shape in Shape::ALL {
        let driver = |wasm| Driver::with_wasm(shape, wasm).unwrap_or_else(|err| panic!("{shape:?}: {err:#}"));
        let mut drivers = [driver(Some(before.to_path_buf())), driver(None)];
        let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for round in 0..ROUNDS {
            for i in [round % 2, 1 - round % 2] {
                drivers[i].take_costs();
                for _ in 0..BATCH {
                    drivers[i].request().unwrap_or_else(|err| panic!("{shape:?}: {err:#}"));
                }
                times[i].push(drivers[i].take_costs().busy.as_secs_f64() * 1e6 / BATCH as f64);
            }
        }
        let [a, b] = times.map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        });
        println!("| {} | {a:.2} µs | {b:.2} µs | {:.2} |", shape.name(), b / a);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--compare") {
        let dir = args.get(at + 1).expect("--compare <dir holding the other sluice.wasm>");
        return compare(&Path::new(dir).join("sluice.wasm"));
    }
    print_counts(&counts(None), None);
    if args.iter().any(|a| a == "--counts") {
        return print_traces();
    }
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    timings(&mut criterion);
    criterion.final_summary();
}
