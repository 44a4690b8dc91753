//! Scenario 6: no panic, no stuck request, and the right decision, across
//! 10,000 randomized request lifecycles of the real `dist/sluice.wasm` in the
//! wasm host. A panic in a real Envoy VM kills the VM and leaks every lease
//! that worker holds, so none may be reachable from a request.
//!
//! Each proptest case boots one VM (one Envoy worker) and runs 20 lifecycles
//! through it, up to 4 in flight at once: random headers (huge, non-UTF-8,
//! repeated, missing), random scripted shim outcomes (allow, allow after a
//! hold, deny, every fault), random client resets before or after the answer;
//! one policy waits (egress `wait`), so held calls are covered too. Scripted answers
//! keep it fast: no network.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::Config;
use sluice_wasm_host::{Answer, Effect, End, Fault, HeaderMap, HostConfig, Proxy, Returned, Route};

const CASES: u32 = 500;
const LIFECYCLES_PER_CASE: usize = 20;

fn policy(failure_mode: &str) -> String {
    format!(
        r#"{{"shim": {{"cluster": "sluice_shim", "timeout_ms": 50}}, "failure_mode": "{failure_mode}",
            "policies": [
              {{"name": "partner-api", "match": {{"path_prefix": "/v42/", "methods": ["GET", "POST"]}},
                "key": ["header:x-api-key"],
                "limits": [{{"type": "sliding_window", "limit": 25, "window": "5s"}},
                           {{"type": "sliding_window", "limit": 300, "window": "1m"}}]}},
              {{"name": "tenants", "key": ["header:x-tenant", "header:x-api-key"], "wait": {{"timeout": "2s"}},
                "limits": [{{"type": "sliding_window", "limit": 1000, "window": "1h"}}]}}]}}"#
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Complete,
    UpstreamThenComplete,
    ResetWhilePending,
    ResetAfterAnswer,
}

#[derive(Debug, Clone)]
struct Lifecycle {
    headers: Vec<(String, Vec<u8>)>,
    answer: Answer,
    ending: Ending,
}

/// A header value as Envoy may pass it: any bytes but NUL, CR and LF;
/// sometimes non-UTF-8, sometimes huge.
fn value() -> impl Strategy<Value = Vec<u8>> {
    let byte = any::<u8>().prop_map(allowed);
    // Huge values are spun from a seed: generating 64 KiB byte by byte is slow.
    let huge = (any::<u64>(), 16_384usize..65_536).prop_map(|(seed, len)| {
        (0..len as u64).map(|i| allowed((seed.wrapping_mul(i | 1) >> 17) as u8)).collect()
    });
    prop_oneof![
        12 => vec(byte, 0..24),
        4 => "[a-z{}%:/ ]{0,12}".prop_map(String::into_bytes),
        2 => vec(0x80u8..=0xff, 1..8),
        1 => huge,
    ]
}

/// Any byte Envoy lets through in a header value (not NUL, CR or LF).
fn allowed(byte: u8) -> u8 {
    if [0, b'\r', b'\n'].contains(&byte) {
        b' '
    } else {
        byte
    }
}

fn headers() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    let path = prop_oneof![
        3 => "/v42/[a-z0-9/?=&%]{0,20}".prop_map(String::into_bytes),
        1 => value(),
    ];
    let method =
        prop_oneof![Just(b"GET".to_vec()), Just(b"POST".to_vec()), Just(b"DELETE".to_vec()), value()];
    let name = prop_oneof![Just("x-api-key".to_string()), Just("x-tenant".to_string()), "[a-z-]{1,12}"];
    (proptest::option::of(path), proptest::option::of(method), vec((name, value()), 0..5)).prop_map(
        |(path, method, extra)| {
            let mut headers = vec![(":authority".to_string(), b"api".to_vec())];
            headers.extend(path.map(|p| (":path".to_string(), p)));
            headers.extend(method.map(|m| (":method".to_string(), m)));
            headers.extend(extra);
            headers
        },
    )
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        3 => Just(Answer::Allow),
        1 => (1u64..2_000).prop_map(|waited_ms| Answer::Held { waited_ms }),
        2 => (0u64..400_000).prop_map(|retry_after_ms| Answer::Deny { retry_after_ms }),
        1 => prop_oneof![
            Just(Fault::Refused), Just(Fault::Timeout), Just(Fault::ServerError), Just(Fault::Garbage), Just(Fault::CutShort)
        ].prop_map(Answer::Fault),
    ]
}

