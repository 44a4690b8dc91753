//! A mock LLM provider: OpenAI chat completions (`/v1/chat/completions`),
//! OpenAI responses (`/v1/responses`) and Anthropic messages
//! (`/v1/messages`), answered in each API's own shape, as one JSON document
//! or (`"stream": true`) as server-sent events written in chunks of random
//! sizes, so an event, a line or a number is split anywhere. It keeps the
//! true count of every request it served, for tests that judge a token
//! budget from the far side.
//!
//! What it generates, deterministically:
//! - **input tokens**: the request body's bytes over 4, rounded up (never
//!   more than its bytes, as a real tokenizer's count);
//! - **output tokens**: `x-mock-output` (16 if absent), at most the
//!   request's `max_completion_tokens`, `max_tokens` or `max_output_tokens`;
//!   each a `tok ` of content;
//! - OpenAI chat streams report usage only with `stream_options.include_usage`.
//!
//! Other headers: `x-mock-id` names the request in [`Served`];
//! `x-mock-cut: N` closes the connection after N events (a stream cut
//! short); `x-mock-hold: N` stops after N events and waits until the far
//! side closes the connection (a provider still generating when its client
//! goes: it bills what it wrote); `x-mock-pace-ms: N` waits N ms before each
//! event (a slow stream); `x-mock-status: S` refuses with S and an error body;
//! `x-mock-gzip: 1` labels the body gzip (an unreadable one), `x-mock-gzip: 2`
//! compresses it with gzip for real;
//! `x-mock-seed: N` picks the chunk sizes; `x-mock-delay-ms: N` waits N ms
//! before it answers (requests in flight together, ending in a set order).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_policies::llm::{Api, MAX_TOKENS_FIELDS};

/// The content of one output token.
pub const TOKEN: &str = "tok ";
/// The largest chunk written at once.
const MAX_CHUNK: usize = 48;

/// One request as the mock served it.
#[derive(Clone, Debug)]
pub struct Served {
    pub id: String,
    pub api: Api,
    pub stream: bool,
    /// Its true input count.
    pub input: u64,
    /// The output it was to generate.
    pub output: u64,
    /// The output tokens it wrote before it ended (all of them, unless cut).
    pub written: u64,
    pub status: u16,
    /// It wrote its whole answer.
    pub complete: bool,
    pub arrived: Instant,
    pub ended: Option<Instant>,
}

impl Served {
    /// What a provider bills for it: the input and the output it generated
    /// (nothing for a refusal).
    pub fn billed(&self) -> u64 {
        if self.status == 200 {
            self.input + self.written
        } else {
            0
        }
    }
}

/// What one request asks the mock for.
#[derive(Clone, Debug)]
pub struct Script {
    pub api: Api,
    pub stream: bool,
    pub include_usage: bool,
    pub input: u64,
    pub output: u64,
    pub cut_after: Option<usize>,
    /// Stop after this many events and wait for the far side to close.
    pub hold_after: Option<usize>,
    /// Wait this long before each event.
    pub pace_ms: u64,
    pub status: u16,
    /// 0: plain; 1: labelled gzip, not compressed; 2: gzip'd.
    pub gzip: u64,
    pub seed: u64,
    pub delay_ms: u64,
}

