//! `cargo xtask demo`: scenario S0's dual window (25 per 5 s and 300 per
//! minute, per API key) through the real path: Envoy running `sluice.wasm`,
//! the `sluice` shim, and redis-server, with `policies/examples/demo.json`.
//!
//! main has already installed the dependencies, built `dist/` and set the
//! `SLUICE_*` variables. Everything started here is stopped by the harness's
//! drop guards; Ctrl-C only sets a flag, so those guards still run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use sluice_harness::client::{burst, count};
use sluice_harness::{workspace_root, Stack};

/// The limits of `policies/examples/demo.json`, for the table.
const LIMIT: &str = "25/5s + 300/1m";
/// API keys and how many concurrent GETs each one sends.
const TRAFFIC: [(&str, usize); 3] = [("alice", 40), ("bob", 25), ("carol", 10)];
const PATH: &str = "/v42/orders";

pub fn run(keep_running: bool) -> Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&interrupted);
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .context("installing the Ctrl-C handler")?;

    let policy_path = workspace_root().join("policies/examples/demo.json");
    let policy = std::fs::read_to_string(&policy_path)
        .with_context(|| format!("reading {}", policy_path.display()))?;
    println!(
        "starting redis-server, the sluice shim, an upstream and envoy (policy: {})",
        policy_path.display()
    );
    let stack = Stack::start(&policy)?;

    println!("\nconcurrent GET {PATH} per API key, through envoy at {}\n", stack.envoy.url());
    println!("{:<8} {:>5} {:>8} {:>9} {:>6}  limit", "key", "sent", "allowed", "rejected", "other");
    for (key, sent) in TRAFFIC {
        if interrupted.load(Ordering::SeqCst) {
            break;
        }
        let replies = burst(stack.envoy.port, "GET", PATH, Some(("x-api-key", key)), sent)?;
        let (allowed, rejected) = (count(&replies, 200), count(&replies, 429));
        let other = sent - allowed - rejected;
        println!("{key:<8} {sent:>5} {allowed:>8} {rejected:>9} {other:>6}  {LIMIT}");
    }
    println!("\nrejected = 429 with retry-after; other = anything else (e.g. 503 when the shim fails)");

    if keep_running && !interrupted.load(Ordering::SeqCst) {
        println!("\nstill running; Ctrl-C stops everything.");
        println!("  envoy listener  {}", stack.envoy.url());
        println!("  envoy admin     http://127.0.0.1:{}", stack.envoy.admin_port);
        println!("  sluice shim     http://127.0.0.1:{}/healthz", stack.shim.port);
        println!("  redis           {}", stack.redis.url());
        println!("  try: curl -i -H 'x-api-key: alice' {}{PATH}", stack.envoy.url());
        while !interrupted.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    println!("stopping envoy, the shim, the upstream and redis-server");
    drop(stack);
    Ok(())
}
