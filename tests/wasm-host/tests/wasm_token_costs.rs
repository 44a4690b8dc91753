//! What metering a token budget costs the real `dist/sluice.wasm`, counted
//! in the wasmtime host (wasm operators and host calls repeat exactly run
//! to run, whatever the machine's load), against the same filter passing
//! the same streams through (no policy applies to them): per SSE chunk, per
//! stream, and the memory of open streams, which must not grow with their
//! length. `-- --nocapture` prints the table of `bench/results/TOKENS.md`.

use serde_json::json;
use sluice_harness::Backend;
use sluice_wasm_host::{Answer, Costs, Plugin, Route, Stream};

/// A budget on `/v1/`, and (for the pass-through) the same document on a
/// path the streams never take.
fn document(prefix: &str) -> String {
    format!(
        r#"{{"shim": {{"cluster": "sluice_shim", "timeout_ms": 2000}}, "failure_mode": "deny",
            "policies": [{{"name": "llm", "match": {{"path_prefix": "{prefix}"}}, "key": ["header:x-team"],
              "llm": {{"api": "openai_chat"}},
              "limits": [{{"type": "points", "capacity": 1000000000, "refill": "365d", "cost": "llm_tokens"}}]}}]}}"#
    )
}

const HEADERS: [(&str, &[u8]); 4] =
    [(":method", b"POST"), (":path", b"/v1/chat/completions"), (":authority", b"api"), ("x-team", b"a")];

/// One event of an OpenAI chat stream, about 170 bytes.
fn event(i: usize) -> Vec<u8> {
    let chunk = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
                       "choices": [{"index": 0, "delta": {"content": format!("token{i} ")}, "finish_reason": null}]});
    format!("data: {chunk}\n\n").into_bytes()
}

fn usage() -> Vec<u8> {
    let usage =
        json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}});
    format!("data: {usage}\n\ndata: [DONE]\n\n").into_bytes()
}

/// A stream up to its response's headers: metered (its body read, checked
/// by the real shim) or passed through.
fn opened(plugin: &Plugin, metered: bool) -> Stream {
    let stream = plugin.stream();
    let body = br#"{"model": "m", "stream": true, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}"#;
    if metered {
        // Held with its body until the decision.
        stream.request_headers_with_body(&HEADERS).pauses().done();
        stream.request_body(body, true).calls_the_shim().pauses().done();
        stream.shim_answers().resumes().done();
    } else {
        stream.request_headers_with_body(&HEADERS).continues().done();
        stream.request_body(body, true).continues().done();
    }
    stream.upstream_responds_with(200, &[("content-type", "text/event-stream")]).continues().done();
    stream
}

/// The rest of a stream: `events` events, its usage, its end.
fn finish(plugin: &Plugin, stream: &Stream, events: usize, metered: bool) {
    for i in 0..events {
        stream.response_body(&event(i), false).continues().done();
    }
    if metered {
        stream.response_body(&usage(), true).adjusts_points().pauses().done();
        stream.shim_answers().resumes_the_response().done();
    } else {
        stream.response_body(&usage(), true).continues().done();
    }
    stream.completes().done();
    let _ = plugin;
}

fn calls(costs: &Costs) -> u64 {
    costs.calls.values().sum()
}

