//! What the host knows about one VM: its configuration, each context's header
//! maps and flags, the http calls in flight, shared data, metrics, the fake
//! clock, and the effects the filter had during the current callback.
//!
//! Host calls read and change this; [`super::proxy::Proxy`] drives the
//! callbacks and drains [`HostState::effects`] after each one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wasmtime_wasi::p1::WasiP1Ctx;

use super::calls::{Calls, HttpCall};
use super::costs::{Costs, Tracer};
use super::metrics::Metrics;
use super::pairs::HeaderMap;
use super::shared_data::SharedData;

/// proxy-wasm log levels, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Critical,
}

impl LogLevel {
    pub(crate) fn from_abi(level: i32) -> LogLevel {
        match level {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            _ => LogLevel::Critical,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub level: LogLevel,
    pub message: String,
}

/// A `send_local_response`.
#[derive(Debug, Clone)]
pub struct LocalResponse {
    pub status: u32,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub details: String,
}

/// Something the filter did through a host call, in the order it did it.
/// Logs below `Warn` are kept in [`HostState::logs`] only.
#[derive(Debug, Clone)]
pub enum Effect {
    HttpCall(HttpCall),
    LocalResponse(LocalResponse),
    /// `proxy_continue_stream`: 0 request, 1 response, 2 downstream, 3 upstream.
    Continue(i32),
    /// `proxy_close_stream`, same stream types.
    Close(i32),
    Log(LogLine),
    Metric {
        name: String,
        change: MetricChange,
    },
    /// `proxy_enqueue_shared_queue` on the queue of this token: its owner's
    /// `on_queue_ready` is due.
    Enqueue(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricChange {
    Increment(i64),
    Record(u64),
}

/// One shared queue: its name, and what waits in it.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    pub name: String,
    pub items: std::collections::VecDeque<Vec<u8>>,
}

/// One HTTP context's view of its stream.
#[derive(Debug, Default)]
pub(crate) struct StreamData {
    pub request_headers: HeaderMap,
    pub response_headers: HeaderMap,
    /// Envoy lets the filter read the request headers from `on_request_headers`
    /// until the request continues; afterwards the map is gone (BadArgument).
    pub request_open: bool,
    pub response_open: bool,
    /// `on_request_headers` returned Pause and nothing has resumed or answered.
    pub paused: bool,
    /// The status of the local response, once one was sent.
    pub answered: Option<u32>,
    /// The request body the host holds: the chunk being handled, with what
    /// earlier body callbacks held back by pausing (Envoy's
    /// StopIterationAndBuffer).
    pub request_body: Vec<u8>,
    /// The response body the host holds, the same way.
    pub response_body: Vec<u8>,
    /// The response body that went on to the client so far.
    pub forwarded: Vec<u8>,
    pub properties: HashMap<String, Vec<u8>>,
}

/// The body and headers of the http call response being delivered.
#[derive(Debug)]
pub(crate) struct CallResponse {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

pub struct HostState {
    pub(crate) wasi: WasiP1Ctx,
    pub(crate) plugin_configuration: Vec<u8>,
    /// True during `proxy_on_configure`, the only time Envoy hands out the
    /// plugin configuration.
    pub(crate) configuring: bool,
    pub(crate) root_id: String,
    pub(crate) source_address: String,
    /// The context the current callback runs in (`proxy_set_effective_context` may change it).
    pub(crate) effective: u32,
    pub(crate) root_context: u32,
    pub(crate) streams: HashMap<u32, StreamData>,
    /// True during `proxy_on_log`: Envoy's access log phase reads maps as NotFound, not BadArgument.
    pub(crate) in_log: bool,
    pub(crate) call_response: Option<CallResponse>,
    pub(crate) calls: Calls,
    pub(crate) shared: Arc<Mutex<SharedData>>,
    /// The shared queues registered, by token (from 1).
    pub(crate) queues: Vec<Queue>,
    /// The `on_queue_ready` calls due to the root, by queue token, oldest first.
    pub(crate) queue_ready: std::collections::VecDeque<u32>,
    pub(crate) metrics: Metrics,
    pub(crate) now_ns: u64,
    pub(crate) tick_period_ms: u32,
    pub(crate) effects: Vec<Effect>,
    pub(crate) logs: Vec<LogLine>,
    pub(crate) costs: Costs,
    pub(crate) tracer: Tracer,
    /// The imports this host answers BadArgument, doing nothing.
    pub(crate) refused: Vec<&'static str>,
}

impl HostState {
    pub(crate) fn effect(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    pub(crate) fn log(&mut self, level: LogLevel, message: String) {
        let line = LogLine { level, message };
        if level >= LogLevel::Warn {
            self.effects.push(Effect::Log(line.clone()));
        }
        self.logs.push(line);
    }

    /// The stream of the effective context, if it is an HTTP context.
    pub(crate) fn stream(&mut self) -> Option<&mut StreamData> {
        self.streams.get_mut(&self.effective)
    }
}
