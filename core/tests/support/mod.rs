//! Driving the flow in tests: a worker over a [`FakeHost`], streams that
//! take events and keep their effects, and a stand-in for the shim's
//! answers. Nothing here decides anything: it only builds events and reads
//! effects.
#![allow(dead_code)]

use std::rc::Rc;

use serde_json::{json, Value};
use sluice_core::flow::CHECK_ENCODING;
use sluice_core::local_reply::LocalReply;
use sluice_core::stats::PolicyStat;
use sluice_core::testing::FakeHost;
use sluice_core::{CallResult, Effect, Flow, Outgoing, Phase, Worker};
use sluice_policies::request::SimpleRequest;
use sluice_policies::wire::{CheckRequest, CheckResponse, Encoding, LEASE_PATH, SHED_PATH};

pub const CONCURRENCY: &str =
    r#"{"policies": [{"name": "c", "limits": [{"type": "concurrency", "limit": 2, "lease": "30s"}]}]}"#;

pub const WAIT: &str = r#"{"policies": [{"name": "w", "wait": {"timeout": "5s"}, "limits": [{"type": "interval", "every": "1s"}]}]}"#;

pub const SHED: &str = r#"{"class_header": "x-class",
    "classes": [{"name": "critical"}, {"name": "batch"}],
    "policies": [{"name": "s", "shed": {"signal": {"orca": "cpu_utilization"}},
                  "limits": [{"type": "concurrency", "limit": 100, "lease": "30s"}]}]}"#;

pub fn get(path: &str) -> SimpleRequest {
    SimpleRequest::new("GET", path)
}

/// One worker, its host, and the streams a test opens on it.
pub struct Test {
    pub worker: Rc<Worker>,
    pub host: FakeHost,
}

impl Test {
    pub fn new(doc: &str) -> Test {
        let doc = sluice_policies::parse(doc).unwrap_or_else(|e| panic!("{e}"));
        let host = FakeHost::at(1_000_000);
        Test { worker: Rc::new(Worker::new(doc, 1_000_000, 7)), host }
    }

    pub fn stream(&self) -> Stream<'_> {
        Stream { flow: Flow::new(self.worker.clone()), host: &self.host, worker: &self.worker }
    }

    /// Ticks the worker and returns its calls to `path` (the others are answered 200).
    pub fn worker_sends(&self, path: &str) -> Vec<Outgoing> {
        let mut out = Vec::new();
        for effect in self.worker.tick(&self.host.now(), &self.host) {
            if let Effect::Send(call) = effect {
                if call.path == path {
                    out.push(call);
                }
            }
        }
        out
    }

    /// Sets the fleet's shed level of policy `index`, as the shim would answer a report.
    pub fn shed_level(&self, index: usize, level: f64) {
        let reports = self.worker_sends(SHED_PATH);
        assert!(!reports.is_empty(), "a shed report is due");
        for report in reports {
            let body = json!({ "level": level }).to_string().into_bytes();
            let _ = index;
            self.worker.handle_answer(&self.host.now(), report.id, ok(body), &self.host);
        }
    }

    /// Grants leased policy `index` `tokens`, as the shim would answer the worker's lease call.
    pub fn grant_lease(&self, _index: usize, tokens: u32) {
        let asks = self.worker_sends(LEASE_PATH);
        assert_eq!(asks.len(), 1, "one lease call");
        let body = json!({"granted": tokens, "window": 1, "expires_in_ms": 60_000, "remaining": 90})
            .to_string()
            .into_bytes();
        self.worker.handle_answer(&self.host.now(), asks[0].id, ok(body), &self.host);
    }
}

/// One request's flow, with the test's host.
pub struct Stream<'t> {
    pub flow: Flow,
    host: &'t FakeHost,
    worker: &'t Worker,
}

