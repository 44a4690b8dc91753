//! Tests as stories. A [`Step`] names one thing that happens to the filter
//! (a request arrives, the shim answers, the client resets) and a builder
//! chain says what the filter should do about it; `.done()` plays it:
//!
//! ```ignore
//! let plugin = Plugin::configured(POLICY, "sluice_shim", Route::Shim { port });
//! let stream = plugin.stream();
//! stream.request_headers(&[(":path", "/v42/a"), ("x-api-key", "alice")]).calls_the_shim().pauses().done();
//! stream.shim_answers().sends(429).with_header("retry-after", "5").done();
//! stream.completes().done();
//! ```
//!
//! A step fails the test when an expectation is not met, when the filter does
//! something the story did not mention (a call, a local response, a resume, a
//! warning), when it returns an action the story did not state, when the VM
//! crashes, or when a request is left paused. A step that is built but never
//! played fails the test when dropped. Metric updates are the exception: a
//! story may expect them (`increments_metric`), but need not mention them.

use std::cell::{RefCell, RefMut};
use std::rc::Rc;

use serde_json::Value;
use sluice_policies::wire::{
    ADJUST_PATH, BATCH_PATH, CHECK_PATH, LEASE_PATH, PROTOCOL_HEADER, PROTOCOL_VERSION, RELEASE_PATH,
};

use super::calls::{Answer, Route};
use super::pairs::HeaderMap;
use super::proxy::{End, HostConfig, Outcome, Proxy, Returned, ROOT};
use super::state::{Effect, LogLevel, MetricChange};

/// sluice.wasm, booted, with its root context.
pub struct Plugin {
    proxy: Rc<RefCell<Proxy>>,
    cluster: String,
}

impl Plugin {
    /// Boots sluice.wasm with `document` as its plugin configuration, calls
    /// to `cluster` going to `route`. Configuring is the next step.
    pub fn boot(document: &str, cluster: &str, route: Route) -> Plugin {
        Plugin::boot_on(HostConfig::new(document).cluster(cluster, route), cluster)
    }

    /// Boots sluice.wasm on a host set up by the test, its calls to
    /// `cluster` routed there.
    pub fn boot_on(config: HostConfig, cluster: &str) -> Plugin {
        let proxy = Proxy::boot(config).unwrap_or_else(|err| panic!("booting sluice.wasm: {err:#}"));
        Plugin { proxy: Rc::new(RefCell::new(proxy)), cluster: cluster.into() }
    }

    /// Boots and configures, expecting the document to be accepted.
    pub fn configured(document: &str, cluster: &str, route: Route) -> Plugin {
        let plugin = Plugin::boot(document, cluster, route);
        plugin.configure().accepts_configuration().done();
        plugin
    }

    /// `proxy_on_configure`.
    pub fn configure(&self) -> Step {
        Step::new(self.proxy.clone(), None, &self.cluster, Event::Configure, "on_configure".into())
    }

    /// The shim's answer to the oldest call the root context made (the
    /// filter makes release calls there, so that the stream's end does not
    /// cancel them) arrives.
    pub fn shim_answers_background_call(&self, answer: Answer) -> Step {
        let label = format!("the shim answers a background call {answer:?}");
        Step::new(self.proxy.clone(), None, &self.cluster, Event::RootAnswer(answer), label)
    }

    /// The root's tick period as the filter last set it, in ms (0: never).
    pub fn tick_period_ms(&self) -> u32 {
        self.proxy.borrow_mut().tick_period_ms()
    }

    /// The root context's tick (`proxy_on_tick`) fires.
    pub fn tick(&self) -> Step {
        Step::new(self.proxy.clone(), None, &self.cluster, Event::Tick, "on_tick".into())
    }

    /// The root context's `on_queue_ready` for the oldest enqueue (Envoy
    /// posts it to the worker's next turn of its event loop).
    pub fn root_wakes(&self) -> Step {
        Step::new(self.proxy.clone(), None, &self.cluster, Event::QueueReady, "on_queue_ready".into())
    }

    /// A new HTTP stream.
    pub fn stream(&self) -> Stream {
        let id = self.proxy.borrow_mut().open().unwrap_or_else(|err| panic!("opening a stream: {err:#}"));
        Stream { proxy: self.proxy.clone(), id, cluster: self.cluster.clone() }
    }

    /// The host itself, for what stories do not cover.
    pub fn proxy(&self) -> RefMut<'_, Proxy> {
        self.proxy.borrow_mut()
    }
}