impl Script {
    /// The script of a request to `path` with `headers` (lower-case names)
    /// and `body`; `None` for a path of no API.
    pub fn of(path: &str, headers: &HashMap<String, String>, body: &[u8]) -> Option<Script> {
        let api = match path.split('?').next().unwrap_or_default() {
            "/v1/chat/completions" => Api::OpenaiChat,
            "/v1/responses" => Api::OpenaiResponses,
            "/v1/messages" => Api::AnthropicMessages,
            _ => return None,
        };
        let json: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let cap = MAX_TOKENS_FIELDS.iter().find_map(|f| json.pointer(f)?.as_u64());
        let header = |name: &str| headers.get(name).and_then(|v| v.trim().parse::<u64>().ok());
        let wanted = header("x-mock-output").unwrap_or(16);
        Some(Script {
            api,
            stream: json["stream"].as_bool().unwrap_or(false),
            include_usage: json
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            input: input_tokens(body),
            output: cap.map_or(wanted, |cap| wanted.min(cap)),
            cut_after: header("x-mock-cut").map(|n| n as usize),
            hold_after: header("x-mock-hold").map(|n| n as usize),
            pace_ms: header("x-mock-pace-ms").unwrap_or(0),
            status: header("x-mock-status").map_or(200, |s| s as u16),
            gzip: header("x-mock-gzip").unwrap_or(0),
            seed: header("x-mock-seed").unwrap_or(0),
            delay_ms: header("x-mock-delay-ms").unwrap_or(0),
        })
    }

