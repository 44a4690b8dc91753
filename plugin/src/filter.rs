//! The HTTP context: for each request, match the policies, ask the shim about
//! all of them in one call, and resume the request or answer it.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};
use sluice_policies::wire::{Check, CheckRequest, CHECK_PATH};
use sluice_policies::{Document, FailureMode};

use crate::decision::{decide, deny_body, missing_key_body, Decision};
use crate::host::HostRequest;

pub struct Sluice {
    doc: Option<Rc<Document>>,
    /// The checks sent to the shim, kept to read its answer.
    pending: Vec<Check>,
}

impl Sluice {
    pub fn new(doc: Option<Rc<Document>>) -> Sluice {
        Sluice { doc, pending: Vec::new() }
    }

    /// Asks the shim; `Pause` until it answers, or the failure decision.
    fn ask_shim(&mut self, doc: &Document, checks: Vec<Check>) -> Action {
        let body = match serde_json::to_vec(&CheckRequest { checks, now_us: None }) {
            Ok(body) => body,
            Err(err) => return self.fail(doc, &format!("cannot encode the check: {err}")),
        };
        let headers = vec![
            (":method", "POST"),
            (":path", CHECK_PATH),
            (":authority", "sluice-shim"),
            ("content-type", "application/json"),
        ];
        let timeout = Duration::from_millis(doc.shim.timeout_ms.get().into());
        match hostcalls::dispatch_http_call(&doc.shim.cluster, headers, Some(&body), vec![], timeout) {
            Ok(_) => Action::Pause,
            Err(status) => self.fail(doc, &format!("cannot call cluster {:?}: {status:?}", doc.shim.cluster)),
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
}

impl Context for Sluice {
    fn on_http_call_response(&mut self, _token: u32, num_headers: usize, body_size: usize, _trailers: usize) {
        let Some(doc) = self.doc.clone() else { return };
        let status = match num_headers {
            0 => None,
            _ => hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status").ok().flatten(),
        };
        let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten();
        let checks = std::mem::take(&mut self.pending);
        match decide(status.as_deref(), body.as_deref(), &checks) {
            Decision::Allow => resume(),
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
}

impl HttpContext for Sluice {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(doc) = self.doc.clone() else { return Action::Continue };
        let req = HostRequest::read();
        let checks: Vec<Check> = match doc.evaluate(&req) {
            Ok(applied) => applied.iter().map(|a| a.check(&req)).collect(),
            Err(policy) => {
                let body = missing_key_body(policy.name.as_str());
                respond(400, vec![("content-type", "application/json")], &body);
                return Action::Pause;
            }
        };
        if checks.is_empty() {
            return Action::Continue;
        }
        self.pending = checks.clone();
        self.ask_shim(&doc, checks)
    }
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
