//! Token budgets through the real parts: Envoy running `sluice.wasm`, the
//! shim, redis-server, and a mock LLM provider (`harness::llm`) that
//! streams each API's events in chunks of random sizes and knows the true
//! count of every request it served. The budget is judged from that far
//! side: what the provider served against what the budget allowed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_harness::gateway::{eventually, prometheus, sample, Blackhole};
use sluice_harness::llm::{self, post, request_body, LlmUpstream, Reply, Script};
use sluice_harness::{Envoy, Redis, Shim, Upstream};
use sluice_policies::llm::Api;

const APIS: [Api; 3] = [Api::OpenaiChat, Api::OpenaiResponses, Api::AnthropicMessages];

/// Redis, the shim, the mock provider and Envoy; dropped Envoy first.
struct Stack {
    envoy: Envoy,
    _shim: Shim,
    llm: LlmUpstream,
    _redis: Redis,
}

fn start(policies: &str) -> Stack {
    start_with("", policies)
}

/// As [`start`], with more top-level fields (`top` ends with a comma).
fn start_with(top: &str, policies: &str) -> Stack {
    let doc = format!(
        r#"{{{top} "shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "policies": [{policies}]}}"#
    );
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let llm = LlmUpstream::start().expect("the mock provider");
    let envoy = Envoy::start(&doc, shim.port, llm.port).expect("envoy");
    Stack { envoy, _shim: shim, llm, _redis: redis }
}

/// A budget policy for `api`'s path, keyed by `x-team`.
fn budget(name: &str, api: Api, capacity: u64, extra: &str) -> String {
    format!(
        r#"{{"name": "{name}", "match": {{"path_exact": "{}"}}, "key": ["header:x-team"],
            "llm": {{"api": "{}", "default_max_tokens": 100{extra}}},
            "limits": [{{"type": "points", "capacity": {capacity}, "refill": "365d", "cost": "llm_tokens"}}]}}"#,
        llm::path(api),
        api.name()
    )
}