    /// Its answer's content type.
    pub fn content_type(&self) -> &'static str {
        if self.stream && self.status == 200 {
            "text/event-stream"
        } else {
            "application/json"
        }
    }

    /// Its answer's body: whole, and (for a stream) the offset after each
    /// event.
    pub fn body(&self) -> (Vec<u8>, Vec<usize>) {
        if self.status != 200 {
            let error = json!({"error": {"type": "rate_limit_error", "message": "refused by the mock"}});
            return (error.to_string().into_bytes(), Vec::new());
        }
        if !self.stream {
            return (self.document().to_string().into_bytes(), Vec::new());
        }
        let mut body = Vec::new();
        let mut ends = Vec::new();
        for event in self.events() {
            body.extend_from_slice(event.as_bytes());
            ends.push(body.len());
        }
        (body, ends)
    }

    fn text(&self) -> String {
        TOKEN.repeat(self.output as usize)
    }

    /// The whole answer as one JSON document.
    fn document(&self) -> Value {
        let (input, output) = (self.input, self.output);
        match self.api {
            Api::OpenaiChat => json!({
                "id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": "mock",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.text()}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}}),
            Api::OpenaiResponses => json!({
                "id": "resp_mock", "object": "response", "status": "completed", "model": "mock",
                "output": [{"id": "msg_mock", "type": "message", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": self.text(), "annotations": []}]}],
                "usage": {"input_tokens": input, "output_tokens": output, "total_tokens": input + output}}),
            Api::AnthropicMessages => json!({
                "id": "msg_mock", "type": "message", "role": "assistant", "model": "mock",
                "content": [{"type": "text", "text": self.text()}], "stop_reason": "end_turn",
                "usage": {"input_tokens": input, "output_tokens": output}}),
        }
    }

    /// The answer as events, each with its blank line; one per output token
    /// in between.
    pub fn events(&self) -> Vec<String> {
        let (input, output) = (self.input, self.output);
        let data = |v: Value| format!("data: {v}\n\n");
        let named = |name: &str, v: Value| format!("event: {name}\ndata: {v}\n\n");
        let tokens = 0..output;
        match self.api {
            Api::OpenaiChat => {
                let usage = if self.include_usage { Some(Value::Null) } else { None };
                let chunk = |delta: Value, finish: Value| {
                    let mut c = json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": "mock",
                                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
                    if let Some(u) = &usage {
                        c["usage"] = u.clone();
                    }
                    data(c)
                };
                let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
                events.extend(tokens.map(|_| chunk(json!({"content": TOKEN}), Value::Null)));
                events.push(chunk(json!({}), json!("stop")));
                if self.include_usage {
                    events.push(data(json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": "mock", "choices": [],
                        "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}})));
                }
                events.push("data: [DONE]\n\n".to_string());
                events
            }
            Api::OpenaiResponses => {
                // Whole events, as the SDK's stream helper needs them: the
                // message and its part are added before any delta.
                let mut events = vec![
                    named(
                        "response.created",
                        json!({"type": "response.created", "response": {"id": "resp_mock", "object": "response",
                        "status": "in_progress", "model": "mock", "output": [], "usage": null}}),
                    ),
                    named(
                        "response.output_item.added",
                        json!({"type": "response.output_item.added", "output_index": 0, "item": {"id": "msg_mock",
                        "type": "message", "role": "assistant", "status": "in_progress", "content": []}}),
                    ),
                    named(
                        "response.content_part.added",
                        json!({"type": "response.content_part.added", "item_id": "msg_mock", "output_index": 0,
                        "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
                    ),
                ];
                events.extend(tokens.map(|_| {
                    named(
                        "response.output_text.delta",
                        json!({"type": "response.output_text.delta",
                        "item_id": "msg_mock", "output_index": 0, "content_index": 0, "delta": TOKEN}),
                    )
                }));
                let text = self.text();
                events.push(named(
                    "response.output_text.done",
                    json!({"type": "response.output_text.done", "item_id": "msg_mock", "output_index": 0,
                    "content_index": 0, "text": text}),
                ));
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                events.push(named(
                    "response.content_part.done",
                    json!({"type": "response.content_part.done", "item_id": "msg_mock", "output_index": 0,
                    "content_index": 0, "part": part}),
                ));
                events.push(named(
                    "response.output_item.done",
                    json!({"type": "response.output_item.done", "output_index": 0, "item": {"id": "msg_mock",
                    "type": "message", "role": "assistant", "status": "completed", "content": [part]}}),
                ));
                let mut done = json!({"type": "response.completed", "response": self.document()});
                done["response"]["id"] = json!("resp_mock");
                events.push(named("response.completed", done));
                events
            }
            Api::AnthropicMessages => {
                let mut events = vec![
                    named(
                        "message_start",
                        json!({"type": "message_start", "message": {"id": "msg_mock",
                        "type": "message", "role": "assistant", "content": [], "model": "mock",
                        "usage": {"input_tokens": input, "output_tokens": 1}}}),
                    ),
                    named(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": ""}}),
                    ),
                ];
                events.extend(tokens.map(|_| {
                    named(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": 0,
                        "delta": {"type": "text_delta", "text": TOKEN}}),
                    )
                }));
                events.push(named("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
                events.push(named(
                    "message_delta",
                    json!({"type": "message_delta",
                    "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": output}}),
                ));
                events.push(named("message_stop", json!({"type": "message_stop"})));
                events
            }
        }
    }

    /// Output tokens written once the first `events` events are.
    fn written_by(&self, events: usize) -> u64 {
        (events.saturating_sub(events_before_content(self.api)) as u64).min(self.output)
    }
}

/// The events of `api`'s stream before its first content event.
pub fn events_before_content(api: Api) -> usize {
    match api {
        Api::OpenaiChat => 1,
        Api::OpenaiResponses => 3,
        Api::AnthropicMessages => 2,
    }
}

/// A request's true input count: its body's bytes over 4, rounded up.
pub fn input_tokens(body: &[u8]) -> u64 {
    (body.len() as u64).div_ceil(4)
}

pub struct LlmUpstream {
    pub port: u16,
    served: Arc<Mutex<Vec<Served>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LlmUpstream {
    /// Binds 127.0.0.1:0 and serves, a thread per connection.
    pub fn start() -> anyhow::Result<LlmUpstream> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(Mutex::new(Vec::new()));
        let (stopping, record) = (stop.clone(), served.clone());
        let counter = Arc::new(AtomicU64::new(0));
        let thread = std::thread::Builder::new().name("llm-upstream".into()).spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (record, counter) = (record.clone(), counter.clone());
                std::thread::spawn(move || serve(stream, &record, &counter));
            }
        })?;
        Ok(LlmUpstream { port, served, stop, thread: Some(thread) })
    }

    /// Every request served so far (or being served).
    pub fn served(&self) -> Vec<Served> {
        self.served.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for LlmUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Serves the requests of one connection, one after another.
fn serve(stream: TcpStream, record: &Mutex<Vec<Served>>, counter: &AtomicU64) {
    let Ok(read_half) = stream.try_clone() else { return };
    let mut reader = BufReader::new(read_half);
    let mut stream = stream;
    loop {
        let Some((path, headers, body)) = read_request(&mut reader) else { return };
        let arrived = Instant::now();
        let Some(mut script) = Script::of(&path, &headers, &body) else {
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
            continue;
        };
        let n = counter.fetch_add(1, Ordering::SeqCst);
        if !headers.contains_key("x-mock-seed") {
            script.seed = n;
        }
        let id = headers.get("x-mock-id").cloned().unwrap_or_else(|| n.to_string());
        let index = {
            let Ok(mut r) = record.lock() else { return };
            r.push(Served {
                id,
                api: script.api,
                stream: script.stream,
                input: script.input,
                output: script.output,
                written: 0,
                status: script.status,
                complete: false,
                arrived,
                ended: None,
            });
            r.len() - 1
        };
        let (written, complete) = answer(&mut stream, &script);
        if let Ok(mut r) = record.lock() {
            let s = &mut r[index];
            s.written = written;
            s.complete = complete;
            s.ended = Some(Instant::now());
        }
        if !complete {
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    }
}

/// Writes the answer in chunks of random sizes; the output tokens written
/// and whether it was written whole.
fn answer(stream: &mut TcpStream, script: &Script) -> (u64, bool) {
    std::thread::sleep(Duration::from_millis(script.delay_ms));
    let (body, ends) = script.body();
    let body = if script.gzip == 2 { gzip(&body) } else { body };
    let stop = script.cut_after.or(script.hold_after).filter(|_| script.stream);
    let (body, cut) = match stop {
        Some(k) => {
            let at = ends.get(k.saturating_sub(1)).copied().unwrap_or(0).min(body.len());
            (body[..if k == 0 { 0 } else { at }].to_vec(), Some(k))
        }
        None => (body, None),
    };
    let reason = if script.status == 200 { "OK" } else { "Error" };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: {}\r\ntransfer-encoding: chunked\r\n",
        script.status,
        script.content_type()
    );
    if script.gzip > 0 {
        head.push_str("content-encoding: gzip\r\n");
    }
    head.push_str("\r\n");
    if stream.write_all(head.as_bytes()).is_err() {
        return (0, false);
    }
    let mut rng = script.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut at = 0;
    let mut pieces = 0;
    let paced = script.pace_ms > 0 && script.stream;
    while at < body.len() {
        if paced && (at == 0 || ends.contains(&at)) {
            // An event starts here: a slow provider takes its time.
            std::thread::sleep(Duration::from_millis(script.pace_ms));
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let mut size = (1 + (rng as usize) % MAX_CHUNK).min(body.len() - at);
        if paced {
            // Paced: no chunk runs into the next event.
            if let Some(&end) = ends.iter().find(|&&e| e > at) {
                size = size.min(end - at);
            }
        }
        let piece = &body[at..at + size];
        let chunk = [format!("{size:x}\r\n").as_bytes(), piece, b"\r\n"].concat();
        if stream.write_all(&chunk).and_then(|()| stream.flush()).is_err() {
            let events = ends.iter().filter(|&&e| e <= at).count();
            return (script.written_by(events), false);
        }
        at += size;
        pieces += 1;
        if pieces % 8 == 0 {
            // Let the proxy read what has come, so chunks reach it apart.
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    if let (Some(k), Some(_)) = (cut, script.hold_after) {
        // Held: wait until the far side closes (or the test ends).
        let _ = stream.set_read_timeout(Some(Duration::from_secs(120)));
        let mut sink = [0u8; 256];
        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
        return (script.written_by(k), false);
    }
    if let Some(k) = cut {
        return (script.written_by(k), false);
    }
    let whole = stream.write_all(b"0\r\n\r\n").is_ok();
    let written = if script.stream { script.written_by(ends.len()) } else { script.output };
    (written, whole)
}

/// `body` compressed with gzip.
fn gzip(body: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = encoder.write_all(body);
    encoder.finish().unwrap_or_default()
}

/// One request: its path, its headers (lower-case names) and its body
/// (`content-length` or chunked).
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(String, HashMap<String, String>, Vec<u8>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let path = line.split(' ').nth(1)?.to_string();
    let mut headers = HashMap::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    let mut body = Vec::new();
    if let Some(len) = headers.get("content-length").and_then(|l| l.parse::<usize>().ok()) {
        body.resize(len, 0);
        reader.read_exact(&mut body).ok()?;
    } else if headers.get("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        loop {
            line.clear();
            reader.read_line(&mut line).ok()?;
            let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    Some((path, headers, body))
}

/// An answer as a client read it.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    /// Lower-case names.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    /// The body came whole (its last chunk, or all of its `content-length`);
    /// false when the connection ended first.
    pub complete: bool,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// POSTs `body` to `path` on `127.0.0.1:port` over a connection of its own,
/// and reads the answer to its end (or the connection's).
pub fn post(port: u16, path: &str, headers: &[(&str, &str)], body: &[u8]) -> anyhow::Result<Reply> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut headers = HashMap::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    let mut body = Vec::new();
    let complete = if let Some(len) = headers.get("content-length").and_then(|l| l.parse::<usize>().ok()) {
        body.resize(len, 0);
        reader.read_exact(&mut body).is_ok()
    } else if headers.get("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        read_chunks(&mut reader, &mut body)
    } else {
        reader.read_to_end(&mut body).is_ok()
    };
    Ok(Reply { status, headers, body, complete })
}

/// Reads a chunked body into `body`; whether its last chunk came.
fn read_chunks(reader: &mut impl BufRead, body: &mut Vec<u8>) -> bool {
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return false;
        }
        let Some(size) = line.trim().split(';').next().and_then(|s| usize::from_str_radix(s, 16).ok()) else {
            return false;
        };
        let mut chunk = vec![0; size + 2];
        if reader.read_exact(&mut chunk).is_err() {
            body.extend_from_slice(&chunk[..size.min(chunk.len())]);
            return false;
        }
        if size == 0 {
            return true;
        }
        body.extend_from_slice(&chunk[..size]);
    }
}

/// A request body in `api`'s shape: `prompt` as the user's message,
/// `max_tokens` as the API names its cap, and streamed or not (an OpenAI
/// chat stream asks for its usage).
pub fn request_body(api: Api, prompt: &str, max_tokens: Option<u64>, stream: bool) -> Vec<u8> {
    let mut body = match api {
        Api::OpenaiChat => json!({"model": "mock", "messages": [{"role": "user", "content": prompt}]}),
        Api::OpenaiResponses => json!({"model": "mock", "input": prompt}),
        Api::AnthropicMessages => json!({"model": "mock", "messages": [{"role": "user", "content": prompt}]}),
    };
    if let Some(n) = max_tokens {
        let field = match api {
            Api::OpenaiChat => "max_completion_tokens",
            Api::OpenaiResponses => "max_output_tokens",
            Api::AnthropicMessages => "max_tokens",
        };
        body[field] = json!(n);
    }
    if stream {
        body["stream"] = json!(true);
        if api == Api::OpenaiChat {
            body["stream_options"] = json!({"include_usage": true});
        }
    }
    body.to_string().into_bytes()
}

/// The path of `api`.
pub fn path(api: Api) -> &'static str {
    match api {
        Api::OpenaiChat => "/v1/chat/completions",
        Api::OpenaiResponses => "/v1/responses",
        Api::AnthropicMessages => "/v1/messages",
    }
}
