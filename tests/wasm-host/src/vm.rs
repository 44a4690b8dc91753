//! One instance of sluice.wasm in a `Store<HostState>` of its own: the
//! proxy-wasm callbacks as typed functions, each run with a fuel budget.
//!
//! A trap (a host call that failed, a guest panic: the SDK logs the panic at
//! Critical and then aborts, which traps) kills the VM, as it does in Envoy:
//! the callback returns a [`Crash`] naming the callback, the panic message and
//! the last log lines, and every later callback returns the same crash.

use std::fmt;
use std::path::Path;
use std::time::Instant;

use wasmtime::{Store, TypedFunc};

use super::module::compiled;
use super::state::{HostState, LogLevel};

/// Instructions one callback may run; far more than any real callback needs.
const FUEL: u64 = 2_000_000_000;
/// Log lines a crash report carries.
const TAIL: usize = 10;

/// sluice.wasm trapped: the VM is dead.
#[derive(Debug, Clone)]
pub struct Crash {
    pub callback: &'static str,
    /// The panic message the SDK logged at Critical, if it was a panic.
    pub panic: Option<String>,
    pub trap: String,
    pub log_tail: Vec<String>,
}

impl fmt::Display for Crash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.panic {
            Some(panic) => write!(f, "sluice.wasm panicked in {}: {panic}", self.callback)?,
            None => write!(f, "sluice.wasm trapped in {}: {}", self.callback, self.trap)?,
        }
        write!(f, "\n--- last log lines ---\n{}", self.log_tail.join("\n"))
    }
}

impl std::error::Error for Crash {}

pub(crate) struct Exports {
    pub on_context_create: TypedFunc<(i32, i32), ()>,
    pub on_vm_start: TypedFunc<(i32, i32), i32>,
    pub on_configure: TypedFunc<(i32, i32), i32>,
    pub on_request_headers: TypedFunc<(i32, i32, i32), i32>,
    pub on_response_headers: TypedFunc<(i32, i32, i32), i32>,
    pub on_request_body: TypedFunc<(i32, i32, i32), i32>,
    pub on_response_body: TypedFunc<(i32, i32, i32), i32>,
    pub on_http_call_response: TypedFunc<(i32, i32, i32, i32, i32), ()>,
    pub on_tick: TypedFunc<i32, ()>,
    pub on_queue_ready: TypedFunc<(i32, i32), ()>,
    pub on_log: TypedFunc<i32, ()>,
    pub on_done: TypedFunc<i32, i32>,
    pub on_delete: TypedFunc<i32, ()>,
}

pub(crate) struct Vm {
    pub store: Store<HostState>,
    pub exports: Exports,
    /// The guest's linear memory, for its size.
    pub memory: Option<wasmtime::Memory>,
    crashed: Option<Crash>,
}

impl Vm {
    /// Instantiates sluice.wasm (or the build at `wasm`) and runs its `_initialize`.
    pub(crate) fn new(state: HostState, wasm: Option<&Path>) -> anyhow::Result<Vm> {
        let compiled = compiled(wasm)?;
        let mut store = Store::new(&compiled.engine, state);
        store.set_fuel(FUEL)?;
        let instance = compiled.pre.instantiate(&mut store)?;
        let initialize = instance.get_typed_func::<(), ()>(&mut store, "_initialize")?;
        initialize.call(&mut store, ())?;
        let mut get = |name: &str| {
            instance
                .get_func(&mut store, name)
                .ok_or_else(|| anyhow::anyhow!("sluice.wasm exports no {name}"))
        };
        let (a, b, c, d, e, f, g, h, i, j) = (
            get("proxy_on_context_create")?,
            get("proxy_on_vm_start")?,
            get("proxy_on_configure")?,
            get("proxy_on_request_headers")?,
            get("proxy_on_response_headers")?,
            get("proxy_on_http_call_response")?,
            get("proxy_on_tick")?,
            get("proxy_on_log")?,
            get("proxy_on_done")?,
            get("proxy_on_delete")?,
        );
        let (k, l) = (get("proxy_on_request_body")?, get("proxy_on_response_body")?);
        let m = get("proxy_on_queue_ready")?;
        let exports = Exports {
            on_context_create: a.typed(&store)?,
            on_vm_start: b.typed(&store)?,
            on_configure: c.typed(&store)?,
            on_request_headers: d.typed(&store)?,
            on_response_headers: e.typed(&store)?,
            on_request_body: k.typed(&store)?,
            on_response_body: l.typed(&store)?,
            on_http_call_response: f.typed(&store)?,
            on_tick: g.typed(&store)?,
            on_queue_ready: m.typed(&store)?,
            on_log: h.typed(&store)?,
            on_done: i.typed(&store)?,
            on_delete: j.typed(&store)?,
        };
        let memory = instance.get_memory(&mut store, "memory");
        Ok(Vm { store, exports, memory, crashed: None })
    }

    /// Runs one callback in `context`: a fresh fuel budget, the effective
    /// context set, and a trap turned into a [`Crash`].
    pub(crate) fn run<R>(
        &mut self,
        callback: &'static str,
        context: u32,
        call: impl FnOnce(&Exports, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, Crash> {
        if let Some(crash) = &self.crashed {
            return Err(crash.clone());
        }
        let state = self.store.data_mut();
        state.effective = context;
        state.tracer.callback = callback;
        state.tracer.mark = FUEL;
        let started = Instant::now();
        let outcome = self.store.set_fuel(FUEL).and_then(|()| call(&self.exports, &mut self.store));
        let busy = started.elapsed();
        let left = self.store.get_fuel().unwrap_or(FUEL);
        let state = self.store.data_mut();
        state.costs.part(&mut state.tracer, "return", left);
        state.costs.callbacks += 1;
        state.costs.fuel += FUEL.saturating_sub(left);
        state.costs.busy += busy;
        outcome.map_err(|trap| {
            let logs = &self.store.data().logs;
            let panic = logs.iter().rev().find(|l| l.level == LogLevel::Critical).map(|l| l.message.clone());
            let start = logs.len().saturating_sub(TAIL);
            let log_tail = logs[start..].iter().map(|l| format!("[{:?}] {}", l.level, l.message)).collect();
            let crash = Crash { callback, panic, trap: format!("{trap:?}"), log_tail };
            self.crashed = Some(crash.clone());
            crash
        })
    }
}