fn stat(envoy: &Envoy, name: &str, policy: &str) -> u64 {
    let page = prometheus(envoy).expect("Envoy's stats");
    sample(&page, &format!(r#"sluice_{name}{{policy="{policy}"}}"#)) as u64
}

fn call(envoy: &Envoy, api: Api, body: &[u8], headers: &[(&str, &str)]) -> Reply {
    post(envoy.port, llm::path(api), headers, body).expect("a request through Envoy")
}

/// Every API shape, streamed and not: each response passes unchanged, and
/// each policy is charged exactly the provider's true counts (its stats:
/// reserved = body bytes + cap, charged = input + output, the rest asked
/// back, and given back as the shim's answers say).
#[test]
fn each_api_shape_is_charged_its_true_count_streamed_or_not() {
    let policies: Vec<String> = APIS.iter().map(|api| budget(api.name(), *api, 10_000_000, "")).collect();
    let stack = start(&policies.join(","));
    let mut reserved: HashMap<&str, u64> = HashMap::new();
    for api in APIS {
        for (i, stream) in [false, true, true, false, true].into_iter().enumerate() {
            let body = request_body(api, &"lorem ipsum ".repeat(10 + 7 * i), Some(200), stream);
            let output = (40 + 13 * i).to_string();
            let headers = [("x-team", "t1"), ("x-mock-output", output.as_str())];
            let reply = call(&stack.envoy, api, &body, &headers);
            assert_eq!(reply.status, 200, "{api:?}: {}", reply.text());
            assert!(reply.complete, "{api:?} stream {stream}: the response came whole");
            let header_map = headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
            let script = Script::of(llm::path(api), &header_map, &body).expect("a script");
            assert_eq!(reply.text(), String::from_utf8_lossy(&script.body().0), "{api:?}: passed unchanged");
            *reserved.entry(api.name()).or_default() += body.len() as u64 + 200;
        }
    }
    let served = stack.llm.served();
    for api in APIS {
        let billed: u64 = served.iter().filter(|s| s.api == api).map(|s| s.billed()).sum();
        let name = api.name();
        println!("{name}: reserved {}, billed {billed}", reserved[name]);
        assert!(billed > 0);
        assert_eq!(stat(&stack.envoy, "llm_tokens_charged", name), billed, "{name}");
        assert_eq!(stat(&stack.envoy, "llm_tokens_reserved", name), reserved[name], "{name}");
        assert_eq!(
            stat(&stack.envoy, "llm_tokens_refund_requested", name),
            reserved[name] - billed,
            "{name}"
        );
        // Each settled from its stream, and the shim said it gave all of it back.
        assert_eq!(stat(&stack.envoy, "llm_tokens_given_back", name), reserved[name] - billed, "{name}");
        assert_eq!(stat(&stack.envoy, "llm_fallbacks", name), 0, "{name}");
    }
}

/// One request as a client saw it.
#[derive(Clone, Debug)]
struct Sent {
    id: String,
    reserved: u64,
    sent: Instant,
    done: Instant,
    status: u16,
}

/// `clients` clients send streamed OpenAI chat requests on one team's
/// budget of `capacity`, each until its first 429; `cap` is the
/// request's `max_completion_tokens` (none: the policy's default of 100),
/// and the provider generates up to `most` tokens each.
fn drive(stack: &Stack, team: &str, clients: usize, cap: Option<u64>, most: u64) -> Vec<Sent> {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let next = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    std::thread::scope(|scope| {
        for client in 0..clients {
            let (sent, next, failed, port) = (sent.clone(), next.clone(), failed.clone(), stack.envoy.port);
            scope.spawn(move || loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                let id = format!("{team}-{n}");
                let output = (n * 7919 % most + 1).to_string();
                let prompt = "x".repeat(200 + (n as usize * 31 + client) % 200);
                let body = request_body(Api::OpenaiChat, &prompt, cap, true);
                let headers =
                    [("x-team", team), ("x-mock-output", output.as_str()), ("x-mock-id", id.as_str())];
                let started = Instant::now();
                let Ok(reply) = post(port, llm::path(Api::OpenaiChat), &headers, &body) else {
                    failed.store(true, Ordering::SeqCst);
                    return;
                };
                let done = Instant::now();
                let reserved = body.len() as u64 + cap.unwrap_or(100);
                if reply.status == 200 && !reply.complete {
                    failed.store(true, Ordering::SeqCst);
                }
                if let Ok(mut s) = sent.lock() {
                    s.push(Sent { id: id.clone(), reserved, sent: started, done, status: reply.status });
                }
                if reply.status != 200 {
                    return;
                }
            });
        }
    });
    assert!(!failed.load(Ordering::SeqCst), "a request failed or came incomplete");
    let sent = sent.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(sent.iter().all(|s| s.status == 200 || s.status == 429), "only admissions and 429s");
    sent
}

/// The bound under concurrency, judged by the provider's own record. With
/// a cap in every request the budget is never overspent.
/// Without one it is overspent by at most what the requests in flight at
/// the last admission used beyond their reservations: each request is
/// settled before its client sees its end, so a request that ended for its
/// client before the last one was sent had settled.
#[test]
fn the_bound_holds_under_concurrency() {
    const CAPACITY: u64 = 40_000;
    const CLIENTS: usize = 24;
    let stack = start(&budget("team", Api::OpenaiChat, CAPACITY, ""));

    let capped = drive(&stack, "capped", CLIENTS, Some(300), 300);
    let served = stack.llm.served();
    let billed: u64 = served.iter().filter(|s| s.id.starts_with("capped-")).map(|s| s.billed()).sum();
    let largest = capped.iter().map(|s| s.reserved).max().unwrap_or(0);
    let admitted = capped.iter().filter(|s| s.status == 200).count();
    println!(
        "capped: {admitted} admitted of {}, {billed} of {CAPACITY} tokens spent; charged {}, reserved {}, refunded {}",
        capped.len(),
        stat(&stack.envoy, "llm_tokens_charged", "team"),
        stat(&stack.envoy, "llm_tokens_reserved", "team"),
        stat(&stack.envoy, "llm_tokens_refund_requested", "team"),
    );
    assert!(billed <= CAPACITY, "capped: {billed} tokens spent of a budget of {CAPACITY}");
    // Under-admission is not judged: refunds are conservative under
    // concurrency (docs/token-budgets.md#the-bound), by an amount that
    // depends on the interleaving. What a request could never fit is.
    assert!(largest < CAPACITY);

    let uncapped = drive(&stack, "uncapped", CLIENTS, None, 400);
    let served: HashMap<String, u64> = stack
        .llm
        .served()
        .iter()
        .filter(|s| s.id.starts_with("uncapped-"))
        .map(|s| (s.id.clone(), s.billed()))
        .collect();
    let billed: u64 = served.values().sum();
    let admitted: Vec<&Sent> = uncapped.iter().filter(|s| s.status == 200).collect();
    let last = admitted.iter().max_by_key(|s| s.sent).expect("admissions");
    let excess = |s: &Sent| served.get(&s.id).copied().unwrap_or(0).saturating_sub(s.reserved);
    let in_flight: Vec<&&Sent> =
        admitted.iter().filter(|s| s.sent <= last.done && s.done >= last.sent).collect();
    let bound: u64 = in_flight.iter().map(|s| excess(s)).sum();
    let overshoot = billed.saturating_sub(CAPACITY);
    println!(
        "uncapped: {} admitted, {billed} of {CAPACITY} tokens spent: over by {overshoot}, bound {bound} ({} in flight at the last admission)",
        admitted.len(),
        in_flight.len()
    );
    assert!(billed <= CAPACITY + bound, "uncapped: over by {overshoot}, beyond the bound {bound}");
}

/// Responses that never tell their usage are charged by the fallback and
/// counted: a stream the provider cuts short, a compressed body; a refusal
/// upstream refunds the reservation; a body past the bound gets 413 and
/// never goes upstream.
#[test]
fn fallbacks_refusals_and_bounds() {
    let stack = start_with(
        r#""max_request_body_bytes": 65536,"#,
        &budget("fb", Api::AnthropicMessages, 1_000_000, r#", "fallback": "content""#),
    );
    let api = Api::AnthropicMessages;
    let body = request_body(api, "hello", Some(500), true);
    let reserved = body.len() as u64 + 500;
    let stat_is = |name: &str, want: u64| {
        // A reset reaches the client as its stream ends in Envoy: the
        // stream's last callbacks may run a moment after.
        let ok = eventually(Duration::from_secs(10), || stat(&stack.envoy, name, "fb") == want);
        assert!(ok, "{name}: {} (wanted {want})", stat(&stack.envoy, name, "fb"));
    };

    // Cut after message_start, its block's start and 10 deltas: the input
    // the stream reported, and 10 tokens' content (4 bytes a token).
    let reply =
        call(&stack.envoy, api, &body, &[("x-team", "a"), ("x-mock-output", "100"), ("x-mock-cut", "12")]);
    assert!(!reply.complete, "the provider's cut reaches the client");
    let cut = llm::input_tokens(&body) + 10;
    stat_is("llm_fallbacks", 1);
    stat_is("llm_tokens_fallback", cut);

    // Compressed: unreadable; the content fallback charges the input part.
    let reply = call(&stack.envoy, api, &body, &[("x-team", "a"), ("x-mock-gzip", "1")]);
    assert_eq!(reply.status, 200);
    stat_is("llm_unreadable", 1);
    stat_is("llm_fallbacks", 2);
    let gzip = body.len() as u64;

    // Refused upstream: nothing generated, everything refunded.
    let reply = call(&stack.envoy, api, &body, &[("x-team", "a"), ("x-mock-status", "529")]);
    assert_eq!(reply.status, 529);
    stat_is("llm_tokens_refund_requested", (reserved - cut) + (reserved - gzip) + reserved);
    stat_is("llm_tokens_charged", cut + gzip);

    let huge = request_body(api, &"x".repeat(100_000), Some(10), false);
    let reply = call(&stack.envoy, api, &huge, &[("x-team", "a")]);
    assert_eq!(reply.status, 413, "{}", reply.text());
    let page = prometheus(&stack.envoy).expect("stats");
    assert_eq!(sample(&page, "sluice_request_body_too_large"), 1.0);
    assert_eq!(stack.llm.served().len(), 3, "the large body never went upstream");
}

/// `end_stream`, in every API shape: a stream without a cap that runs past
/// what its key has left ends to the client right after a whole event and
/// the API's error event, though the provider still holds the stream open
/// (it stops there and waits: without the end, the client would wait with
/// it). The running count is in tokens (4 bytes of content each, the
/// mock's), and the provider's true count is charged: what it wrote.
#[test]
fn a_stream_past_its_budget_ends_right_after_the_error_event() {
    const CAPACITY: u64 = 3_000;
    for api in APIS {
        let stack = start(&budget("cut", api, CAPACITY, r#", "end_stream": true"#));
        let body = request_body(api, &"y".repeat(300), None, true);
        // The content event that passes the budget: the input (its estimate,
        // the body's bytes, or the true count Anthropic's `message_start`
        // reports), then a token per event.
        let input = match api {
            Api::AnthropicMessages => llm::input_tokens(&body),
            _ => body.len() as u64,
        };
        let passing = CAPACITY - input + 1;
        let hold = (passing + llm::events_before_content(api) as u64).to_string();
        let headers = [("x-team", "a"), ("x-mock-output", "5000"), ("x-mock-hold", hold.as_str())];
        let reply = call(&stack.envoy, api, &body, &headers);
        assert_eq!(reply.status, 200);
        let text = reply.text();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        let error_at = events.iter().rposition(|e| e.contains("rate_limit")).expect("the error event");
        let error: Value = serde_json::from_str(events[error_at].split("data: ").nth(1).expect("data"))
            .unwrap_or_else(|e| panic!("{api:?}: {e}"));
        match api {
            Api::OpenaiChat => {
                assert_eq!(error["error"]["code"], "rate_limit_exceeded");
                assert_eq!(events.last(), Some(&"data: [DONE]"), "then [DONE], and the end");
                assert_eq!(error_at, events.len() - 2);
            }
            Api::OpenaiResponses => {
                assert_eq!(error["type"], "error");
                assert_eq!(error["code"], "rate_limit_exceeded");
                assert_eq!(error["error"]["message"], error["message"], "the SDK raises on `error`");
                assert_eq!(error_at, events.len() - 1);
            }
            Api::AnthropicMessages => {
                assert_eq!(error["error"]["type"], "rate_limit_error");
                assert_eq!(error_at, events.len() - 1);
            }
        }
        let delivered = events.iter().filter(|e| e.contains(llm::TOKEN)).count() as u64;
        assert_eq!(delivered, passing, "{api:?}: the event that passed the budget is the last delivered");
        assert_eq!(stat(&stack.envoy, "llm_streams_ended", "cut"), 1);
        let ok = eventually(Duration::from_secs(10), || {
            stack.llm.served().first().is_some_and(|s| s.ended.is_some())
                && stat(&stack.envoy, "llm_fallbacks", "cut") == 1
        });
        assert!(ok, "{api:?}: the provider saw the end and the request settled");
        let served = &stack.llm.served()[0];
        assert_eq!(served.written, passing, "{api:?}: the provider wrote up to the passing event");
        let charged = stat(&stack.envoy, "llm_tokens_charged", "cut");
        // What it delivered, with the input as the stream told it (else its
        // estimate, never below the true count).
        assert_eq!(charged, (input + passing).min(CAPACITY), "{api:?}: at most the capacity");
        assert!(
            charged >= served.billed().min(CAPACITY),
            "{api:?}: charged {charged} for {}",
            served.billed()
        );
    }
}

/// A client that reads part of a streamed answer, then closes: `tokens`
/// output tokens of it (whole events), through Envoy on `port`. The
/// answer's status, and the tokens read (none if it is not 200).
fn read_then_close(
    port: u16,
    api: Api,
    headers: &[(&str, &str)],
    body: &[u8],
    tokens: usize,
) -> (u16, usize) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let mut head = format!(
        "POST {} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        llm::path(api),
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("write");
    stream.write_all(body).expect("write");
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).expect("read");
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        if status != 200 && text.contains("\r\n\r\n") {
            return (status, 0);
        }
        assert!(n > 0, "the answer ended before {tokens} tokens");
        let body = dechunked(&text);
        let events = body.split("\n\n").filter(|e| e.contains("\"tok \"")).count();
        if events >= tokens {
            return (status, events);
        }
    }
}

/// The body of a chunked HTTP/1.1 response read so far (whole chunks, and
/// the part of the last one that came).
fn dechunked(response: &str) -> String {
    let Some((_, mut rest)) = response.split_once("\r\n\r\n") else { return String::new() };
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        let data = &after[..size.min(after.len())];
        body.push_str(data);
        if size == 0 || after.len() < size + 2 {
            break;
        }
        rest = &after[size + 2..];
    }
    body
}

/// The issue's scenario: 3,000 tokens a day, `default_max_tokens` 200, no
/// cap in the request; one client, one request at a time, reads 900 of
/// 1,000 tokens and closes. Each request is charged at least what it
/// received (by the default fallback: the larger of its reservation and
/// its content), so the budget holds its bound: at most what the requests
/// in flight at the last admission used beyond their reservations (the last
/// one, and the one before, whose settlement may still be on its way), not
/// 7,200 tokens as before. With the `content` fallback, one such request
/// is charged what it received, not the whole day.
#[test]
fn a_client_that_closes_early_is_charged_what_it_received() {
    const CAPACITY: u64 = 3_000;
    let policy = |name: &str, fallback: &str| {
        format!(
            r#"{{"name": "{name}", "match": {{"path_exact": "/v1/chat/completions"}}, "key": ["header:x-team"],
                "llm": {{"api": "openai_chat", "default_max_tokens": 200{fallback}}},
                "limits": [{{"type": "points", "capacity": {CAPACITY}, "refill": "1d", "cost": "llm_tokens"}}]}}"#
        )
    };
    let stack = start(&policy("day", ""));
    let body = request_body(Api::OpenaiChat, &"p".repeat(60), None, true);
    let reserved = body.len() as u64 + 200;
    // The role chunk, then 900 tokens: the provider holds there until the
    // client has gone.
    let headers = [("x-team", "a"), ("x-mock-output", "1000"), ("x-mock-hold", "901")];
    let mut admitted = 0;
    loop {
        // Each request: read 900 tokens, then close; a refusal ends the run.
        match read_then_close(stack.envoy.port, Api::OpenaiChat, &headers, &body, 900) {
            (200, read) => assert_eq!(read, 900),
            (status, _) => {
                assert_eq!(status, 429);
                break;
            }
        }
        admitted += 1;
        assert!(admitted < 20, "never refused");
    }
    let ok = eventually(Duration::from_secs(10), || stat(&stack.envoy, "llm_fallbacks", "day") == admitted);
    assert!(ok, "every request settled by the fallback");
    let served = stack.llm.served();
    let billed: u64 = served.iter().filter(|s| s.status == 200).map(|s| s.billed()).sum();
    let each = served.iter().map(|s| s.billed()).max().unwrap_or(0);
    let excess = each.saturating_sub(reserved);
    let charged = stat(&stack.envoy, "llm_tokens_charged", "day");
    println!("closing early: {admitted} admitted, {billed} tokens served of {CAPACITY}; charged {charged}");
    assert!(charged >= billed, "charged {charged} for {billed} served");
    assert!(billed <= CAPACITY + 2 * excess, "{billed} served: over the bound {}", CAPACITY + 2 * excess);

    // The content fallback: one early close is charged what it received.
    let stack = start(&policy("content", r#", "fallback": "content""#));
    assert_eq!(read_then_close(stack.envoy.port, Api::OpenaiChat, &headers, &body, 900), (200, 900));
    let ok = eventually(Duration::from_secs(10), || stat(&stack.envoy, "llm_fallbacks", "content") == 1);
    assert!(ok);
    let charged = stat(&stack.envoy, "llm_tokens_charged", "content");
    assert_eq!(charged, body.len() as u64 + 900, "its prompt's estimate and the 900 tokens it received");
}

/// A request held for its check stays held while its body arrives: a
/// body callback that let it go on would have sent it upstream before the
/// shim answered (here it never answers, and `failure_mode: deny` refuses).
#[test]
fn a_request_body_never_carries_its_request_past_its_check() {
    let blackhole = Blackhole::start().expect("blackhole");
    let reached = Arc::new(AtomicU64::new(0));
    let counter = reached.clone();
    let app = axum::Router::new().fallback(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        async { "ok\n" }
    });
    let upstream = Upstream::serving(app).expect("upstream");
    let doc = r#"{"shim": {"timeout_ms": 500, "failure_threshold": 0}, "failure_mode": "deny",
        "policies": [{"name": "api", "limits": [{"type": "fixed_window", "limit": 100, "window": "1m"}]}]}"#;
    let envoy = Envoy::start(doc, blackhole.port, upstream.port).expect("envoy");
    for size in [10, 100_000] {
        let reply = post(envoy.port, "/upload", &[], &vec![b'x'; size]).expect("a request");
        assert_eq!(reply.status, 503, "refused by failure_mode deny");
    }
    assert_eq!(reached.load(Ordering::SeqCst), 0, "no request reached the upstream");
}

