//! Envoy's side of the lifecycle, over one [`Vm`]: the root context
//! (`on_context_create(root, 0)`, `on_vm_start`, `on_configure`), then per
//! stream `on_context_create(stream, root)`, `on_request_headers`, call
//! responses, `on_response_headers`, and at the end `on_log`, `on_done`,
//! `on_delete`. Nothing happens unless the caller drives it: the story (or a
//! property test) says when a call's answer arrives and when a stream ends.
//!
//! Each step returns an [`Outcome`]: what the callback returned and the
//! [`Effect`]s it had. A step fails (an error, never a hang) if the VM crashed,
//! or if it leaves a whole request (no body to follow) paused with nothing
//! that could resume it: no call pending and no local response sent.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};

use super::calls::{scripted, Answer, Calls, Outcome as CallOutcome, Route};
use super::costs::{Costs, Tracer};
use super::metrics::Metrics;
use super::pairs::HeaderMap;
use super::shared_data::SharedData;
use super::state::{CallResponse, Effect, HostState, LocalResponse, LogLine, StreamData};
use super::vm::Vm;

/// The root context's id; streams count up from here.
pub const ROOT: u32 = 1;

/// What a callback returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Returned {
    Nothing,
    /// `on_configure`, `on_vm_start`, `on_done`.
    Bool(bool),
    Continue,
    Pause,
    /// An action outside ABI 0.2.1's Continue (0) and Pause (1).
    Action(i32),
}

/// One step's result: the return value and the effects, in order.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub returned: Returned,
    pub effects: Vec<Effect>,
}

impl Outcome {
    /// The local response this step sent, if any.
    pub fn local_response(&self) -> Option<&LocalResponse> {
        self.effects.iter().find_map(|e| match e {
            Effect::LocalResponse(response) => Some(response),
            _ => None,
        })
    }
}

/// How a stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The response went out: `on_log`, `on_done`, `on_delete`.
    Complete,
    /// The client reset the stream: pending calls are cancelled without a
    /// callback, then `on_log`, `on_done`, `on_delete`, as Envoy does.
    Reset,
}

/// What the host is told before it boots the VM.
pub struct HostConfig {
    pub configuration: Vec<u8>,
    pub clusters: Vec<(String, Route)>,
    pub root_id: String,
    pub source_address: String,
    /// Share one between two proxies to model two workers of one Envoy.
    pub shared: Arc<Mutex<SharedData>>,
    /// Another build of the filter than `dist/sluice.wasm`.
    pub wasm: Option<PathBuf>,
    /// The imports the host answers BadArgument, doing nothing.
    pub refused: Vec<&'static str>,
}

impl HostConfig {
    pub fn new(configuration: &str) -> HostConfig {
        HostConfig {
            configuration: configuration.as_bytes().to_vec(),
            clusters: Vec::new(),
            root_id: "sluice".into(),
            source_address: "127.0.0.1:50000".into(),
            shared: Arc::default(),
            wasm: None,
            refused: Vec::new(),
        }
    }

    /// Answers every call of `import` (say `proxy_send_local_response`)
    /// BadArgument and does nothing, as Envoy does, for one, to a second
    /// local reply in a stream.
    pub fn refusing(mut self, import: &'static str) -> HostConfig {
        self.refused.push(import);
        self
    }

    /// Routes the calls to `cluster`; any other cluster is unknown (BadArgument).
    pub fn cluster(mut self, cluster: &str, route: Route) -> HostConfig {
        self.clusters.push((cluster.into(), route));
        self
    }
}

pub struct Proxy {
    vm: Vm,
    next_context: u32,
}

