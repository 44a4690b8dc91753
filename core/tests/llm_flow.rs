//! Token budgets through one request's flow: the body read before the
//! decision, the reservation charged at the check, the response (JSON or
//! events, in each API's shape) read for its usage, and the difference
//! charged or refunded exactly once, however the response ends.

mod support;

use proptest::prelude::*;
use serde_json::{json, Value};
use sluice_core::stats::{FilterStat, PolicyStat};
use sluice_core::{CallResult, Effect, Phase};
use sluice_policies::request::SimpleRequest;
use sluice_policies::wire::{ADJUST_PATH, CHECK_PATH};
use support::*;

/// A budget of 100,000 tokens a day per API key, read as `api` shapes them.
fn doc(api: &str, extra: &str) -> String {
    format!(
        r#"{{"policies": [{{"name": "llm", "match": {{"path_prefix": "/v1/"}}, "key": ["header:x-api-key"],
            "llm": {{"api": "{api}", "default_max_tokens": 500{extra}}},
            "limits": [{{"type": "points", "capacity": 100000, "refill": "1d", "cost": "llm_tokens"}}]}}]}}"#
    )
}

fn post(path: &str) -> SimpleRequest {
    SimpleRequest::new("POST", path).header("x-api-key", "k1")
}

/// The chat request the tests send: 200 bytes with `max_tokens` 300.
fn chat(max_tokens: Option<u64>) -> Vec<u8> {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(100)}]});
    if let Some(n) = max_tokens {
        body["max_tokens"] = json!(n);
    }
    let mut bytes = serde_json::to_vec(&body).unwrap();
    bytes.resize(200, b' ');
    bytes
}

/// Sends the request (headers, then its body) and admits it; the check's cost.
fn admitted(s: &mut Stream<'_>, body: &[u8], remaining: u64) -> u64 {
    let req = post("/v1/chat/completions");
    assert!(s.request(&req).is_empty(), "the body is read first");
    assert_eq!(s.phase(), Phase::Reading);
    assert!(s.hold_request(), "the headers are held too: nothing goes upstream before the decision");
    assert!(s.flow.hold_request_body(), "the body is held");
    let (first, rest) = body.split_at(body.len() / 2);
    assert!(s.request_body(&req, first, false).is_empty());
    assert!(s.flow.hold_request_body());
    let check = sent(&s.request_body(&req, rest, true), CHECK_PATH);
    assert!(s.flow.hold_request_body(), "held while the check is in flight");
    let cost = check.checks()[0]["limits"][0]["cost"].as_u64().expect("a points cost");
    let fx = s.answer(&check, &Shim::allow_points_left(9_000_000, remaining));
    assert!(fx.contains(&Effect::ResumeRequest));
    cost
}

/// The adjustments sent, from the stream (among `fx`) or by the worker
/// next: (actual, estimate) each.
fn adjusted(t: &Test, fx: &[Effect]) -> Vec<(u64, u64)> {
    let mut calls: Vec<_> = sends(fx).into_iter().filter(|c| c.path == ADJUST_PATH).collect();
    calls.extend(t.worker_sends(ADJUST_PATH));
    calls
        .iter()
        .flat_map(|call| call.json()["adjustments"].as_array().cloned().unwrap_or_default())
        .map(|a| (a["actual"].as_u64().unwrap_or(0), a["limit"]["cost"].as_u64().unwrap_or(0)))
        .collect()
}

fn sse(events: &[Value]) -> Vec<u8> {
    events.iter().map(|e| format!("data: {e}\n\n")).collect::<String>().into_bytes()
}

/// OpenAI chat, streamed with `include_usage`: content chunks, then the usage chunk, then `[DONE]`.
fn openai_stream(words: usize, prompt: u64, completion: u64) -> Vec<u8> {
    let mut events: Vec<Value> = (0..words)
        .map(|_| json!({"choices": [{"index": 0, "delta": {"content": "word "}}], "usage": null}))
        .collect();
    events.push(json!({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                                "total_tokens": prompt + completion}}));
    let mut bytes = sse(&events);
    bytes.extend_from_slice(b"data: [DONE]\n\n");
    bytes
}