/// The decompressor placement `docs/token-budgets.md` gives, through real
/// Envoy: with Envoy's gzip decompressor after Sluice (next to the router),
/// a gzip'd answer reaches the filter decompressed and is charged its true
/// count; without it, the same answer is unreadable and charged by the
/// fallback.
#[test]
fn a_decompressor_after_sluice_makes_a_gzip_answer_readable() {
    let policy = budget("gz", Api::AnthropicMessages, 1_000_000, "");
    let doc =
        format!(r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "policies": [{policy}]}}"#);
    let demo =
        std::fs::read_to_string(sluice_harness::workspace_root().join("envoy/demo.yaml")).expect("demo.yaml");
    let router = "          - name: envoy.filters.http.router";
    assert!(demo.contains(router), "the template's router");
    let decompressor = r#"          - name: envoy.filters.http.decompressor
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.decompressor.v3.Decompressor
              decompressor_library:
                name: gzip
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.compression.gzip.decompressor.v3.Gzip
"#;
    let template = sluice_harness::scratch_dir("decompressor").expect("scratch").join("envoy.yaml");
    std::fs::write(&template, demo.replacen(router, &format!("{decompressor}{router}"), 1))
        .expect("template");
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let provider = LlmUpstream::start().expect("the mock provider");
    let values = [
        ("UPSTREAM_PORT", provider.port.to_string()),
        ("SHIM_PORT", shim.port.to_string()),
        ("WASM_PATH", sluice_harness::dist("sluice.wasm").expect("sluice.wasm").display().to_string()),
        ("POLICY_JSON", serde_json::to_string(&doc).expect("json")),
    ];
    let envoy = Envoy::start_template(&template, &values, 2).expect("envoy with a decompressor");
    let body = request_body(Api::AnthropicMessages, "hello", Some(100), false);
    let reply = call(&envoy, Api::AnthropicMessages, &body, &[("x-team", "a"), ("x-mock-gzip", "2")]);
    assert_eq!(reply.status, 200);
    assert!(
        serde_json::from_slice::<Value>(&reply.body).is_ok(),
        "the client gets it decompressed: {}",
        reply.text()
    );
    assert_eq!(stat(&envoy, "llm_unreadable", "gz"), 0);
    assert_eq!(stat(&envoy, "llm_fallbacks", "gz"), 0);
    assert_eq!(stat(&envoy, "llm_tokens_charged", "gz"), provider.served()[0].billed());

    // Without the decompressor, the same answer cannot be read.
    let plain = Envoy::start(&doc, shim.port, provider.port).expect("envoy");
    let reply = call(&plain, Api::AnthropicMessages, &body, &[("x-team", "a"), ("x-mock-gzip", "2")]);
    assert_eq!(reply.status, 200);
    assert_eq!(stat(&plain, "llm_unreadable", "gz"), 1);
}

