//! The demo through the real parts, with `policies/examples/demo.json` as
//! `cargo xtask demo` runs it (50 ms shim timeout, `failure_mode: allow`),
//! on a Redis that is stalled (SIGSTOP) when the traffic starts.
//!
//! The first demo on a busy machine printed `alice 40 allowed`: its cold
//! calls timed out, the failure mode let them through, and the table
//! counted every 200 as allowed. These tests pin the fix: a table row counts
//! the gateway's own verdict, so a failure-mode pass lands in its own
//! column and never in `allowed`.

use std::time::Duration;

use sluice_harness::demo::{send, warm_up, Row, TRAFFIC};
use sluice_harness::{workspace_root, Stack};

fn demo_policy() -> String {
    std::fs::read_to_string(workspace_root().join("policies/examples/demo.json")).expect("demo.json")
}

/// The per-key limit of the demo's first window.
const LIMIT: usize = 25;

/// Every request lands in exactly one column.
fn assert_whole(row: &Row) {
    assert_eq!(row.allowed + row.rejected + row.failure_mode + row.other, row.sent, "{row:?}");
}

/// While Redis is stalled, nothing can be decided: a burst shows every
/// request under `failure-mode` and none as allowed. Then the warm-up waits
/// for the first real decision once Redis answers again, and the demo's
/// traffic never shows more admissions per key than its limit.
#[test]
fn a_stalled_redis_never_shows_failure_passes_as_allowed() {
    let stack = Stack::start(&demo_policy()).expect("stack");
    let port = stack.envoy.port;

    stack.redis.pause();
    let cold = send(port, "cold", 40);
    stack.redis.resume();
    let cold = cold.expect("the cold burst");
    assert_whole(&cold);
    assert_eq!(cold.allowed, 0, "admitted while Redis was stalled: {cold:?}");
    assert_eq!(cold.failure_mode, 40, "every request was let through by the failure mode: {cold:?}");

    // Stalled again for the first second of the warm-up: it waits for a
    // real decision instead of counting a pass.
    stack.redis.pause();
    let warm = std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_secs(1));
            stack.redis.resume();
        });
        warm_up(port, Duration::from_secs(30))
    })
    .expect("warm-up");
    assert!(warm.decided, "the shim never decided a request after Redis came back: {warm:?}");
    assert!(warm.tries > 1, "the first warm-up request found Redis stalled, yet was decided: {warm:?}");

    for (key, sent) in TRAFFIC {
        let row = send(port, key, sent).expect("burst");
        assert_whole(&row);
        assert!(row.allowed <= LIMIT, "{key}: {} allowed, over the limit of {LIMIT}: {row:?}", row.allowed);
        assert_eq!(row.other, 0, "{key}: answers without a verdict: {row:?}");
    }
}

/// The token-budget demo (`cargo xtask demo --llm`) through the real
/// parts, its document given a generous shim timeout so that the machine's
/// load decides nothing: every request lands in one column, the teams that
/// cap their requests never use more than their budget by the provider's
/// own count, and the one that does not stays within the bound (its six
/// clients' excess beyond their reservations).
#[test]
fn the_token_demo_keeps_each_budget_by_the_providers_count() {
    use sluice_harness::llm::LlmUpstream;
    use sluice_harness::llm_demo::{self, BUDGET, DEFAULT_MAX_TOKENS, TEAMS};
    use sluice_harness::{Envoy, Redis, Shim};

    let policy = std::fs::read_to_string(workspace_root().join("policies/examples/llm-demo.json"))
        .expect("llm-demo.json")
        .replace(r#""timeout_ms": 200"#, r#""timeout_ms": 5000"#);
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let provider = LlmUpstream::start().expect("provider");
    let envoy = Envoy::start(&policy, shim.port, provider.port).expect("envoy");
    for team in &TEAMS {
        let row = llm_demo::send(envoy.port, &provider, team, 200).expect("the team's requests");
        println!("{}", row.line(team));
        assert_eq!(row.admitted + row.refused + row.failure_mode + row.other, row.sent, "{row:?}");
        assert_eq!((row.failure_mode, row.other), (0, 0), "{row:?}");
        let bound = match team.cap {
            Some(_) => 0,
            None => team.clients as u64 * team.most.saturating_sub(DEFAULT_MAX_TOKENS),
        };
        assert!(row.used <= BUDGET + bound, "{}: {} tokens of a budget of {BUDGET}", team.name, row.used);
    }
}