fn lifecycle() -> impl Strategy<Value = Lifecycle> {
    let ending = prop_oneof![
        Just(Ending::Complete),
        Just(Ending::UpstreamThenComplete),
        Just(Ending::ResetWhilePending),
        Just(Ending::ResetAfterAnswer)
    ];
    (headers(), answer(), ending).prop_map(|(headers, answer, ending)| Lifecycle { headers, answer, ending })
}

/// What the filter must do with a paused request once `answer` arrives.
fn expected(answer: Answer, failure_mode: &str) -> &'static str {
    match (answer, failure_mode) {
        (Answer::Allow | Answer::Held { .. }, _) => "resume",
        (Answer::Deny { .. }, _) => "429",
        (_, "allow") => "resume",
        _ => "503",
    }
}

fn did(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Continue(0) => Some("resume".to_string()),
            Effect::LocalResponse(r) => Some(r.status.to_string()),
            _ => None,
        })
        .collect()
}

/// Starts a lifecycle: a stream and its request headers. Returns the stream.
fn begin(proxy: &mut Proxy, life: &Lifecycle) -> Result<u32, TestCaseError> {
    let id = proxy.open().map_err(fail)?;
    let headers: HeaderMap = life.headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
    let outcome = proxy.request_headers(id, headers, true).map_err(fail)?;
    let calls = outcome.effects.iter().filter(|e| matches!(e, Effect::HttpCall(_))).count();
    prop_assert!(calls <= 1, "one request made {calls} calls");
    if calls == 0 {
        // Decided locally (no policy applies, the breaker is open, a cached
        // denial): continued, or answered at once.
        let answered = outcome.returned == Returned::Pause && outcome.local_response().is_some();
        prop_assert!(
            outcome.returned == Returned::Continue || answered,
            "no call, yet neither continued nor answered: {:?} {:?}",
            outcome.returned,
            outcome.effects
        );
    } else {
        prop_assert_eq!(outcome.returned, Returned::Pause);
    }
    Ok(id)
}

/// Finishes a lifecycle: the answer (unless reset first) and the stream's end.
fn finish(proxy: &mut Proxy, id: u32, life: &Lifecycle, failure_mode: &str) -> Result<(), TestCaseError> {
    let pending = proxy.pending_calls(id);
    if life.ending == Ending::ResetWhilePending {
        proxy.end(id, End::Reset).map_err(fail)?;
        return Ok(());
    }
    if let Some(token) = pending.first() {
        let outcome = proxy.deliver(*token, life.answer).map_err(fail)?;
        let want = expected(life.answer, failure_mode);
        prop_assert_eq!(did(&outcome.effects), vec![want.to_string()], "answer {:?}", life.answer);
        prop_assert!(!proxy.paused(id), "still paused after the answer");
    }
    let how = match life.ending {
        Ending::ResetAfterAnswer => End::Reset,
        _ => End::Complete,
    };
    if life.ending == Ending::UpstreamThenComplete && proxy.answered(id).is_none() {
        proxy.response_headers(id, [(":status", "200")].into_iter().collect(), false).map_err(fail)?;
    }
    proxy.end(id, how).map_err(fail)?;
    Ok(())
}

fn fail(err: anyhow::Error) -> TestCaseError {
    TestCaseError::fail(format!("{err:#}"))
}

proptest! {
    #![proptest_config(Config { cases: CASES, failure_persistence: None, ..Config::default() })]

    /// 500 cases of 20 lifecycles: 10,000 lifecycles, none of which panics,
    /// leaves a request paused, or decides wrongly.
    #[test]
    fn random_lifecycles_never_panic(
        lives in vec(lifecycle(), LIFECYCLES_PER_CASE),
        in_flight in 1usize..=4,
        deny in any::<bool>(),
    ) {
        let failure_mode = if deny { "deny" } else { "allow" };
        let config = HostConfig::new(&policy(failure_mode)).cluster("sluice_shim", Route::Scripted);
        let mut proxy = Proxy::boot(config).map_err(fail)?;
        let configured = proxy.configure().map_err(fail)?;
        prop_assert_eq!(configured.returned, Returned::Bool(true));
        let mut open: std::collections::VecDeque<(u32, &Lifecycle)> = Default::default();
        for life in &lives {
            open.push_back((begin(&mut proxy, life)?, life));
            if open.len() >= in_flight {
                if let Some((id, life)) = open.pop_front() {
                    finish(&mut proxy, id, life, failure_mode)?;
                }
            }
        }
        while let Some((id, life)) = open.pop_front() {
            finish(&mut proxy, id, life, failure_mode)?;
        }
        let critical = proxy.logs().iter().filter(|l| l.level == sluice_wasm_host::LogLevel::Critical).count();
        prop_assert_eq!(critical, 0);
    }
}