/// Today's day of the month, UTC (Howard Hinnant's civil-from-days).
fn day_of_month() -> u64 {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let z = secs / 86_400 + 719_468;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    doy - (153 * mp + 2) / 5 + 1
}

/// A monthly budget (a `points` limit on a calendar window) through real
/// Envoy and the real scripts: each request settles to its true count, so
/// the budget admits exactly as many requests as fit once each earlier one
/// has settled (without the refunds, only the first would fit). The
/// billing month starts two weeks from today, so no window ends mid-test.
#[test]
fn a_monthly_budget_settles_each_request_in_its_window() {
    const CAPACITY: u64 = 1_000;
    let anchor = (day_of_month() + 14) % 28 + 1;
    let policy = budget("month", Api::OpenaiChat, CAPACITY, "").replace(
        r#""refill": "365d""#,
        &format!(r#""refill": {{"calendar": "month", "anchor": {anchor}, "zone": "UTC"}}"#),
    );
    let stack = start(&policy);
    let body = request_body(Api::OpenaiChat, "hello there", Some(500), true);
    let reserved = body.len() as u64 + 500;
    let used = llm::input_tokens(&body) + 50;
    let fits = (CAPACITY - reserved) / used + 1;
    let mut admitted = 0;
    loop {
        let reply = call(&stack.envoy, Api::OpenaiChat, &body, &[("x-team", "a"), ("x-mock-output", "50")]);
        if reply.status != 200 {
            assert_eq!(reply.status, 429);
            break;
        }
        admitted += 1;
        assert!(admitted <= fits, "more admitted than fit");
    }
    println!("monthly: {admitted} admitted, each reserving {reserved} and using {used}, of {CAPACITY}");
    assert_eq!(admitted, fits);
}

/// A streamed answer that lasts longer than Envoy's default route timeout
/// (15 s) reaches its client whole and is charged its true count: the
/// rendered route has no timeout, only the stream idle timeout (the
/// provider waits 400 ms before each of its 44 events: at least 17.6 s).
#[test]
fn a_stream_longer_than_the_default_route_timeout_comes_whole() {
    let stack = start(&budget("long", Api::OpenaiChat, 1_000_000, ""));
    let body = request_body(Api::OpenaiChat, "hello", Some(100), true);
    let started = Instant::now();
    let headers = [("x-team", "a"), ("x-mock-output", "40"), ("x-mock-pace-ms", "400")];
    let reply = call(&stack.envoy, Api::OpenaiChat, &body, &headers);
    println!("a stream of {:?}", started.elapsed());
    assert_eq!(reply.status, 200);
    assert!(reply.complete, "the stream came whole: {} bytes", reply.body.len());
    assert!(reply.text().ends_with("data: [DONE]\n\n"));
    assert_eq!(stat(&stack.envoy, "llm_fallbacks", "long"), 0);
    assert_eq!(stat(&stack.envoy, "llm_tokens_charged", "long"), stack.llm.served()[0].billed());
}
