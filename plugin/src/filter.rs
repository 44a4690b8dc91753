//! The HTTP context: for each request, match the policies, ask the shim about
//! all of them in one call, and resume the request or answer it. After an
//! admitted request: release its lease at the stream's end, and correct the
//! points it was charged once the response tells its true cost.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};
use sluice_policies::wire::{
    AdjustRequest, Adjustment, Check, CheckRequest, ReleaseRequest, WireLimit, ADJUST_PATH, CHECK_PATH,
    RELEASE_PATH,
};
use sluice_policies::{Document, FailureMode, Limit};

use crate::callout::{check_timeout, post, post_in_background};
use crate::decision::{decide, deny_body, missing_key_body, Decision};
use crate::host::HostRequest;

pub struct Sluice {
    doc: Option<Rc<Document>>,
    root_id: u32,
    context_id: u32,
    /// The checks sent to the shim, kept to read its answer and to release
    /// and adjust afterwards.
    checks: Vec<Check>,
    /// The pending check call; other calls' answers are not for this stream.
    check_token: Option<u32>,
    /// The lease to release at the stream's end, taken when released.
    lease: Option<String>,
    admitted: bool,
}

impl Sluice {
    pub fn new(doc: Option<Rc<Document>>, root_id: u32, context_id: u32) -> Sluice {
        Sluice {
            doc,
            root_id,
            context_id,
            checks: Vec::new(),
            check_token: None,
            lease: None,
            admitted: false,
        }
    }

    /// Asks the shim; `Pause` until it answers, or the failure decision.
    fn ask_shim(&mut self, doc: &Document) -> Action {
        let req = CheckRequest { checks: self.checks.clone(), now_us: None };
        match post(doc, CHECK_PATH, &req, check_timeout(doc)) {
            Ok(token) => {
                self.check_token = Some(token);
                Action::Pause
            }
            Err(reason) => self.fail(doc, &reason),
        }
    }

    /// The shim could not decide: `failure_mode` does.
    fn fail(&self, doc: &Document, reason: &str) -> Action {
        match doc.failure_mode {
            FailureMode::Allow => {
                log::warn!("{reason}; failure_mode allow lets the request through");
                Action::Continue
            }
            FailureMode::Deny => {
                log::warn!("{reason}; failure_mode deny answers 503");
                let body = br#"{"error":"rate_limiter_unavailable"}"#;
                respond(503, vec![("content-type", "application/json")], body);
                Action::Pause
            }
        }
    }

    /// Exactly once per admitted request that holds a lease.
    fn release_lease(&mut self) {
        let (Some(doc), Some(lease)) = (self.doc.clone(), self.lease.take()) else { return };
        let req = ReleaseRequest { lease, checks: std::mem::take(&mut self.checks) };
        post_in_background(&doc, self.root_id, self.context_id, RELEASE_PATH, &req);
    }

    /// The points corrections that the response's actual-cost headers call for.
    fn adjustments(&self, doc: &Document) -> Vec<Adjustment> {
        let mut out = Vec::new();
        for check in &self.checks {
            let Some(policy) = doc.policies.iter().find(|p| p.name.as_str() == check.policy) else {
                continue;
            };
            for (limit, wire) in policy.limits.iter().zip(&check.limits) {
                let (Limit::Points { actual_cost_header: Some(header), .. }, WireLimit::Points { .. }) =
                    (limit, wire)
                else {
                    continue;
                };
                if let Some(actual) = response_number(header.as_str()) {
                    out.push(Adjustment {
                        policy: check.policy.clone(),
                        key: check.key.clone(),
                        limit: *wire,
                        actual,
                    });
                }
            }
        }
        out
    }
}

impl Context for Sluice {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _trailers: usize) {
        if self.check_token != Some(token) {
            return;
        }
        self.check_token = None;
        let Some(doc) = self.doc.clone() else { return };
        let status = match num_headers {
            0 => None,
            _ => hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status").ok().flatten(),
        };
        let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten();
        match decide(status.as_deref(), body.as_deref(), &self.checks) {
            Decision::Allow { lease } => {
                self.admitted = true;
                self.lease = lease;
                resume();
            }
            Decision::Deny { policy, retry_after_secs } => {
                let retry_after = retry_after_secs.to_string();
                let headers =
                    vec![("retry-after", retry_after.as_str()), ("content-type", "application/json")];
                respond(429, headers, &deny_body(&policy, retry_after_secs));
            }
            Decision::Fail(reason) => {
                if let Action::Continue = self.fail(&doc, &reason) {
                    resume();
                }
            }
        }
    }

    fn on_done(&mut self) -> bool {
        self.release_lease();
        true
    }
}

impl HttpContext for Sluice {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(doc) = self.doc.clone() else { return Action::Continue };
        let req = HostRequest::read();
        self.checks = match doc.evaluate(&req) {
            Ok(applied) => applied.iter().map(|a| a.check(&req)).collect(),
            Err(policy) => {
                let body = missing_key_body(policy.name.as_str());
                respond(400, vec![("content-type", "application/json")], &body);
                return Action::Pause;
            }
        };
        if self.checks.is_empty() {
            return Action::Continue;
        }
        self.ask_shim(&doc)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(doc) = self.doc.clone() else { return Action::Continue };
        if self.admitted {
            let adjustments = self.adjustments(&doc);
            if !adjustments.is_empty() {
                let req = AdjustRequest { adjustments, now_us: None };
                post_in_background(&doc, self.root_id, self.context_id, ADJUST_PATH, &req);
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.release_lease();
    }
}

/// A response header as a whole number, if it is one.
fn response_number(name: &str) -> Option<u32> {
    let value = hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name).ok().flatten()?;
    std::str::from_utf8(&value).ok()?.trim().parse().ok()
}

fn resume() {
    if let Err(status) = hostcalls::resume_http_request() {
        log::warn!("cannot resume the request: {status:?}");
    }
}

fn respond(status: u32, headers: Vec<(&str, &str)>, body: &[u8]) {
    if let Err(status) = hostcalls::send_http_response(status, headers, Some(body)) {
        log::warn!("cannot send the local response: {status:?}");
    }
}
