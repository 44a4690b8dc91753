//! `http_call`s: where each cluster routes, the calls in flight, and what
//! answer each one gets.
//!
//! A cluster routes either to the real shim over real HTTP/2 (as Envoy's
//! cluster does), or to a scripted endpoint that exists to model a broken
//! shim. A real call is sent when the filter dispatches it, so the shim
//! decides in dispatch order; its answer is held until the story delivers it,
//! which keeps every test deterministic.
//!
//! Envoy's rules: an unknown cluster, or headers without `:method`, `:path`
//! and `:authority`, is BadArgument; a call that fails (refused, reset, timed
//! out) reaches the filter as a response with no headers, no body and no
//! trailers; calls still pending when their stream ends are cancelled.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{CheckOutcome, CheckRequest, CheckResponse, Encoding, LimitOutcome};

use super::pairs::HeaderMap;

/// An `http_call` the filter dispatched.
#[derive(Debug, Clone)]
pub struct HttpCall {
    pub token: u32,
    pub context: u32,
    pub cluster: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub timeout_ms: u32,
}

impl HttpCall {
    /// The body as JSON, whatever its encoding: a check in the binary wire
    /// is decoded first. `None` when it is neither.
    pub fn json_body(&self) -> Option<serde_json::Value> {
        match Encoding::of_content_type(self.headers.get("content-type")) {
            Encoding::Json => serde_json::from_slice(&self.body).ok(),
            Encoding::Binary => {
                let check: CheckRequest = Encoding::Binary.decode(&self.body).ok()?;
                serde_json::to_value(check).ok()
            }
        }
    }
}

/// A timeout of 0 means none in Envoy; the host still never waits longer.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// Where a cluster's calls go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The real `sluice serve` on this loopback port.
    Shim { port: u16 },
    /// Nowhere: each call is answered with the [`Answer`] the story scripts.
    Scripted,
}

/// How the shim answers one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The real shim's answer (the cluster must route to [`Route::Shim`]).
    Real,
    /// Scripted: every limit allows.
    Allow,
    /// Scripted: every limit allows, after the shim held the request this long.
    Held {
        waited_ms: u64,
    },
    /// Scripted: the first limit denies, for this long.
    Deny {
        retry_after_ms: u64,
    },
    Fault(Fault),
}

/// A broken shim, as the filter sees it through Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing listens: Envoy calls back with no response.
    Refused,
    /// No answer within `timeout_ms`: Envoy calls back with no response.
    Timeout,
    /// `500` with a text body.
    ServerError,
    /// `200` with a body that is not JSON.
    Garbage,
    /// `200` with the JSON of an allowed answer cut off half way.
    CutShort,
}

/// What Envoy hands back to the filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Response {
        headers: HeaderMap,
        body: Vec<u8>,
    },
    /// Refused, reset or timed out: `proxy_on_http_call_response(ctx, token, 0, 0, 0)`.
    Failure,
}

#[derive(Debug)]
pub(crate) struct Pending {
    pub call: HttpCall,
    /// The real shim's answer, for [`Route::Shim`].
    pub real: Option<Outcome>,
}

#[derive(Default)]
pub(crate) struct Calls {
    pub clusters: HashMap<String, Route>,
    pub pending: BTreeMap<u32, Pending>,
    next_token: u32,
    client: Option<(tokio::runtime::Runtime, reqwest::Client)>,
}

/// Why a dispatch was refused: Envoy's BadArgument or InternalFailure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    BadArgument,
    InternalFailure,
}

impl Calls {
    pub(crate) fn new(clusters: impl IntoIterator<Item = (String, Route)>) -> Calls {
        Calls { clusters: clusters.into_iter().collect(), ..Calls::default() }
    }

    pub(crate) fn dispatch(&mut self, mut call: HttpCall) -> Result<u32, Refusal> {
        let Some(route) = self.clusters.get(&call.cluster).copied() else {
            return Err(Refusal::BadArgument);
        };
        if [":method", ":path", ":authority"].iter().any(|h| call.headers.get(h).is_none()) {
            return Err(Refusal::BadArgument);
        }
        self.next_token += 1;
        call.token = self.next_token;
        let real = match route {
            Route::Shim { port } => Some(self.send(port, &call).map_err(|_| Refusal::InternalFailure)?),
            Route::Scripted => None,
        };
        self.pending.insert(call.token, Pending { call, real });
        Ok(self.next_token)
    }

    /// Drops the calls of a stream that ended, without a callback.
    pub(crate) fn cancel_for(&mut self, context: u32) {
        self.pending.retain(|_, p| p.call.context != context);
    }