impl Stream<'_> {
    /// `fx`, with the calls it leaves to the worker handed over, as the adapter does.
    pub fn performed(&self, fx: Vec<Effect>) -> Vec<Effect> {
        for effect in &fx {
            if let Effect::Defer(call) = effect {
                self.worker.defer(call.clone());
            }
        }
        fx
    }

    pub fn request(&mut self, req: &SimpleRequest) -> Vec<Effect> {
        let fx = self.flow.handle_request_headers(&self.host.now(), req, self.host);
        self.performed(fx)
    }

    pub fn hold_request(&mut self) -> bool {
        self.flow.hold_request()
    }

    pub fn hold_response(&mut self) -> bool {
        self.flow.hold_response()
    }

    pub fn answer(&mut self, call: &Outgoing, result: &CallResult) -> Vec<Effect> {
        let fx = self.flow.handle_answer(&self.host.now(), call.id, result.clone(), self.host);
        self.performed(fx)
    }

    /// The response's headers arrive (and are what the host reads from now on).
    pub fn response(&mut self, headers: &[(&str, &str)], end_of_stream: bool) -> Vec<Effect> {
        self.host.respond(headers);
        let fx = self.flow.handle_response_headers(&self.host.now(), end_of_stream, self.host);
        self.performed(fx)
    }

    pub fn body(&mut self, size: usize, end_of_stream: bool) -> Vec<Effect> {
        let fx = self.flow.handle_response_body(&self.host.now(), size, end_of_stream, self.host);
        self.performed(fx)
    }

    /// More of the request's body arrives (the host buffers it whole).
    pub fn request_body(&mut self, req: &SimpleRequest, bytes: &[u8], end_of_stream: bool) -> Vec<Effect> {
        let size = self.host.request_bytes(bytes);
        let fx = self.flow.handle_request_body(&self.host.now(), req, size, end_of_stream, self.host);
        self.performed(fx)
    }

    /// A chunk of the response's body arrives.
    pub fn chunk(&mut self, bytes: &[u8], end_of_stream: bool) -> Vec<Effect> {
        let size = self.host.response_chunk(bytes);
        let fx = self.flow.handle_response_body(&self.host.now(), size, end_of_stream, self.host);
        self.performed(fx)
    }

    pub fn end(&mut self) -> Vec<Effect> {
        let fx = self.flow.handle_stream_end(&self.host.now(), self.host);
        self.performed(fx)
    }

    pub fn phase(&self) -> Phase {
        self.flow.phase()
    }
}

fn ok(body: Vec<u8>) -> CallResult {
    CallResult::Answered { status: Some(b"200".to_vec()), body: Some(body) }
}

/// A check's answer, written as JSON here, in the wire the filter reads it in.
fn checked(answer: Value) -> CallResult {
    let answer: CheckResponse = serde_json::from_value(answer).expect("a check's answer");
    ok(CHECK_ENCODING.encode(&answer).expect("encodes"))
}

/// The shim's answers to a check.
pub struct Shim;

impl Shim {
    fn outcome(allowed: bool, retry_after_ms: u64) -> Value {
        json!({"allowed": allowed, "remaining": if allowed {1} else {0}, "reset_ms": 1000,
               "retry_after_ms": if allowed {0} else {retry_after_ms}})
    }

    fn answer(call: &Outgoing, allowed: bool, extra: Value) -> CallResult {
        let checks: Vec<Value> = call
            .checks()
            .iter()
            .map(|c| {
                let limits: Vec<Value> =
                    c["limits"].as_array().into_iter().flatten().map(|_| Shim::outcome(allowed, 0)).collect();
                json!({ "limits": limits })
            })
            .collect();
        let mut answer = json!({"allowed": allowed, "retry_after_ms": 0, "checks": checks});
        if let (Some(a), Some(e)) = (answer.as_object_mut(), extra.as_object()) {
            a.extend(e.clone());
        }
        checked(answer)
    }

    pub fn allow(call: &Outgoing) -> CallResult {
        Shim::answer(call, true, json!({}))
    }

    pub fn allow_lease(call: &Outgoing, lease: &str) -> CallResult {
        Shim::answer(call, true, json!({ "lease": lease }))
    }

    pub fn allow_after(call: &Outgoing, waited_ms: u64) -> CallResult {
        Shim::answer(call, true, json!({ "waited_ms": waited_ms }))
    }