/// One HTTP stream of a [`Plugin`]; several may be open at once.
pub struct Stream {
    proxy: Rc<RefCell<Proxy>>,
    id: u32,
    cluster: String,
}

impl Stream {
    fn step(&self, event: Event, what: &str) -> Step {
        Step::new(
            self.proxy.clone(),
            Some(self.id),
            &self.cluster,
            event,
            format!("stream {}: {what}", self.id),
        )
    }

    /// The request headers arrive (with the body, end of stream).
    pub fn request_headers(&self, headers: &[(&str, &[u8])]) -> Step {
        self.request(headers.iter().copied().collect())
    }

    pub fn request(&self, headers: HeaderMap) -> Step {
        self.step(Event::RequestHeaders(headers, true), "request headers")
    }

    /// The request headers arrive, a body to follow.
    pub fn request_headers_with_body(&self, headers: &[(&str, &[u8])]) -> Step {
        self.step(
            Event::RequestHeaders(headers.iter().copied().collect(), false),
            "request headers, a body to follow",
        )
    }

    /// A chunk of the request's body arrives (`end`: its last).
    pub fn request_body(&self, bytes: &[u8], end: bool) -> Step {
        self.step(Event::RequestBody(bytes.to_vec(), end), &format!("{} bytes of request body", bytes.len()))
    }

    /// A chunk of the response's body arrives (`end`: its last).
    pub fn response_body(&self, bytes: &[u8], end: bool) -> Step {
        self.step(
            Event::ResponseBody(bytes.to_vec(), end),
            &format!("{} bytes of response body", bytes.len()),
        )
    }

    /// The response body that went on to the client so far.
    pub fn forwarded(&self) -> Vec<u8> {
        self.proxy.borrow_mut().forwarded(self.id)
    }

    /// The real shim's answer to the stream's oldest pending call arrives.
    pub fn shim_answers(&self) -> Step {
        self.shim_replies(Answer::Real)
    }

    /// A scripted answer to the stream's oldest pending call arrives.
    pub fn shim_replies(&self, answer: Answer) -> Step {
        self.step(Event::Answer(answer), &format!("the shim answers {answer:?}"))
    }

    /// The upstream's response headers arrive.
    pub fn upstream_responds(&self, status: u16) -> Step {
        let headers = [(":status", status.to_string())].into_iter().collect();
        self.step(Event::ResponseHeaders(headers), &format!("the upstream answers {status}"))
    }

    /// The upstream's response headers arrive: `:status` and these.
    pub fn upstream_responds_with(&self, status: u16, headers: &[(&str, &str)]) -> Step {
        let mut map: HeaderMap = [(":status", status.to_string())].into_iter().collect();
        for (name, value) in headers {
            map.add(name, *value);
        }
        self.step(Event::ResponseHeaders(map), &format!("the upstream answers {status} with {headers:?}"))
    }

    /// The response went out: `on_log`, `on_done`, `on_delete`.
    pub fn completes(&self) -> Step {
        self.step(Event::End(End::Complete), "the stream completes")
    }

    /// The client resets the stream: its calls are cancelled, then `on_log`,
    /// `on_done`, `on_delete`.
    pub fn client_resets(&self) -> Step {
        self.step(Event::End(End::Reset), "the client resets")
    }

    pub fn id(&self) -> u32 {
        self.id
    }
}

enum Event {
    Configure,
    /// The headers, and whether they end the request.
    RequestHeaders(HeaderMap, bool),
    RequestBody(Vec<u8>, bool),
    ResponseBody(Vec<u8>, bool),
    Answer(Answer),
    RootAnswer(Answer),
    Tick,
    QueueReady,
    ResponseHeaders(HeaderMap),
    End(End),
}

#[derive(Debug)]
enum Expect {
    Returns(Returned),
    /// An `http_call` to the shim's cluster: `POST` to this path.
    Calls(&'static str),
    Resumes,
    ResumesResponse,
    Sends {
        status: u32,
        headers: Vec<(String, String)>,
        body: Option<Value>,
    },
    Logs(LogLevel, String),
    Metric(String, MetricChange),
    /// An enqueue on a shared queue: the root's `on_queue_ready` is due.
    WakesTheRoot,
}

/// One step of a story: an event, and what the filter should do about it.
#[must_use = "a step is played by .done()"]
pub struct Step {
    proxy: Rc<RefCell<Proxy>>,
    stream: Option<u32>,
    cluster: String,
    event: Option<Event>,
    expects: Vec<Expect>,
    label: String,
    /// `on_configure`'s answer must always be told.
    configures: bool,
}

impl Step {
    fn new(
        proxy: Rc<RefCell<Proxy>>,
        stream: Option<u32>,
        cluster: &str,
        event: Event,
        label: String,
    ) -> Step {
        let configures = matches!(event, Event::Configure);
        Step {
            proxy,
            stream,
            cluster: cluster.into(),
            event: Some(event),
            expects: Vec::new(),
            label,
            configures,
        }
    }

