//! The deny path against the Wasm deny floor: one request refused from
//! Sluice's over-limit cache (`dist/sluice.wasm`, [`Shape::CachedDeny`])
//! beside one refused by `bench/deny-floor`, the least a proxy-wasm filter
//! that answers with a local reply can do (one `proxy_send_local_response`,
//! nothing else). Both are played through the same host with the same
//! request headers, stream created to stream deleted, and counted: host
//! calls by name, wasm operators (fuel), bytes copied each way and buffers
//! the host allocated in the guest. Counts, never timings; the table is
//! printed (`-- --nocapture`) and `docs/performance.md` ("The deny path")
//! quotes it.
//!
//! The deny floor is built by `cargo xtask build` beside `dist/` (in
//! `target/wasm*/wasm32-wasip1/wasm/`), or named by
//! `SLUICE_BENCH_DENY_FLOOR_WASM`.

use std::path::PathBuf;

use sluice_wasm_host::shapes::{measure, Driver, Shape};
use sluice_wasm_host::{Costs, End, HeaderMap, HostConfig, Proxy, Returned};

const N: u64 = 20;

fn deny_floor_wasm() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_BENCH_DENY_FLOOR_WASM") {
        return PathBuf::from(path);
    }
    let root = sluice_harness::workspace_root();
    ["target/wasm-rustup", "target/wasm"]
        .iter()
        .map(|dir| root.join(dir).join("wasm32-wasip1/wasm/sluice_deny_floor.wasm"))
        .find(|path| path.is_file())
        .expect("the Wasm deny floor is not built: run `cargo xtask build`")
}

/// `n` requests through the deny floor, after one to warm up.
fn deny_floor(n: u64) -> Costs {
    let mut config = HostConfig::new("");
    config.root_id = "deny_floor".into();
    config.wasm = Some(deny_floor_wasm());
    let mut proxy = Proxy::boot(config).expect("boot the deny floor");
    assert_eq!(proxy.configure().expect("configure").returned, Returned::Bool(true));
    let one = |proxy: &mut Proxy| {
        let id = proxy.open().expect("open");
        let asked = proxy.request_headers(id, Shape::CachedDeny.headers(), true).expect("request headers");
        assert_eq!(asked.local_response().map(|r| r.status), Some(429), "the floor refuses: {asked:?}");
        let response: HeaderMap = [(":status", "429".to_string())].into_iter().collect();
        proxy.response_headers(id, response, false).expect("response headers");
        proxy.end(id, End::Complete).expect("end");
    };
    one(&mut proxy);
    proxy.take_costs();
    for _ in 0..n {
        one(&mut proxy);
    }
    proxy.take_costs()
}

fn per(costs: &Costs, name: &str) -> u64 {
    costs.calls_of(name) / N
}

/// The floor is what it claims: one host call per request, the local
/// reply. Sluice's cached denial is the floor's call plus exactly what its
/// decision needs: the request headers its policy reads (`:path`,
/// `:method`, `x-api-key`), one clock reading, one counter. No call to the
/// shim, and within one tick no shared-data read: the worker's copy of the
/// over-limit cache's entry answers.
#[test]
fn a_cached_denial_is_the_floor_plus_its_decision() {
    let floor = deny_floor(N);
    let sluice = measure(Shape::CachedDeny, N).expect("the cached denial");
    print_table(&floor, &sluice);

    assert_eq!(floor.host_calls() / N, 1, "the floor: {:?}", floor.calls);
    assert_eq!(per(&floor, "proxy_send_local_response"), 1);

    assert_eq!(per(&sluice, "proxy_send_local_response"), 1);
    assert_eq!(per(&sluice, "proxy_get_header_map_value"), 3);
    assert_eq!(per(&sluice, "proxy_get_current_time_nanoseconds"), 1);
    assert_eq!(per(&sluice, "proxy_get_shared_data"), 0);
    assert_eq!(per(&sluice, "proxy_increment_metric"), 1);
    assert_eq!(per(&sluice, "proxy_http_call"), 0);
    assert_eq!(sluice.host_calls() / N, 6, "{:?}", sluice.calls);
}

/// The worker's copy of the over-limit cache is refreshed from shared data
/// at most once per tick: after a tick, the next denial reads the entry
/// once, and the ones after it in the same tick read nothing.
#[test]
fn the_over_limit_cache_is_read_from_shared_data_once_per_tick() {
    let mut driver = Driver::new(Shape::CachedDeny).expect("the cached denial");
    for round in 0..3 {
        driver.tick().expect("tick");
        driver.take_costs();
        driver.request().expect("the first denial after the tick");
        let first = driver.take_costs();
        assert_eq!(first.calls_of("proxy_get_shared_data"), 1, "round {round}: {:?}", first.calls);
        for _ in 0..5 {
            driver.request().expect("a denial in the same tick");
        }
        let rest = driver.take_costs();
        assert_eq!(rest.calls_of("proxy_get_shared_data"), 0, "round {round}: {:?}", rest.calls);
        assert_eq!(rest.calls_of("proxy_send_local_response"), 5);
    }
}

fn print_table(floor: &Costs, sluice: &Costs) {
    let (f, s) = (floor.per(N), sluice.per(N));
    println!("| per refused request | Wasm deny floor | Sluice, cached denial | Sluice ÷ floor |");
    println!("|---|---:|---:|---:|");
    let row = |what: &str, a: f64, b: f64| {
        let ratio = if a > 0.0 { format!("{:.1}×", b / a) } else { "–".into() };
        println!("| {what} | {a:.0} | {b:.0} | {ratio} |");
    };
    row("wasm operators (fuel)", f.fuel as f64, s.fuel as f64);
    row("host calls", f.host_calls(), s.host_calls());
    let names: std::collections::BTreeSet<&str> =
        floor.calls.keys().chain(sluice.calls.keys()).copied().collect();
    for name in names {
        row(
            &format!("`{name}`"),
            floor.calls_of(name) as f64 / N as f64,
            sluice.calls_of(name) as f64 / N as f64,
        );
    }
    row("bytes copied out of the guest", f.bytes_in as f64, s.bytes_in as f64);
    row("bytes copied into the guest", f.bytes_out as f64, s.bytes_out as f64);
    row("buffers the host allocated in the guest", f.allocations, s.allocations);
}
