//! `cargo xtask demo`: scenario S0's dual window (25 per 5 s and 300 per
//! minute, per API key) through the real path: Envoy running `sluice.wasm`,
//! the `sluice` shim, and redis-server, with `policies/examples/demo.json`.
//!
//! It warms up first, until one request has come back decided by the shim,
//! and counts every answer by the gateway's own verdict
//! (`sluice_harness::demo`): a request `failure_mode` let through is never
//! shown as allowed.
//!
//! main has already installed the dependencies, built `dist/` and set the
//! `SLUICE_*` variables. Everything started here is stopped by the harness's
//! drop guards; Ctrl-C only sets a flag, so those guards still run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use sluice_harness::demo::{send, warm_up, Row, LEGEND, PATH, TRAFFIC};
use sluice_harness::llm::LlmUpstream;
use sluice_harness::{llm_demo, workspace_root, Envoy, Redis, Shim, Stack};

/// How long the warm-up may take before the demo goes on regardless.
const WARM_UP: Duration = Duration::from_secs(30);

pub fn run(keep_running: bool) -> Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&interrupted);
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .context("installing the Ctrl-C handler")?;

    let policy_path = workspace_root().join("policies/examples/demo.json");
    let policy = std::fs::read_to_string(&policy_path)
        .with_context(|| format!("reading {}", policy_path.display()))?;
    let doc = timeout_of(&policy);
    println!(
        "starting redis-server, the sluice shim, an upstream and envoy (policy: {})",
        policy_path.display()
    );
    let stack = Stack::start(&policy)?;

    println!(
        "warming up: one request through envoy, the filter, the shim and redis, until the shim decides it"
    );
    let warm = warm_up(stack.envoy.port, WARM_UP)?;
    if warm.decided {
        println!("  decided by the shim after {} request(s), {:.2} s", warm.tries, warm.took.as_secs_f64());
    } else {
        println!(
            "  no request was decided by the shim within {} s; the counts below say what the failure mode did",
            WARM_UP.as_secs()
        );
    }
    println!(
        "the shim has {doc} to answer each check (shim.timeout_ms); past it, failure_mode: allow lets a request \
         through undecided, counted under failure-mode"
    );

    println!("\nconcurrent GET {PATH} per API key, through envoy at {}\n", stack.envoy.url());
    println!("{}", Row::head());
    for (key, sent) in TRAFFIC {
        if interrupted.load(Ordering::SeqCst) {
            break;
        }
        println!("{}", send(stack.envoy.port, key, sent)?.line());
    }
    println!("\n{LEGEND}");

    if keep_running && !interrupted.load(Ordering::SeqCst) {
        println!("\nstill running; Ctrl-C stops everything.");
        println!("  envoy listener  {}", stack.envoy.url());
        println!("  envoy admin     http://127.0.0.1:{}", stack.envoy.admin_port);
        println!("  sluice shim     http://127.0.0.1:{}/  (the Limits dashboard)", stack.shim.port);
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

/// `cargo xtask demo --llm`: token budgets through the real path, against
/// the mock LLM provider of the harness (`policies/examples/llm-demo.json`:
/// 10,000 tokens per team a day). Each team's clients stream chat
/// completions until refused; the table counts requests by the gateway's
/// verdict and tokens by the provider's own count.
pub fn run_llm(keep_running: bool) -> Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&interrupted);
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .context("installing the Ctrl-C handler")?;
    let policy_path = workspace_root().join("policies/examples/llm-demo.json");
    let policy = std::fs::read_to_string(&policy_path)
        .with_context(|| format!("reading {}", policy_path.display()))?;
    println!(
        "starting redis-server, the sluice shim, a mock LLM provider and envoy (policy: {})",
        policy_path.display()
    );
    let redis = Redis::start()?;
    let shim = Shim::start(&redis.url())?;
    let provider = LlmUpstream::start()?;
    let envoy = Envoy::start(&policy, shim.port, provider.port)?;
    println!(
        "each team streams POST /v1/chat/completions through envoy at {} (OpenAI's shape, usage in the last chunk);",
        envoy.url()
    );
    println!("each client sends until its first 429\n");
    println!("{}", llm_demo::Row::head());
    for team in &llm_demo::TEAMS {
        if interrupted.load(Ordering::SeqCst) {
            break;
        }
        println!("{}", llm_demo::send(envoy.port, &provider, team, 200)?.line(team));
    }
    println!("\n{}", llm_demo::LEGEND);
    if keep_running && !interrupted.load(Ordering::SeqCst) {
        println!("\nstill running; Ctrl-C stops everything.");
        println!("  envoy listener  {}", envoy.url());
        println!(
            "  envoy admin     http://127.0.0.1:{}  (sluice.team-tokens.llm_tokens_* stats)",
            envoy.admin_port
        );
        println!("  sluice shim     http://127.0.0.1:{}/  (the Limits dashboard)", shim.port);
        println!(
            "  try: curl -N -H 'x-team: delta' -d '{{\"model\":\"m\",\"stream\":true,\"stream_options\":{{\"include_usage\":true}}}}' {}/v1/chat/completions",
            envoy.url()
        );
        while !interrupted.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    println!("stopping envoy, the mock provider, the shim and redis-server");
    drop((envoy, provider, shim, redis));
    Ok(())
}

/// The document's `shim.timeout_ms`, as the demo says it on screen.
fn timeout_of(policy: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(policy).unwrap_or_default();
    match value.pointer("/shim/timeout_ms").and_then(serde_json::Value::as_u64) {
        Some(ms) => format!("{ms} ms"),
        None => "the default timeout".to_string(),
    }
}