    fn expect(mut self, expect: Expect) -> Step {
        self.expects.push(expect);
        self
    }

    pub fn accepts_configuration(self) -> Step {
        self.expect(Expect::Returns(Returned::Bool(true)))
    }

    pub fn refuses_configuration(self) -> Step {
        self.expect(Expect::Returns(Returned::Bool(false)))
    }

    /// `on_request_headers` returns Continue.
    pub fn continues(self) -> Step {
        self.expect(Expect::Returns(Returned::Continue))
    }

    /// `on_request_headers` returns Pause.
    pub fn pauses(self) -> Step {
        self.expect(Expect::Returns(Returned::Pause))
    }

    /// One `http_call` to the shim's cluster: `POST /v1/check`.
    pub fn calls_the_shim(self) -> Step {
        self.expect(Expect::Calls(CHECK_PATH))
    }

    /// One `http_call` to the shim's cluster with the queued checks of
    /// several requests: `POST /v1/checks`.
    pub fn calls_the_shim_with_a_batch(self) -> Step {
        self.expect(Expect::Calls(BATCH_PATH))
    }

    /// One `http_call` to the shim's cluster that releases a lease: `POST /v1/release`.
    pub fn releases_the_lease(self) -> Step {
        self.expect(Expect::Calls(RELEASE_PATH))
    }

    /// One `http_call` to the shim's cluster for a leased policy's pool: `POST /v1/lease`.
    pub fn asks_for_a_lease(self) -> Step {
        self.expect(Expect::Calls(LEASE_PATH))
    }

    /// One `http_call` to the shim's cluster that corrects points: `POST /v1/adjust`.
    pub fn adjusts_points(self) -> Step {
        self.expect(Expect::Calls(ADJUST_PATH))
    }

    /// A byte enqueued on the VM's wake-up queue: the root's
    /// `on_queue_ready` comes next ([`Plugin::root_wakes`]).
    pub fn wakes_the_root(self) -> Step {
        self.expect(Expect::WakesTheRoot)
    }

    /// The paused request is resumed (`continue_stream(HttpRequest)`).
    pub fn resumes(self) -> Step {
        self.expect(Expect::Resumes)
    }

    /// The paused response is resumed (`continue_stream(HttpResponse)`).
    pub fn resumes_the_response(self) -> Step {
        self.expect(Expect::ResumesResponse)
    }

    /// A local response with this status.
    pub fn sends(self, status: u32) -> Step {
        self.expect(Expect::Sends { status, headers: Vec::new(), body: None })
    }

    /// The last `sends` carries this header with exactly this value.
    pub fn with_header(mut self, name: &str, value: &str) -> Step {
        match self.expects.last_mut() {
            Some(Expect::Sends { headers, .. }) => headers.push((name.into(), value.into())),
            _ => panic!("{}: with_header must follow sends", self.label),
        }
        self
    }

    /// The last `sends` has this JSON body.
    pub fn with_json_body(mut self, json: Value) -> Step {
        match self.expects.last_mut() {
            Some(Expect::Sends { body, .. }) => *body = Some(json),
            _ => panic!("{}: with_json_body must follow sends", self.label),
        }
        self
    }

    /// A warning containing `text`.
    pub fn warns(self, text: &str) -> Step {
        self.expect(Expect::Logs(LogLevel::Warn, text.into()))
    }

    /// An error log line containing `text`.
    pub fn logs_error(self, text: &str) -> Step {
        self.expect(Expect::Logs(LogLevel::Error, text.into()))
    }

    pub fn increments_metric(self, name: &str, by: i64) -> Step {
        self.expect(Expect::Metric(name.into(), MetricChange::Increment(by)))
    }

    /// Plays the step and checks it; panics with the whole story of the step
    /// if it did not go as told.
    pub fn done(mut self) -> Outcome {
        let event = self.event.take().expect("a step is played once");
        let outcome = match self.play(event) {
            Ok(outcome) => outcome,
            Err(err) => panic!("{}: {err:#}", self.label),
        };
        let problems = self.check(&outcome);
        if !problems.is_empty() {
            panic!(
                "{} did not go as the story says:\n  - {}\nthe filter returned {:?} and did:\n{:#?}",
                self.label,
                problems.join("\n  - "),
                outcome.returned,
                outcome.effects
            );
        }
        outcome
    }