    /// Sends `call` to the shim over HTTP/2 with prior knowledge, as Envoy's
    /// cluster does. Transport errors and timeouts become [`Outcome::Failure`];
    /// only a failure to build the client is an error.
    fn send(&mut self, port: u16, call: &HttpCall) -> anyhow::Result<Outcome> {
        if self.client.is_none() {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let client = reqwest::Client::builder().http2_prior_knowledge().build()?;
            self.client = Some((runtime, client));
        }
        let Some((runtime, client)) = &self.client else { anyhow::bail!("no HTTP client") };
        let path = call.headers.get_str(":path").unwrap_or_default();
        let method = call.headers.get(":method").unwrap_or(b"GET");
        let method = reqwest::Method::from_bytes(method)?;
        let mut request = client.request(method, format!("http://127.0.0.1:{port}{path}"));
        for (name, value) in call.headers.pairs().iter().filter(|(name, _)| !name.starts_with(':')) {
            request = request.header(name.as_str(), value.as_slice());
        }
        let wait = match call.timeout_ms {
            0 => MAX_WAIT,
            ms => Duration::from_millis(ms.into()).min(MAX_WAIT),
        };
        let request = request.body(call.body.clone()).timeout(wait);
        Ok(runtime.block_on(async move {
            let Ok(response) = request.send().await else { return Outcome::Failure };
            let mut headers = HeaderMap::new();
            headers.add(":status", response.status().as_str());
            for (name, value) in response.headers() {
                headers.add(name.as_str(), value.as_bytes());
            }
            match response.bytes().await {
                Ok(body) => Outcome::Response { headers, body: body.to_vec() },
                Err(_) => Outcome::Failure,
            }
        }))
    }
}

/// The scripted answer to `call`. Allow and deny are well-formed
/// [`CheckResponse`]s with one outcome per check and limit of the request,
/// in the call's encoding, as the shim answers.
pub(crate) fn scripted(answer: Answer, call: &HttpCall) -> Outcome {
    let encoding = Encoding::of_content_type(call.headers.get("content-type"));
    let respond = |status: &str, body: Vec<u8>| {
        let mut headers = HeaderMap::new();
        headers.add(":status", status);
        headers.add("content-type", encoding.content_type());
        Outcome::Response { headers, body }
    };
    match answer {
        Answer::Real | Answer::Fault(Fault::Refused | Fault::Timeout) => Outcome::Failure,
        Answer::Allow => respond("200", check_response(call, None, None)),
        Answer::Held { waited_ms } => respond("200", check_response(call, None, Some(waited_ms))),
        Answer::Deny { retry_after_ms } => respond("200", check_response(call, Some(retry_after_ms), None)),
        Answer::Fault(Fault::ServerError) => respond("500", b"internal error\n".to_vec()),
        Answer::Fault(Fault::Garbage) => respond("200", b"<html>502 bad gateway</html>".to_vec()),
        Answer::Fault(Fault::CutShort) => {
            let mut body = check_response(call, None, None);
            body.truncate(body.len() / 2);
            respond("200", body)
        }
    }
}

fn check_response(call: &HttpCall, denied_ms: Option<u64>, waited_ms: Option<u64>) -> Vec<u8> {
    let empty = CheckRequest {
        checks: Vec::new().into(),
        now_us: None,
        id: None,
        wait_ms: None,
        views: Default::default(),
    };
    let encoding = Encoding::of_content_type(call.headers.get("content-type"));
    let request: CheckRequest = encoding.decode(&call.body).unwrap_or(empty);
    let mut first = true;
    let mut outcome = || {
        let deny = denied_ms.filter(|_| std::mem::take(&mut first));
        let retry_after_ms = Some(Millis(deny.unwrap_or(0)));
        LimitOutcome {
            allowed: deny.is_none(),
            remaining: 0,
            reset_ms: Millis(1000),
            retry_after_ms,
            reclaimed: 0,
            held_until_us: None,
            refunded_us: Micros(0),
        }
    };
    let checks = request.checks.iter().map(|check| CheckOutcome {
        limits: check.limits.iter().map(|_| outcome()).collect(),
        paused_ms: None,
    });
    let response = CheckResponse {
        allowed: denied_ms.is_none(),
        retry_after_ms: Some(Millis(denied_ms.unwrap_or(0))),
        checks: checks.collect(),
        lease: None,
        waited_ms: waited_ms.map(Millis),
    };
    encoding.encode(&response).unwrap_or_default()
}