    /// Admits a one-limit points check, its charge held until `held_until_us`.
    pub fn allow_points(held_until_us: u64) -> CallResult {
        let mut limit = Shim::outcome(true, 0);
        limit["held_until_us"] = json!(held_until_us);
        let answer = json!({"allowed": true, "retry_after_ms": 0, "checks": [{"limits": [limit]}]});
        checked(answer)
    }

    /// Admits a one-limit points check with `remaining` points left after
    /// its charge, held until `held_until_us`.
    pub fn allow_points_left(held_until_us: u64, remaining: u64) -> CallResult {
        let mut limit = Shim::outcome(true, 0);
        limit["held_until_us"] = json!(held_until_us);
        limit["remaining"] = json!(remaining);
        let answer = json!({"allowed": true, "retry_after_ms": 0, "checks": [{"limits": [limit]}]});
        checked(answer)
    }

    /// Denies check `denied` of `checks` (each with one limit), for `retry_after_ms`.
    pub fn deny_check(denied: usize, checks: usize, retry_after_ms: u64) -> CallResult {
        let checks: Vec<Value> =
            (0..checks).map(|i| json!({"limits": [Shim::outcome(i != denied, retry_after_ms)]})).collect();
        let answer = json!({"allowed": false, "retry_after_ms": retry_after_ms, "checks": checks});
        checked(answer)
    }

    pub fn released(n: u64) -> CallResult {
        ok(json!({ "released": n }).to_string().into_bytes())
    }

    pub fn status(status: u16) -> CallResult {
        CallResult::Answered { status: Some(status.to_string().into_bytes()), body: Some(b"{}".to_vec()) }
    }

    pub fn timed_out() -> CallResult {
        CallResult::Answered { status: None, body: None }
    }

    pub fn not_sent() -> CallResult {
        CallResult::NotSent("no such cluster".into())
    }
}

/// Reading a call's JSON body.
pub trait Body {
    fn json(&self) -> Value;
    fn checks(&self) -> Vec<Value> {
        self.json()["checks"].as_array().cloned().unwrap_or_default()
    }
    fn lease(&self) -> String {
        self.json()["lease"].as_str().unwrap_or_default().to_string()
    }
    fn id(&self) -> String {
        self.json()["id"].as_str().unwrap_or_default().to_string()
    }
    fn wait_ms(&self) -> Option<u64> {
        self.json()["wait_ms"].as_u64()
    }
}

impl Body for Outgoing {
    /// The body as JSON; a check in the binary wire decoded first.
    fn json(&self) -> Value {
        match self.encoding {
            Encoding::Json => serde_json::from_slice(&self.body).expect("a JSON body"),
            Encoding::Binary => {
                let check: CheckRequest = Encoding::Binary.decode(&self.body).expect("a binary check");
                serde_json::to_value(check).expect("as JSON")
            }
        }
    }
}

pub fn sends(fx: &[Effect]) -> Vec<Outgoing> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Send(call) => Some(call.clone()),
            _ => None,
        })
        .collect()
}

/// The one call to `path` among the effects.
pub fn sent(fx: &[Effect], path: &str) -> Outgoing {
    let mut calls = sends(fx).into_iter().filter(|c| c.path == path);
    let call = calls.next().unwrap_or_else(|| panic!("no call to {path} in {fx:?}"));
    assert!(calls.next().is_none(), "two calls to {path}");
    call
}

pub fn replied(fx: &[Effect]) -> Option<LocalReply> {
    fx.iter().find_map(|e| match e {
        Effect::Reply(reply) => Some(LocalReply::clone(reply)),
        _ => None,
    })
}

pub fn added(fx: &[Effect], name: &str) -> Option<String> {
    fx.iter().find_map(|e| match e {
        Effect::AddResponseHeader { name: n, value } if *n == name => Some(value.clone()),
        _ => None,
    })
}

pub fn count(fx: &[Effect], policy: usize, stat: PolicyStat) -> u64 {
    fx.iter()
        .map(|e| match e {
            Effect::Policy { policy: p, stat: s, n } if *p == policy && *s == stat => *n,
            _ => 0,
        })
        .sum()
}