impl Proxy {
    /// Instantiates sluice.wasm and creates and starts its root context.
    /// `on_configure` is a step of its own: see [`Proxy::configure`].
    pub fn boot(config: HostConfig) -> anyhow::Result<Proxy> {
        let state = HostState {
            wasi: wasmtime_wasi::WasiCtxBuilder::new().build_p1(),
            plugin_configuration: config.configuration,
            configuring: false,
            root_id: config.root_id,
            source_address: config.source_address,
            effective: ROOT,
            root_context: ROOT,
            streams: Default::default(),
            in_log: false,
            call_response: None,
            calls: Calls::new(config.clusters),
            shared: config.shared,
            queues: Vec::new(),
            queue_ready: Default::default(),
            metrics: Metrics::default(),
            now_ns: 1_700_000_000_000_000_000,
            tick_period_ms: 0,
            effects: Vec::new(),
            logs: Vec::new(),
            costs: Costs::default(),
            tracer: Tracer::default(),
            refused: config.refused,
        };
        let mut vm = Vm::new(state, config.wasm.as_deref()).context("instantiating sluice.wasm")?;
        vm.run("proxy_on_context_create", ROOT, |f, s| f.on_context_create.call(s, (ROOT as i32, 0)))?;
        let started = vm.run("proxy_on_vm_start", ROOT, |f, s| f.on_vm_start.call(s, (ROOT as i32, 0)))?;
        if started == 0 {
            bail!("proxy_on_vm_start returned false");
        }
        Ok(Proxy { vm, next_context: ROOT + 1 })
    }

    fn state(&mut self) -> &mut HostState {
        self.vm.store.data_mut()
    }

    fn outcome(&mut self, returned: Returned) -> Outcome {
        Outcome { returned, effects: std::mem::take(&mut self.state().effects) }
    }

    /// `proxy_on_configure` with the plugin configuration.
    pub fn configure(&mut self) -> anyhow::Result<Outcome> {
        let size = self.state().plugin_configuration.len() as i32;
        self.state().configuring = true;
        let accepted =
            self.vm.run("proxy_on_configure", ROOT, |f, s| f.on_configure.call(s, (ROOT as i32, size)));
        self.state().configuring = false;
        Ok(self.outcome(Returned::Bool(accepted? != 0)))
    }

    /// A new HTTP stream: `proxy_on_context_create(stream, root)`.
    pub fn open(&mut self) -> anyhow::Result<u32> {
        let id = self.next_context;
        self.next_context += 1;
        self.state().streams.insert(id, StreamData::default());
        self.vm.run("proxy_on_context_create", id, |f, s| {
            f.on_context_create.call(s, (id as i32, ROOT as i32))
        })?;
        Ok(id)
    }

    fn stream(&mut self, id: u32) -> anyhow::Result<&mut StreamData> {
        self.state().streams.get_mut(&id).with_context(|| format!("stream {id} is not open"))
    }

    /// `proxy_on_request_headers` with these headers.
    pub fn request_headers(
        &mut self,
        id: u32,
        headers: HeaderMap,
        end_of_stream: bool,
    ) -> anyhow::Result<Outcome> {
        let count = headers.len() as i32;
        let stream = self.stream(id)?;
        stream.request_headers = headers;
        stream.request_open = true;
        let action = self.vm.run("proxy_on_request_headers", id, |f, s| {
            f.on_request_headers.call(s, (id as i32, count, i32::from(end_of_stream)))
        })?;
        let returned = action_of(action);
        let stream = self.stream(id)?;
        match returned {
            Returned::Pause if stream.answered.is_none() => stream.paused = true,
            Returned::Continue => stream.request_open = false,
            _ => {}
        }
        let outcome = self.outcome(returned);
        if end_of_stream {
            // With a body to follow, a paused request waits for it.
            self.check_not_stuck(id, "proxy_on_request_headers")?;
        }
        Ok(outcome)
    }

    /// Delivers the answer to call `token` through `proxy_on_http_call_response`.
    pub fn deliver(&mut self, token: u32, answer: Answer) -> anyhow::Result<Outcome> {
        let pending = self.state().calls.pending.remove(&token).with_context(|| {
            format!("no http call {token} is pending (never made, already answered, or cancelled)")
        })?;
        let outcome = match answer {
            Answer::Real => pending.real.context("Answer::Real for a call to a scripted cluster")?,
            scripted_answer => scripted(scripted_answer, &pending.call),
        };
        let (headers, body) = match &outcome {
            CallOutcome::Response { headers, body } => (headers.len(), body.len()),
            CallOutcome::Failure => (0, 0),
        };
        if let CallOutcome::Response { headers, body } = outcome {
            self.state().call_response = Some(CallResponse { headers, body });
        }
        let id = pending.call.context;
        let result = self.vm.run("proxy_on_http_call_response", id, |f, s| {
            f.on_http_call_response.call(s, (id as i32, token as i32, headers as i32, body as i32, 0))
        });
        self.state().call_response = None;
        result?;
        let outcome = self.outcome(Returned::Nothing);
        if self.state().streams.contains_key(&id) {
            self.check_not_stuck(id, "proxy_on_http_call_response")?;
        }
        Ok(outcome)
    }