/// Anthropic messages, streamed: `message_start` (input, and the first
/// output token), deltas, `message_delta` with the final output, `message_stop`.
fn anthropic_stream(words: usize, input: u64, cached: u64, output: u64) -> Vec<u8> {
    let mut out = String::new();
    let mut event = |name: &str, data: Value| out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "m", "usage": {
        "input_tokens": input, "cache_read_input_tokens": cached, "output_tokens": 1}}}),
    );
    event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    for _ in 0..words {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "word "}}),
        );
    }
    event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": output}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    out.into_bytes()
}

fn streaming() -> [(&'static str, &'static str); 2] {
    [(":status", "200"), ("content-type", "text/event-stream; charset=utf-8")]
}

/// The reservation is the body's bytes (one token each) and its
/// `max_tokens`; a JSON response's usage refunds the rest, once. What the
/// settlement asked back and what the shim's answer says came back are two
/// stats: a refund asked for is not a refund given (here the shim gave back
/// 400 of the 457 asked, as it does when the bucket refilled part of the
/// charge). Before, `llm_tokens_refunded` counted what was asked.
#[test]
fn a_json_response_settles_the_reservation_to_its_usage() {
    let t = Test::new(&doc("openai_chat", ""));
    let mut s = t.stream();
    assert_eq!(admitted(&mut s, &chat(Some(300)), 99_000), 200 + 300);
    s.response(&[(":status", "200"), ("content-type", "application/json")], false);
    let body = json!({"id": "c", "choices": [{"message": {"content": "hi"}}],
                      "usage": {"prompt_tokens": 31, "completion_tokens": 12, "total_tokens": 43}});
    let bytes = body.to_string().into_bytes();
    s.chunk(&bytes[..20], false);
    let fx = s.chunk(&bytes[20..], true);
    assert_eq!(adjusted(&t, &fx), [(43, 500)]);
    assert_eq!(count(&fx, 0, PolicyStat::LlmTokensReserved), 500);
    assert_eq!(count(&fx, 0, PolicyStat::LlmTokensCharged), 43);
    assert_eq!(count(&fx, 0, PolicyStat::LlmTokensRefundRequested), 457);
    assert_eq!(count(&fx, 0, PolicyStat::LlmTokensGivenBack), 0, "nothing came back yet");
    // The last byte waits for the shim to record the settlement.
    assert!(s.hold_response());
    assert_eq!(s.phase(), Phase::Settling);
    let settle = sent(&fx, ADJUST_PATH);
    let answer = CallResult::Answered {
        status: Some(b"200".to_vec()),
        body: Some(json!({"moved": [-400]}).to_string().into_bytes()),
    };
    let fx = s.answer(&settle, &answer);
    assert!(fx.contains(&Effect::ResumeResponse));
    assert_eq!(count(&fx, 0, PolicyStat::LlmTokensGivenBack), 400, "what the shim gave back");
    assert_eq!(s.phase(), Phase::Done);
    let fx = s.end();
    assert!(adjusted(&t, &fx).is_empty(), "settled once: the stream's end adds nothing");
}

