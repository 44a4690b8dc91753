//! Token budgets in the real `dist/sluice.wasm`, with the real shim and
//! Redis: the request held while its body is read, the reservation checked
//! once it is whole, the response's events passed on as they come, and the
//! last chunk held until the shim has recorded the settlement.

use serde_json::json;
use sluice_harness::Backend;
use sluice_wasm_host::{Plugin, Route, Stream};

const POLICY: &str = r#"{"shim": {"cluster": "sluice_shim", "timeout_ms": 2000}, "failure_mode": "deny",
    "policies": [{"name": "llm", "match": {"path_prefix": "/v1/"}, "key": ["header:x-team"],
                  "llm": {"api": "openai_chat", "default_max_tokens": 100, "end_stream": true},
                  "limits": [{"type": "points", "capacity": 2000, "refill": "365d", "cost": "llm_tokens"}]}]}"#;

fn headers(team: &str) -> [(&'static str, Vec<u8>); 4] {
    [
        (":method", b"POST".to_vec()),
        (":path", b"/v1/chat/completions".to_vec()),
        (":authority", b"api".to_vec()),
        ("x-team", team.as_bytes().to_vec()),
    ]
}

/// A request whose body arrives in two chunks, admitted by the real shim.
fn admitted(plugin: &Plugin, team: &str, body: &[u8]) -> Stream {
    let stream = plugin.stream();
    let headers = headers(team);
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_slice())).collect();
    // The headers and the body are held until the request is decided.
    stream.request_headers_with_body(&headers).pauses().done();
    let (first, rest) = body.split_at(body.len() / 2);
    stream.request_body(first, false).pauses().done();
    stream.request_body(rest, true).calls_the_shim().pauses().done();
    stream.shim_answers().resumes().done();
    stream
}

fn chunk(content: &str) -> String {
    format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": {"content": content}}]}))
}

/// A stream that reports its usage: passed on unchanged, chunk by chunk;
/// its last chunk waits for the settlement, which the real shim records.
#[test]
fn a_stream_is_passed_on_and_its_end_waits_for_the_settlement() {
    let backend = Backend::start().expect("starting redis-server and the shim");
    let plugin = Plugin::configured(POLICY, "sluice_shim", Route::Shim { port: backend.shim.port });
    let body = json!({"model": "m", "max_tokens": 50, "stream": true}).to_string();
    let stream = admitted(&plugin, "a", body.as_bytes());
    stream.upstream_responds_with(200, &[("content-type", "text/event-stream")]).continues().done();
    let mut events = String::new();
    for word in ["hello ", "there"] {
        let event = chunk(word);
        stream.response_body(event.as_bytes(), false).continues().done();
        events.push_str(&event);
    }
    let usage =
        json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}});
    let last = format!("data: {usage}\n\ndata: [DONE]\n\n");
    stream.response_body(last.as_bytes(), true).adjusts_points().pauses().done();
    assert_eq!(String::from_utf8_lossy(&stream.forwarded()), events, "the last chunk is held");
    stream.shim_answers().resumes_the_response().done();
    events.push_str(&last);
    assert_eq!(String::from_utf8_lossy(&stream.forwarded()), events, "everything passed on, unchanged");
    stream.completes().done();
}

/// `end_stream`: a stream without a cap that passes what its key has
/// left ends after a whole event with the API's error event; the chunks
/// after it are dropped, and its end still settles.
#[test]
fn a_stream_past_its_budget_ends_after_a_whole_event() {
    let backend = Backend::start().expect("starting redis-server and the shim");
    let plugin = Plugin::configured(POLICY, "sluice_shim", Route::Shim { port: backend.shim.port });
    // 2,000 tokens: the body's bytes and 100 reserved, the rest content,
    // 4 bytes a token.
    let body = json!({"model": "m", "stream": true}).to_string();
    let stream = admitted(&plugin, "b", body.as_bytes());
    stream.upstream_responds_with(200, &[("content-type", "text/event-stream")]).continues().done();
    let word = "x".repeat(97);
    let allowed = (1..).find(|k| body.len() + (k * word.len()).div_ceil(4) > 2_000).unwrap_or(0);
    for _ in 0..allowed + 5 {
        stream.response_body(chunk(&word).as_bytes(), false).continues().done();
    }
    // Its usage is read behind the error event, and charged.
    let usage = json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2000, "total_tokens": 2009}});
    let last = format!("data: {usage}\n\ndata: [DONE]\n\n");
    stream.response_body(last.as_bytes(), true).adjusts_points().pauses().done();
    stream.shim_answers().resumes_the_response().done();
    let text = String::from_utf8_lossy(&stream.forwarded()).into_owned();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.iter().filter(|e| e.contains(&word)).count(), allowed, "{text}");
    assert!(events[allowed].contains("rate_limit_exceeded"), "{}", events[allowed]);
    assert_eq!(events[allowed + 1], "data: [DONE]");
    assert_eq!(events.len(), allowed + 2, "nothing after the error event");
    stream.completes().done();
}
