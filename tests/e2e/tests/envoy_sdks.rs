//! The official OpenAI and Anthropic Python SDKs through real Envoy, the
//! real filter and shim, and the mock provider (`harness::llm`): every call
//! shape streamed and not, a spent budget, `end_stream`, and a caller that
//! closes a stream early. The SDKs run `tests/e2e/sdk/clients.py`; `cargo xtask
//! test` installs them (`pip install openai anthropic`).

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use sluice_harness::gateway::{eventually, prometheus, sample};
use sluice_harness::llm::{self, post, request_body, LlmUpstream};
use sluice_harness::{Envoy, Redis, Shim};
use sluice_policies::llm::Api;

const APIS: [Api; 3] = [Api::OpenaiChat, Api::OpenaiResponses, Api::AnthropicMessages];

struct Stack {
    envoy: Envoy,
    _shim: Shim,
    llm: LlmUpstream,
    _redis: Redis,
}

/// A budget of `capacity` a day per `x-team` on each API's path, with `extra` in its `llm`.
fn start(capacity: u64, extra: &str) -> Stack {
    let policies: Vec<String> = APIS
        .iter()
        .map(|api| {
            format!(
                r#"{{"name": "{name}", "match": {{"path_exact": "{path}"}}, "key": ["header:x-team"],
                "llm": {{"api": "{name}", "default_max_tokens": 100{extra}}},
                "limits": [{{"type": "points", "capacity": {capacity}, "refill": "1d", "cost": "llm_tokens"}}]}}"#,
                name = api.name(),
                path = llm::path(*api)
            )
        })
        .collect();
    let doc = format!(
        r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "policies": [{}]}}"#,
        policies.join(",")
    );
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let llm = LlmUpstream::start().expect("the mock provider");
    let envoy = Envoy::start(&doc, shim.port, llm.port).expect("envoy");
    Stack { envoy, _shim: shim, llm, _redis: redis }
}

fn stat(envoy: &Envoy, name: &str, policy: &str) -> u64 {
    let page = prometheus(envoy).expect("Envoy's stats");
    sample(&page, &format!(r#"sluice_{name}{{policy="{policy}"}}"#)) as u64
}

/// Runs `scenario` of `tests/e2e/sdk/clients.py` against Envoy: one JSON object per call.
fn sdks(stack: &Stack, scenario: &str, team: &str) -> Vec<Value> {
    let script = sluice_harness::workspace_root().join("tests/e2e/sdk/clients.py");
    let base = format!("http://127.0.0.1:{}", stack.envoy.port);
    let out = Command::new("python3").arg(&script).args([scenario, &base, team]).output().expect("python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{scenario}: {stderr}\n(the SDKs come with `cargo xtask test`, or `pip install openai anthropic`)"
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    for line in &lines {
        println!("{scenario}: {line}");
    }
    lines
}

/// All nine call shapes: each gets its whole answer through the gateway,
/// and each API's policy is charged the provider's true counts.
#[test]
fn every_call_shape_of_both_sdks_passes_and_is_charged_its_true_count() {
    let stack = start(10_000_000, "");
    let calls = sdks(&stack, "shapes", "a");
    assert_eq!(calls.len(), 9);
    for call in &calls {
        assert_eq!(call["ok"], true, "{call}");
        assert_eq!(call["text"], llm::TOKEN.repeat(12), "{call}");
    }
    let served = stack.llm.served();
    for api in APIS {
        let billed: u64 = served.iter().filter(|s| s.api == api).map(|s| s.billed()).sum();
        let ok = eventually(Duration::from_secs(10), || {
            stat(&stack.envoy, "llm_tokens_charged", api.name()) == billed
        });
        assert!(ok, "{api:?}: charged {} for {billed}", stat(&stack.envoy, "llm_tokens_charged", api.name()));
        assert_eq!(stat(&stack.envoy, "llm_fallbacks", api.name()), 0);
    }
}

/// A spent daily budget: each SDK raises its `RateLimitError` at once, with
/// the message from the provider-shaped body, and does not retry (the wait
/// is hours: `x-should-retry: false`). One denial per call, none retried.
#[test]
fn a_spent_budget_raises_rate_limit_error_at_once() {
    let stack = start(2_000, "");
    for api in APIS {
        // No cap: 100 reserved, 5,000 used: the budget is spent for hours.
        let body = request_body(api, "spend", None, false);
        let reply =
            post(stack.envoy.port, llm::path(api), &[("x-team", "a"), ("x-mock-output", "5000")], &body)
                .expect("a request");
        assert_eq!(reply.status, 200);
    }
    let calls = sdks(&stack, "refused", "a");
    assert_eq!(calls.len(), 3);
    for call in &calls {
        assert_eq!(call["ok"], false, "{call}");
        assert_eq!(call["error"], "RateLimitError", "{call}");
        assert_eq!(call["status"], 429);
        let message = call["message"].as_str().unwrap_or_default();
        assert!(message.contains("Rate limit reached") && message.contains("policy"), "{call}");
        assert!(call["seconds"].as_f64().unwrap_or(99.0) < 5.0, "no wait for the retry-after: {call}");
    }
    for api in APIS {
        assert_eq!(stat(&stack.envoy, "denied", api.name()), 1, "{api:?}: not retried");
    }
}

/// `end_stream`: each API's stream that passes its budget raises in the SDK
/// at the gateway's error event (OpenAI's `APIError`, Anthropic's
/// `APIStatusError`, each with the gateway's message), though the provider
/// holds its stream open: the caller does not wait for it.
#[test]
fn end_stream_raises_in_each_sdk_at_the_error_event() {
    let stack = start(3_000, r#", "end_stream": true"#);
    let calls = sdks(&stack, "ended:4000", "a");
    assert_eq!(calls.len(), 3);
    let want = ["APIError", "APIError", "APIStatusError"];
    for (call, error) in calls.iter().zip(want) {
        assert_eq!(call["ok"], false, "{call}");
        assert_eq!(call["error"], error, "{call}");
        assert!(call["message"].as_str().unwrap_or_default().contains("token budget"), "{call}");
    }
    for api in APIS {
        assert_eq!(stat(&stack.envoy, "llm_streams_ended", api.name()), 1, "{api:?}");
    }
    let ok = eventually(Duration::from_secs(10), || stack.llm.served().iter().all(|s| s.ended.is_some()));
    assert!(ok, "every provider stream ended with its client");
}

/// A caller that closes its stream after 30 content events (`close()`,
/// or leaving the helper's `with`) is charged at least what the provider
/// wrote it (the provider holds after 40 events until the client goes).
#[test]
fn a_caller_that_closes_early_is_charged_what_it_received() {
    let stack = start(10_000_000, "");
    let calls = sdks(&stack, "early", "a");
    assert_eq!(calls.len(), 2);
    for call in &calls {
        assert_eq!(call["ok"], true, "{call}");
        assert_eq!(call["text"], 30, "{call}");
    }
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let ok = eventually(Duration::from_secs(10), || {
            stack.llm.served().iter().any(|s| s.api == api && s.ended.is_some())
                && stat(&stack.envoy, "llm_fallbacks", api.name()) == 1
        });
        assert!(ok, "{api:?}: the provider saw the close, the request settled");
        let billed: u64 = stack.llm.served().iter().filter(|s| s.api == api).map(|s| s.billed()).sum();
        let charged = stat(&stack.envoy, "llm_tokens_charged", api.name());
        assert!(charged >= billed, "{api:?}: charged {charged} for {billed} written");
    }
}