/// A monthly budget (a `points` limit on a calendar window) reserves and
/// settles the same way.
#[test]
fn a_monthly_budget_reserves_and_settles() {
    let t = Test::new(
        &doc("openai_chat", "")
            .replace(r#""refill": "1d""#, r#""refill": {"calendar": "month", "anchor": 1, "zone": "UTC"}"#),
    );
    let mut s = t.stream();
    assert_eq!(admitted(&mut s, &chat(Some(300)), 99_000), 200 + 300);
    s.response(&[(":status", "200"), ("content-type", "application/json")], false);
    let usage = json!({"usage": {"prompt_tokens": 40, "completion_tokens": 60, "total_tokens": 100}});
    let fx = s.chunk(usage.to_string().as_bytes(), true);
    assert_eq!(adjusted(&t, &fx), [(100, 500)]);
}

/// Without `max_tokens`, the output part is the policy's default.
#[test]
fn a_request_without_a_cap_reserves_the_default() {
    let t = Test::new(&doc("openai_chat", ""));
    assert_eq!(admitted(&mut t.stream(), &chat(None), 99_000), 200 + 500);
}

/// OpenAI's stream: the usage comes in the last chunk before `[DONE]`, in
/// whatever chunks the bytes arrive.
#[test]
fn an_openai_stream_settles_to_its_final_usage_chunk() {
    let t = Test::new(&doc("openai_chat", ""));
    let mut s = t.stream();
    admitted(&mut s, &chat(Some(300)), 99_000);
    s.response(&streaming(), false);
    let stream = openai_stream(40, 30, 280);
    for piece in stream.chunks(7) {
        s.chunk(piece, false);
    }
    let fx = s.chunk(b"", true);
    assert_eq!(adjusted(&t, &fx), [(310, 500)]);
}

/// Anthropic's stream: the input from `message_start` (cache reads
/// included), the output from the last `message_delta`.
#[test]
fn an_anthropic_stream_sums_its_input_and_takes_the_last_output() {
    let t = Test::new(&doc("anthropic_messages", ""));
    let mut s = t.stream();
    admitted(&mut s, &chat(Some(300)), 99_000);
    s.response(&streaming(), false);
    let stream = anthropic_stream(20, 12, 100, 250);
    for piece in stream.chunks(13) {
        s.chunk(piece, false);
    }
    let fx = s.chunk(b"", true);
    assert_eq!(adjusted(&t, &fx), [(12 + 100 + 250, 500)]);
    assert_eq!(count(&fx, 0, PolicyStat::LlmFallbacks), 0);
}

/// A stream that ends without usage (OpenAI without `include_usage`)
/// keeps its reservation (the default fallback), counted as a fallback.
#[test]
fn a_stream_without_usage_keeps_its_reservation() {
    let t = Test::new(&doc("openai_chat", ""));
    let mut s = t.stream();
    admitted(&mut s, &chat(Some(300)), 99_000);
    s.response(&streaming(), false);
    s.chunk(&sse(&[json!({"choices": [{"delta": {"content": "hello"}}]})]), false);
    let fx = s.chunk(b"data: [DONE]\n\n", true);
    assert!(adjusted(&t, &fx).is_empty(), "the reservation stands: nothing to adjust");
    assert!(!s.hold_response(), "nothing to wait for");
    assert_eq!(count(&fx, 0, PolicyStat::LlmFallbacks), 1);
    assert_eq!(count(&fx, 0, PolicyStat::LlmTokensFallback), 500);
}

/// With `fallback: content`, a stream reset midway is charged its input
/// (as `message_start` reported it) and the content delivered: its bytes
/// over `content_bytes_per_token` (4), at least one per content event.
#[test]
fn a_reset_stream_is_charged_its_content_with_that_fallback() {
    let t = Test::new(&doc("anthropic_messages", r#", "fallback": "content""#));
    let mut s = t.stream();
    admitted(&mut s, &chat(Some(300)), 99_000);
    s.response(&streaming(), false);
    let stream = anthropic_stream(10, 12, 0, 250);
    // Cut before `message_delta`: the input is known, the output is not.
    let cut = String::from_utf8_lossy(&stream).find("event: message_delta").unwrap();
    s.chunk(&stream[..cut], false);
    let fx = s.end();
    assert_eq!(adjusted(&t, &fx), [(12 + (10 * "word ".len() as u64).div_ceil(4), 500)]);
    assert_eq!(count(&fx, 0, PolicyStat::LlmFallbacks), 1);
}

/// A stream cut short settles through its worker, and what the shim's
/// answer to that settlement gave back is counted too: before, only a
/// settlement the stream sent itself was, so `llm_tokens_given_back` left
/// out every stream that ended early.
#[test]
fn a_settlement_the_worker_sends_counts_what_came_back() {
    let t = Test::new(&doc("anthropic_messages", r#", "fallback": "content""#));
    let mut s = t.stream();
    admitted(&mut s, &chat(Some(300)), 99_000);
    s.response(&streaming(), false);
    let stream = anthropic_stream(10, 12, 0, 250);
    let cut = String::from_utf8_lossy(&stream).find("event: message_delta").expect("a message_delta");
    s.chunk(&stream[..cut], false);
    let fx = s.end();
    assert!(sends(&fx).iter().all(|c| c.path != ADJUST_PATH), "left to the worker");
    let settle = t.worker_sends(ADJUST_PATH);
    assert_eq!(settle.len(), 1);
    let answer = CallResult::Answered {
        status: Some(b"200".to_vec()),
        body: Some(json!({"moved": [-460]}).to_string().into_bytes()),
    };
    let fx = t.worker.handle_answer(&t.host.now(), settle[0].id, answer, &t.host);
    assert_eq!(count(&fx, 0, PolicyStat::LlmTokensGivenBack), 460, "what the shim gave back");
}

/// A reset before the response's headers settles as well: the fallback
/// (here the reservation: nothing to send), counted once.
#[test]
fn a_reset_before_the_response_settles_by_the_fallback() {
    let t = Test::new(&doc("openai_chat", ""));
    let mut s = t.stream();
    admitted(&mut s, &chat(Some(300)), 99_000);
    let fx = s.end();
    assert_eq!(count(&fx, 0, PolicyStat::LlmFallbacks), 1);
    assert!(adjusted(&t, &fx).is_empty());
    assert!(s.end().is_empty(), "the second end (on_done after on_log) settles nothing");
}

/// An upstream that refuses the request (not 2xx, no usage) generated
/// nothing: the whole reservation comes back.
#[test]
fn an_upstream_refusal_refunds_the_reservation() {
    let t = Test::new(&doc("openai_chat", ""));
    let mut s = t.stream();
    admitted(&mut s, &chat(Some(300)), 99_000);
    s.response(&[(":status", "429"), ("content-type", "application/json")], false);
    let fx = s.chunk(br#"{"error": {"message": "slow down"}}"#, true);
    assert_eq!(adjusted(&t, &fx), [(0, 500)]);
}

/// A compressed response cannot be read: counted, and charged by the fallback.
#[test]
fn a_compressed_response_is_counted_unreadable() {
    let t = Test::new(&doc("openai_chat", ""));
    let mut s = t.stream();
    admitted(&mut s, &chat(Some(300)), 99_000);
    let fx = s.response(
        &[(":status", "200"), ("content-type", "application/json"), ("content-encoding", "gzip")],
        false,
    );
    assert_eq!(count(&fx, 0, PolicyStat::LlmUnreadable), 1);
    let fx = s.chunk(b"\x1f\x8b\x08\x00 binary", true);
    assert_eq!(count(&fx, 0, PolicyStat::LlmFallbacks), 1);
    assert!(adjusted(&t, &fx).is_empty());
}

/// A body larger than `max_request_body_bytes` is refused with 413 before
/// any check.
#[test]
fn a_body_past_the_bound_is_refused_with_413() {
    let t = Test::new(&doc("openai_chat", "").replacen(
        "{\"policies\"",
        "{\"max_request_body_bytes\": 100, \"policies\"",
        1,
    ));
    let mut s = t.stream();
    let req = post("/v1/chat/completions");
    s.request(&req);
    assert!(s.request_body(&req, &[b' '; 60], false).is_empty());
    let fx = s.request_body(&req, &[b' '; 60], false);
    let reply = replied(&fx).expect("a local reply");
    assert_eq!(reply.status, 413);
    assert!(fx.contains(&Effect::Filter { stat: FilterStat::RequestBodyTooLarge, n: 1 }));
    assert!(sends(&fx).is_empty());
    assert_eq!(s.phase(), Phase::Refused);
}

/// A request no body-reading policy can match is decided on its headers:
/// its body is never read.
#[test]
fn bodies_are_read_only_where_a_policy_needs_them() {
    let t = Test::new(&doc("openai_chat", ""));
    let mut s = t.stream();
    assert!(s.request(&post("/healthz")).is_empty());
    assert_eq!(s.phase(), Phase::Done);
    assert!(!s.hold_request());
}

/// Keys and matching from the body: a policy keyed by `body:/model` that
/// matches only some models.
#[test]
fn keys_and_conditions_read_the_body() {
    let t = Test::new(
        r#"{"policies": [{"name": "m", "key": ["body:/model"], "match": {"body": {"/model": {"prefix": "gpt-4"}}},
            "limits": [{"type": "fixed_window", "limit": 10, "window": "1m"}]}]}"#,
    );
    for (model, checked) in [("gpt-4o", true), ("claude", false)] {
        let mut s = t.stream();
        let req = post("/v1/chat/completions");
        assert!(s.request(&req).is_empty());
        let fx = s.request_body(&req, json!({"model": model}).to_string().as_bytes(), true);
        let calls = sends(&fx);
        assert_eq!(!calls.is_empty(), checked, "{model}");
        if checked {
            assert_eq!(calls[0].checks()[0]["key"], "gpt-4o");
        }
    }
}

/// `end_stream`: once the running count passes what the key had left, the
/// chunk ends after the event that passed it, the API's error event
/// follows, the response ends (`EndResponse`, once), and nothing after; the
/// true usage is still charged. The count is in tokens: content over
/// `content_bytes_per_token`, not its bytes.
#[test]
fn a_stream_past_its_budget_is_ended_after_a_whole_event() {
    let t = Test::new(&doc("openai_chat", r#", "end_stream": true"#));
    let mut s = t.stream();
    // 100 left after the 700 reserved (200 of input, 500 of output): 800 in all.
    admitted(&mut s, &chat(None), 100);
    s.response(&streaming(), false);
    let stream = openai_stream(600, 30, 700);
    let mut delivered = Vec::new();
    let mut ended = false;
    let mut ends = 0;
    for piece in stream.chunks(50) {
        let fx = s.chunk(piece, false);
        ends += fx.iter().filter(|e| **e == Effect::EndResponse).count();
        match fx.iter().find_map(|e| match e {
            Effect::ReplaceResponseBody(b) => Some(b.clone()),
            _ => None,
        }) {
            Some(body) => {
                ended |= !body.is_empty();
                delivered.extend(body);
            }
            None => delivered.extend_from_slice(piece),
        }
    }
    let fx = s.chunk(b"", true);
    assert!(ended);
    assert_eq!(ends, 1, "the response is ended once, right after the error event");
    assert_eq!(adjusted(&t, &fx), [(730, 700)]);
    let text = String::from_utf8(delivered).unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"));
    let error: Value = serde_json::from_str(events[events.len() - 2].trim_start_matches("data: ")).unwrap();
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");
    // Every event before the error is whole, and the content stops where the
    // count passed 800: 200 of input and 600 tokens of content, 5 bytes a
    // word over 4 bytes a token: 481 words (2,405 bytes, 602 tokens).
    let words = events.iter().filter(|e| e.contains("word ")).count();
    assert_eq!(words, 481, "the event that passed the budget is the last one delivered");
    assert_eq!(count(&fx, 0, PolicyStat::LlmStreamsEnded), 0, "counted once, when ended");
}

/// The issue's scenario in one flow: no cap, `default_max_tokens` 500, a
/// client that reads 900 tokens of a longer answer and goes. The default
/// fallback charges what it received (not the smaller reservation); the
/// `content` fallback charges the same, not the whole budget.
#[test]
fn a_client_that_goes_early_is_charged_what_it_received() {
    for fallback in ["", r#", "fallback": "content""#] {
        let t = Test::new(&doc("openai_chat", fallback));
        let mut s = t.stream();
        assert_eq!(admitted(&mut s, &chat(None), 99_000), 700);
        s.response(&streaming(), false);
        let stream = openai_stream(1000, 30, 1000);
        let text = String::from_utf8_lossy(&stream).into_owned();
        // The end of the 900th content event.
        let cut = text.match_indices("\n\n").nth(899).map(|(i, _)| i + 2).unwrap();
        for piece in stream[..cut].chunks(37) {
            s.chunk(piece, false);
        }
        let fx = s.end();
        let received = (900 * "word ".len() as u64).div_ceil(4);
        assert_eq!(count(&fx, 0, PolicyStat::LlmTokensCharged), 200 + received, "{fallback}");
        assert_eq!(count(&fx, 0, PolicyStat::LlmFallbacks), 1);
    }
}

/// One provider stream as the property below models it: `tokens` output
/// tokens of `bytes` bytes each, `per_event` to a content event, in `api`'s
/// shape, reporting `input` and its output at the end if `usage`. Its
/// bytes, and each event's end with the output tokens delivered by then.
fn provider_stream(
    anthropic: bool,
    input: u64,
    tokens: u64,
    bytes: usize,
    per_event: u64,
    usage: bool,
) -> (Vec<u8>, Vec<(usize, u64)>) {
    let mut out = Vec::new();
    let mut ends = Vec::new();
    let mut delivered = 0;
    let mut event = |name: Option<&str>, data: Value, delivered: u64| {
        if let Some(name) = name {
            out.extend_from_slice(format!("event: {name}\n").as_bytes());
        }
        out.extend_from_slice(format!("data: {data}\n\n").as_bytes());
        ends.push((out.len(), delivered));
    };
    if anthropic {
        event(
            Some("message_start"),
            json!({"type": "message_start", "message": {"usage": {"input_tokens": input, "output_tokens": 1}}}),
            0,
        );
    }
    while delivered < tokens {
        let n = per_event.min(tokens - delivered);
        delivered += n;
        let text = "a".repeat(bytes * n as usize);
        if anthropic {
            let data = json!({"type": "content_block_delta", "delta": {"type": "text_delta", "text": text}});
            event(Some("content_block_delta"), data, delivered);
        } else {
            event(None, json!({"choices": [{"index": 0, "delta": {"content": text}}]}), delivered);
        }
    }
    if usage {
        if anthropic {
            let data = json!({"type": "message_delta", "usage": {"output_tokens": tokens}});
            event(Some("message_delta"), data, delivered);
        } else {
            let data = json!({"choices": [], "usage": {"prompt_tokens": input, "completion_tokens": tokens}});
            event(None, data, delivered);
        }
    }
    (out, ends)
}

proptest! {
    /// Whatever way the response ends (whole, or reset after any chunk,
    /// with the end callbacks repeated), a request is settled once: at most
    /// one adjustment, and one count of its reservation.
    #[test]
    fn a_request_is_settled_exactly_once(cut in 0usize..40, chunk in 1usize..64, ends in 1usize..3) {
        let t = Test::new(&doc("anthropic_messages", ""));
        let mut s = t.stream();
        admitted(&mut s, &chat(Some(300)), 99_000);
        let mut fx = s.response(&streaming(), false);
        let stream = anthropic_stream(5, 12, 0, 40);
        let pieces: Vec<&[u8]> = stream.chunks(chunk).collect();
        let whole = cut >= pieces.len();
        for (i, piece) in pieces.iter().take(cut).enumerate() {
            fx.extend(s.chunk(piece, whole && i + 1 == pieces.len()));
        }
        for _ in 0..ends {
            fx.extend(s.end());
        }
        prop_assert_eq!(count(&fx, 0, PolicyStat::LlmTokensReserved), 500);
        let adjustments = adjusted(&t, &fx);
        prop_assert!(adjustments.len() <= 1);
        if whole {
            prop_assert_eq!(adjustments, vec![(52, 500)]);
        }
    }

    /// However a stream ends (whole, or cut after any byte: the client gone,
    /// a reset, the provider cut), it is charged against the provider's true
    /// counts: its usage once the event with its final count came; else at least what it
    /// delivered (the true input and the output tokens of its whole events,
    /// wherever the policy's conversion does not undercount them: a token of
    /// at least `content_bytes_per_token` bytes, or one token per event),
    /// never more than the reservation unless its content says more was
    /// delivered, and with the `content` fallback only what was delivered.
    #[test]
    fn a_stream_is_charged_at_least_what_it_delivered(
        anthropic in any::<bool>(),
        tokens in 0u64..300,
        bytes in 1usize..9,
        per_event in 1u64..4,
        usage in any::<bool>(),
        cut in any::<prop::sample::Index>(),
        whole in any::<bool>(),
        chunk in 1usize..300,
        capped in any::<bool>(),
        content_fallback in any::<bool>(),
        per_token in prop::sample::select(vec![1u32, 4]),
    ) {
        let extra = format!(
            r#", "content_bytes_per_token": {per_token}{}"#,
            if content_fallback { r#", "fallback": "content""# } else { "" }
        );
        let api = if anthropic { "anthropic_messages" } else { "openai_chat" };
        let t = Test::new(&doc(api, &extra));
        let mut s = t.stream();
        let cap = capped.then_some(tokens + 7);
        let body = chat(cap);
        let reserved = admitted(&mut s, &body, 99_000);
        let input = llm_input(&body);
        let (stream, ends) = provider_stream(anthropic, input, tokens, bytes, per_event, usage);
        s.response(&streaming(), false);
        let at = if whole { stream.len() } else { cut.index(stream.len() + 1) };
        let mut fx = Vec::new();
        let pieces: Vec<&[u8]> = stream[..at].chunks(chunk).collect();
        for (i, piece) in pieces.iter().enumerate() {
            fx.extend(s.chunk(piece, whole && i + 1 == pieces.len()));
        }
        if whole && pieces.is_empty() {
            fx.extend(s.chunk(b"", true));
        }
        fx.extend(s.end());
        let charged = count(&fx, 0, PolicyStat::LlmTokensCharged);
        // Whole events reached the client; a partial one did not.
        let seen: Vec<&(usize, u64)> = ends.iter().filter(|(end, _)| *end <= at).collect();
        let delivered = seen.last().map_or(0, |(_, d)| *d);
        let content_events = seen.iter().zip(std::iter::once(&&(0, 0)).chain(seen.iter()))
            .filter(|(now, before)| now.1 > before.1).count() as u64;
        let reported_input = anthropic && !seen.is_empty();
        if usage && seen.len() == ends.len() {
            prop_assert_eq!(charged, input + tokens, "its usage, exactly");
            return Ok(());
        }
        prop_assert_eq!(count(&fx, 0, PolicyStat::LlmFallbacks), 1);
        if u64::from(per_token) <= bytes as u64 || per_event == 1 {
            prop_assert!(charged >= input + delivered, "charged {} for {} delivered", charged, input + delivered);
        }
        // What the content tells, as the policy converts it.
        let content = (bytes as u64 * delivered).div_ceil(u64::from(per_token)).max(content_events);
        let content = cap.map_or(content, |c| content.min(c));
        let told = if reported_input { input } else { body.len() as u64 } + content;
        if content_fallback {
            prop_assert_eq!(charged, told, "only what was delivered");
        } else {
            prop_assert_eq!(charged, reserved.max(told), "the reservation, unless more was delivered");
        }
    }
}

/// The provider's true input count of a request body: its bytes over 4.
fn llm_input(body: &[u8]) -> u64 {
    (body.len() as u64).div_ceil(4)
}