/// Per chunk and per stream, metered against passed through.
#[test]
fn metering_costs_per_chunk_and_per_stream() {
    let backend = Backend::start().expect("starting redis-server and the shim");
    let route = Route::Shim { port: backend.shim.port };
    let metered = Plugin::configured(&document("/v1/"), "sluice_shim", route);
    let passed = Plugin::configured(&document("/elsewhere/"), "sluice_shim", route);
    const EVENTS: usize = 100;

    let mut rows = Vec::new();
    for (plugin, is_metered) in [(&passed, false), (&metered, true)] {
        // Per chunk: one event, in the middle of a stream.
        let stream = opened(plugin, is_metered);
        stream.response_body(&event(0), false).continues().done();
        plugin.proxy().take_costs();
        for i in 1..=EVENTS {
            stream.response_body(&event(i), false).continues().done();
        }
        let chunk = plugin.proxy().take_costs();
        finish(plugin, &stream, 0, is_metered);
        // Per stream: request to end, with the shim's answers.
        plugin.proxy().take_costs();
        let stream = opened(plugin, is_metered);
        finish(plugin, &stream, EVENTS, is_metered);
        let whole = plugin.proxy().take_costs();
        rows.push((chunk, whole));
    }
    let per = |n: u64| n as f64 / EVENTS as f64;
    let ((pass_chunk, pass_stream), (meter_chunk, meter_stream)) = (&rows[0], &rows[1]);
    println!("| | passed through | metered | added |");
    println!("|---|---:|---:|---:|");
    println!(
        "| wasm operators per SSE chunk (one event, {} bytes) | {:.0} | {:.0} | {:.0} |",
        event(1).len(),
        per(pass_chunk.fuel),
        per(meter_chunk.fuel),
        per(meter_chunk.fuel) - per(pass_chunk.fuel)
    );
    println!(
        "| host calls per SSE chunk | {:.1} | {:.1} | {:.1} |",
        per(calls(pass_chunk)),
        per(calls(meter_chunk)),
        per(calls(meter_chunk)) - per(calls(pass_chunk))
    );
    println!(
        "| bytes copied into the guest per chunk | {:.0} | {:.0} | {:.0} |",
        per(pass_chunk.bytes_out),
        per(meter_chunk.bytes_out),
        per(meter_chunk.bytes_out) - per(pass_chunk.bytes_out)
    );
    println!(
        "| wasm operators per stream ({EVENTS} events, request to end) | {} | {} | {} |",
        pass_stream.fuel,
        meter_stream.fuel,
        meter_stream.fuel - pass_stream.fuel
    );
    println!(
        "| host calls per stream | {} | {} | {} |",
        calls(pass_stream),
        calls(meter_stream),
        calls(meter_stream) - calls(pass_stream)
    );
    // A passed-through chunk reads nothing; a metered one reads its bytes once.
    assert_eq!(pass_chunk.calls.get("proxy_get_buffer_bytes"), None, "{pass_chunk:?}");
    assert_eq!(
        meter_chunk.calls.get("proxy_get_buffer_bytes").copied(),
        Some(EVENTS as u64),
        "{meter_chunk:?}"
    );
}

/// The memory of open streams is bounded whatever their length: 100
/// streams open at once, after 10 events each and after 1,000 more each,
/// hold the guest's memory at the same size.
#[test]
fn memory_per_open_stream_does_not_grow_with_its_length() {
    let backend = Backend::start().expect("starting redis-server and the shim");
    let route = Route::Shim { port: backend.shim.port };
    let plugin = Plugin::configured(&document("/v1/"), "sluice_shim", route);
    let before = plugin.proxy().memory_bytes();
    let streams: Vec<Stream> = (0..100).map(|_| opened(&plugin, true)).collect();
    for i in 0..10 {
        for stream in &streams {
            stream.response_body(&event(i), false).continues().done();
        }
    }
    let short = plugin.proxy().memory_bytes();
    for i in 10..1_010 {
        for stream in &streams {
            stream.response_body(&event(i), false).continues().done();
        }
    }
    let long = plugin.proxy().memory_bytes();
    println!(
        "guest memory: {before} bytes configured; {short} with 100 streams open after 10 events each; {long} after 1,010 events each"
    );
    assert_eq!(long, short, "the guest's memory grew with the streams' length");
    for stream in &streams {
        stream.response_body(&usage(), true).adjusts_points().pauses().done();
        stream.shim_replies(Answer::Allow).resumes_the_response().done();
        stream.completes().done();
    }
}
