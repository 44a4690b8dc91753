//! Nothing upstream before the decision: a request whose body a policy
//! reads keeps its headers from the upstream too until it is decided
//! (`StopIteration` on the headers, with the Wasm filter's
//! `allow_on_headers_stop_iteration`), so a refused request never reaches
//! the upstream, not even as headers that Envoy then resets (over HTTP/1.1
//! each such reset costs the upstream a connection).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_harness::llm::{self, post, request_body};
use sluice_harness::{Envoy, Redis, Shim};
use sluice_policies::llm::Api;

/// An upstream that counts the connections it accepts and the requests it
/// reads (headers and all), and answers each with an OpenAI chat completion
/// that used 1,000 tokens.
struct Counting {
    port: u16,
    connections: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
}

impl Counting {
    fn start() -> Counting {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let connections = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(AtomicU64::new(0));
        let (c, r) = (connections.clone(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                c.fetch_add(1, Ordering::SeqCst);
                let r = r.clone();
                std::thread::spawn(move || serve(stream, &r));
            }
        });
        Counting { port, connections, requests }
    }
}

fn serve(stream: TcpStream, requests: &AtomicU64) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        requests.fetch_add(1, Ordering::SeqCst);
        let mut length = 0;
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let answer =
            r#"{"choices":[],"usage":{"prompt_tokens":500,"completion_tokens":500,"total_tokens":1000}}"#;
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// A budget that the first request's reservation spends whole (its body's
/// bytes and its cap of 100); a burst of 200 more (8 clients at once) is
/// refused, and not one of them reaches the upstream: one connection, one
/// request, in all.
#[test]
fn a_burst_of_refusals_reaches_no_upstream() {
    let body = request_body(Api::OpenaiChat, "hello", Some(100), false);
    let capacity = body.len() + 100;
    let doc = format!(
        r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "policies": [
        {{"name": "budget", "match": {{"path_prefix": "/v1/"}}, "key": ["header:x-team"],
         "llm": {{"api": "openai_chat", "default_max_tokens": 100}},
         "limits": [{{"type": "points", "capacity": {capacity}, "refill": "1d", "cost": "llm_tokens"}}]}}]}}"#
    );
    let redis = Redis::start().expect("redis");
    let shim = Shim::start(&redis.url()).expect("shim");
    let upstream = Counting::start();
    let envoy = Envoy::start(&doc, shim.port, upstream.port).expect("envoy");
    let path = llm::path(Api::OpenaiChat);
    let first = post(envoy.port, path, &[("x-team", "a")], &body).expect("the first request");
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(upstream.requests.load(Ordering::SeqCst), 1);

    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..25 {
                    let reply = post(envoy.port, path, &[("x-team", "a")], &body).expect("a request");
                    assert_eq!(reply.status, 429, "{}", reply.text());
                }
            });
        }
    });
    let connections = upstream.connections.load(Ordering::SeqCst);
    let requests = upstream.requests.load(Ordering::SeqCst);
    println!("200 refusals: the upstream saw {connections} connection(s), {requests} request(s)");
    assert_eq!(requests, 1, "no refused request reached the upstream");
    assert_eq!(connections, 1, "no refusal cost the upstream a connection");
}