    /// Calls `proxy_on_http_call_response` for a token that `context` never
    /// got, as no real Envoy would: the SDK panics on it. Exists to show that
    /// a guest panic surfaces as a [`super::Crash`], not a hang.
    pub fn deliver_unsolicited(&mut self, context: u32, token: u32) -> anyhow::Result<Outcome> {
        self.vm.run("proxy_on_http_call_response", context, |f, s| {
            f.on_http_call_response.call(s, (context as i32, token as i32, 0, 0, 0))
        })?;
        Ok(self.outcome(Returned::Nothing))
    }

    /// `proxy_on_response_headers`: the upstream (or a local reply) answered.
    pub fn response_headers(
        &mut self,
        id: u32,
        headers: HeaderMap,
        end_of_stream: bool,
    ) -> anyhow::Result<Outcome> {
        let count = headers.len() as i32;
        let stream = self.stream(id)?;
        stream.response_headers = headers;
        stream.response_open = true;
        let action = self.vm.run("proxy_on_response_headers", id, |f, s| {
            f.on_response_headers.call(s, (id as i32, count, i32::from(end_of_stream)))
        })?;
        Ok(self.outcome(action_of(action)))
    }

    /// `proxy_on_request_body`: `bytes` more of the request's body. As in
    /// Envoy, a body callback that paused keeps its bytes buffered, and the
    /// next one sees them all; one that continued lets them go on.
    pub fn request_body(&mut self, id: u32, bytes: &[u8], end_of_stream: bool) -> anyhow::Result<Outcome> {
        let stream = self.stream(id)?;
        stream.request_body.extend_from_slice(bytes);
        let size = stream.request_body.len() as i32;
        let action = self.vm.run("proxy_on_request_body", id, |f, s| {
            f.on_request_body.call(s, (id as i32, size, i32::from(end_of_stream)))
        })?;
        let returned = action_of(action);
        let stream = self.stream(id)?;
        match returned {
            Returned::Pause if stream.answered.is_none() => stream.paused = true,
            Returned::Continue => {
                stream.request_body.clear();
                stream.request_open = false;
                stream.paused = false;
            }
            _ => {}
        }
        let outcome = self.outcome(returned);
        if end_of_stream {
            self.check_not_stuck(id, "proxy_on_request_body")?;
        }
        Ok(outcome)
    }

    /// `proxy_on_response_body`: a chunk of the upstream's response. What
    /// the filter leaves in the buffer goes on to the client when it
    /// continues ([`Proxy::forwarded`]); when it pauses, it stays buffered
    /// until a resume.
    pub fn response_body(&mut self, id: u32, bytes: &[u8], end_of_stream: bool) -> anyhow::Result<Outcome> {
        let stream = self.stream(id)?;
        stream.response_body.extend_from_slice(bytes);
        let size = stream.response_body.len() as i32;
        let action = self.vm.run("proxy_on_response_body", id, |f, s| {
            f.on_response_body.call(s, (id as i32, size, i32::from(end_of_stream)))
        })?;
        let returned = action_of(action);
        if returned == Returned::Continue {
            let stream = self.stream(id)?;
            let body = std::mem::take(&mut stream.response_body);
            stream.forwarded.extend_from_slice(&body);
        }
        Ok(self.outcome(returned))
    }

    /// The size of the guest's linear memory, in bytes: it only grows, so
    /// it is the most the filter's heap has ever held (with its stack and
    /// data).
    pub fn memory_bytes(&mut self) -> usize {
        let Some(memory) = self.vm.memory else { return 0 };
        memory.data_size(&self.vm.store)
    }

    /// The response body that went on to the client of stream `id` so far.
    pub fn forwarded(&mut self, id: u32) -> Vec<u8> {
        self.state().streams.get(&id).map(|s| s.forwarded.clone()).unwrap_or_default()
    }

    /// Ends stream `id`: `on_log`, `on_done`, `on_delete` (after cancelling its
    /// calls, on a reset). The outcome's `returned` is `on_done`'s answer.
    pub fn end(&mut self, id: u32, how: End) -> anyhow::Result<Outcome> {
        self.stream(id)?;
        if how == End::Reset {
            self.state().calls.cancel_for(id);
        }
        self.state().in_log = true;
        let logged = self.vm.run("proxy_on_log", id, |f, s| f.on_log.call(s, id as i32));
        self.state().in_log = false;
        logged?;
        let done = self.vm.run("proxy_on_done", id, |f, s| f.on_done.call(s, id as i32))?;
        self.vm.run("proxy_on_delete", id, |f, s| f.on_delete.call(s, id as i32))?;
        self.state().calls.cancel_for(id);
        self.state().streams.remove(&id);
        Ok(self.outcome(Returned::Bool(done != 0)))
    }