    fn play(&self, event: Event) -> anyhow::Result<Outcome> {
        let mut proxy = self.proxy.borrow_mut();
        let stream = || self.stream.ok_or_else(|| anyhow::anyhow!("not a stream step"));
        match event {
            Event::Configure => proxy.configure(),
            Event::RequestHeaders(headers, end) => proxy.request_headers(stream()?, headers, end),
            Event::RequestBody(bytes, end) => proxy.request_body(stream()?, &bytes, end),
            Event::ResponseBody(bytes, end) => proxy.response_body(stream()?, &bytes, end),
            Event::Answer(answer) => {
                let token = proxy.pending_calls(stream()?).into_iter().next();
                let token =
                    token.ok_or_else(|| anyhow::anyhow!("the stream has no pending http call to answer"))?;
                proxy.deliver(token, answer)
            }
            Event::RootAnswer(answer) => {
                let token = proxy.pending_calls(ROOT).into_iter().next();
                let token =
                    token.ok_or_else(|| anyhow::anyhow!("the root context has no pending http call"))?;
                proxy.deliver(token, answer)
            }
            Event::Tick => proxy.tick(),
            Event::QueueReady => proxy.queue_ready(),
            Event::ResponseHeaders(headers) => proxy.response_headers(stream()?, headers, false),
            Event::End(how) => proxy.end(stream()?, how),
        }
    }

    /// Every unmet expectation and every unexpected effect, as sentences.
    fn check(&self, outcome: &Outcome) -> Vec<String> {
        let mut problems = Vec::new();
        let mut claimed = vec![false; outcome.effects.len()];
        let mut returned_told = false;
        for expect in &self.expects {
            if let Expect::Returns(want) = expect {
                returned_told = true;
                if *want != outcome.returned {
                    problems
                        .push(format!("expected it to return {want:?}, it returned {:?}", outcome.returned));
                }
                continue;
            }
            let found =
                outcome.effects.iter().enumerate().find(|(i, e)| !claimed[*i] && self.matches(expect, e));
            match found {
                Some((i, _)) => claimed[i] = true,
                None => problems.push(format!("expected {expect:?}, which did not happen")),
            }
        }
        let must_tell =
            matches!(outcome.returned, Returned::Continue | Returned::Pause | Returned::Action(_))
                || self.configures;
        if must_tell && !returned_told {
            problems.push(format!("the story must say what it returns ({:?})", outcome.returned));
        }
        let unclaimed = outcome.effects.iter().zip(&claimed).filter(|(_, c)| !**c);
        for (effect, _) in unclaimed.filter(|(e, _)| !matches!(e, Effect::Metric { .. })) {
            problems.push(format!("unexpected: {effect:?}"));
        }
        problems
    }

    fn matches(&self, expect: &Expect, effect: &Effect) -> bool {
        match (expect, effect) {
            (Expect::Calls(path), Effect::HttpCall(call)) => {
                // Every call to the shim names the wire's version.
                call.cluster == self.cluster
                    && call.headers.get(":method") == Some(b"POST")
                    && call.headers.get(":path") == Some(path.as_bytes())
                    && call.headers.get(PROTOCOL_HEADER) == Some(PROTOCOL_VERSION.as_bytes())
            }
            (Expect::Resumes, Effect::Continue(0)) => true,
            (Expect::WakesTheRoot, Effect::Enqueue(_)) => true,
            (Expect::ResumesResponse, Effect::Continue(1)) => true,
            (Expect::Sends { status, headers, body }, Effect::LocalResponse(response)) => {
                response.status == *status
                    && headers.iter().all(|(k, v)| response.headers.get(k) == Some(v.as_bytes()))
                    && body.as_ref().is_none_or(|want| {
                        serde_json::from_slice::<Value>(&response.body).ok().as_ref() == Some(want)
                    })
            }
            (Expect::Logs(level, text), Effect::Log(line)) => {
                line.level == *level && line.message.contains(text.as_str())
            }
            (Expect::Metric(name, change), Effect::Metric { name: n, change: c }) => name == n && change == c,
            _ => false,
        }
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        if self.event.is_some() && !std::thread::panicking() {
            panic!("{} was never played: finish the step with .done()", self.label);
        }
    }
}