    /// The root's tick period as the filter last set it, in ms (0: never).
    pub fn tick_period_ms(&mut self) -> u32 {
        self.state().tick_period_ms
    }

    /// `proxy_on_tick` on the root context; as in Envoy, only once the
    /// filter asked for a tick period.
    pub fn tick(&mut self) -> anyhow::Result<Outcome> {
        if self.state().tick_period_ms == 0 {
            bail!("on_tick, but the filter never set a tick period");
        }
        self.vm.run("proxy_on_tick", ROOT, |f, s| f.on_tick.call(s, ROOT as i32))?;
        Ok(self.outcome(Returned::Nothing))
    }

    /// Whether an enqueue waits for its `proxy_on_queue_ready`.
    pub fn queue_ready_due(&mut self) -> bool {
        !self.state().queue_ready.is_empty()
    }

    /// `proxy_on_queue_ready` on the root context, for the oldest enqueue
    /// not yet delivered (Envoy posts one per enqueue to the owner's worker).
    pub fn queue_ready(&mut self) -> anyhow::Result<Outcome> {
        let Some(token) = self.state().queue_ready.pop_front() else {
            bail!("on_queue_ready, but nothing was enqueued");
        };
        self.vm.run("proxy_on_queue_ready", ROOT, |f, s| {
            f.on_queue_ready.call(s, (ROOT as i32, token as i32))
        })?;
        Ok(self.outcome(Returned::Nothing))
    }

    /// Moves the fake clock forward.
    pub fn advance(&mut self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.state().now_ns = self.state().now_ns.saturating_add(by);
    }

    /// The tokens of the calls stream `id` has pending, oldest first.
    pub fn pending_calls(&mut self, id: u32) -> Vec<u32> {
        self.state().calls.pending.values().filter(|p| p.call.context == id).map(|p| p.call.token).collect()
    }

    /// The status of the local response stream `id` sent, if any.
    pub fn answered(&mut self, id: u32) -> Option<u32> {
        self.state().streams.get(&id).and_then(|s| s.answered)
    }

    /// Stream `id`'s response headers as the filter left them, while it is open.
    pub fn response_headers_of(&mut self, id: u32) -> Option<HeaderMap> {
        self.state().streams.get(&id).map(|s| s.response_headers.clone())
    }

    /// True while stream `id`'s request is paused.
    pub fn paused(&mut self, id: u32) -> bool {
        self.state().streams.get(&id).is_some_and(|s| s.paused)
    }

    pub fn logs(&mut self) -> &[LogLine] {
        &self.vm.store.data().logs
    }

    /// What the filter cost the host since the last call (or since boot),
    /// and counting afresh from now.
    pub fn take_costs(&mut self) -> Costs {
        std::mem::take(&mut self.state().costs)
    }

    /// Turns [`Costs::trace`] on or off.
    pub fn trace(&mut self, on: bool) {
        self.state().tracer.on = on;
    }

    /// The value of a counter or gauge the filter defined.
    pub fn metric(&mut self, name: &str) -> Option<u64> {
        self.state().metrics.value(name)
    }

    /// A paused request waits for a call: its own, or, while its check
    /// waits to share a callout, one of another context (whose return sends
    /// the queue).
    fn check_not_stuck(&mut self, id: u32, after: &str) -> anyhow::Result<()> {
        // A check queued for a batch waits for the root's wake-up; a host
        // that refuses calls (`HostConfig::refusing`) may refuse the resume.
        let waking = !self.state().queue_ready.is_empty();
        let refusing = !self.state().refused.is_empty();
        if self.paused(id) && self.state().calls.pending.is_empty() && !waking && !refusing {
            bail!("after {after}, stream {id}'s request is left paused: no http call pending, no local response, no resume");
        }
        Ok(())
    }
}

fn action_of(action: i32) -> Returned {
    match action {
        0 => Returned::Continue,
        1 => Returned::Pause,
        other => Returned::Action(other),
    }
}
