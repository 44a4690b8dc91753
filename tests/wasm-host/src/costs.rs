//! What the filter costs its host, counted by the host as it runs: each
//! `env` host call by name, the bytes copied across the guest's memory
//! boundary, the buffers the host allocates in the guest to hand it a value,
//! the wasm instructions the guest runs (wasmtime fuel) and the time spent in
//! callbacks. Every [`super::Proxy`] counts all the time; a measurement takes
//! the counts around what it measures ([`super::Proxy::take_costs`]).
//!
//! Bytes are payloads: the arguments the host reads out of the guest (names,
//! values, bodies, the pairs of a map) and the values it hands in. The 4- and
//! 8-byte out-parameters (pointers, lengths, tokens, the clock) are not
//! counted. WASI calls are not counted: the filter makes none per request.
//!
//! Fuel counts wasm operators, about one per instruction; unlike the time it
//! repeats exactly run to run, so a change in the filter's own work shows in
//! it even on a noisy machine. It counts the guest's work only (the
//! allocations the host asks for included); the time counts the host calls'
//! work too, as Envoy would pay it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, Default)]
pub struct Costs {
    /// `env` host calls, by name.
    pub calls: BTreeMap<&'static str, u64>,
    /// Bytes the host copied out of the guest's memory.
    pub bytes_in: u64,
    /// Bytes the host copied into the guest's memory.
    pub bytes_out: u64,
    /// `proxy_on_memory_allocate` calls the host made to hand the guest a value.
    pub allocations: u64,
    /// Wasm operators the guest ran (fuel consumed).
    pub fuel: u64,
    /// Callbacks into the guest (`proxy_on_*`, not counting the allocations).
    pub callbacks: u64,
    /// Wall time spent in those callbacks, host calls included.
    pub busy: Duration,
    /// With [`super::Proxy::trace`] on: the guest's work part by part, each
    /// part the operators run up to a host call or a callback's return.
    pub trace: Vec<Part>,
}

/// The wasm operators a callback ran up to a host call, or to its return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub callback: &'static str,
    /// The host call that ended the part, or `return`.
    pub until: &'static str,
    pub ops: u64,
}

/// Where the guest is: what the host needs to cut its work into [`Part`]s.
#[derive(Debug, Default)]
pub(crate) struct Tracer {
    pub on: bool,
    pub callback: &'static str,
    /// The fuel left at the last host call or callback start.
    pub mark: u64,
}

impl Costs {
    /// One host call, `fuel` left in the guest when it was made.
    pub(crate) fn call(&mut self, tracer: &mut Tracer, name: &'static str, fuel: u64) {
        *self.calls.entry(name).or_default() += 1;
        self.part(tracer, name, fuel);
    }

    pub(crate) fn part(&mut self, tracer: &mut Tracer, until: &'static str, fuel: u64) {
        if tracer.on {
            let ops = tracer.mark.saturating_sub(fuel);
            self.trace.push(Part { callback: tracer.callback, until, ops });
        }
        tracer.mark = fuel;
    }

    /// All host calls.
    pub fn host_calls(&self) -> u64 {
        self.calls.values().sum()
    }

    /// Calls of `name`.
    pub fn calls_of(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }

    /// Each count divided by `n` (rounded to the nearest), for one request of `n`.
    pub fn per(&self, n: u64) -> PerRequest {
        let n = n.max(1);
        let div = |v: u64| (v + n / 2) / n;
        PerRequest {
            calls: self.calls.iter().map(|(k, v)| (*k, *v as f64 / n as f64)).collect(),
            bytes_in: div(self.bytes_in),
            bytes_out: div(self.bytes_out),
            allocations: self.allocations as f64 / n as f64,
            fuel: div(self.fuel),
            callbacks: self.callbacks as f64 / n as f64,
            busy: self.busy / u32::try_from(n).unwrap_or(u32::MAX),
        }
    }
}

/// [`Costs`] of one request, averaged over many.
#[derive(Debug, Clone)]
pub struct PerRequest {
    pub calls: BTreeMap<&'static str, f64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub allocations: f64,
    pub fuel: u64,
    pub callbacks: f64,
    pub busy: Duration,
}

impl PerRequest {
    pub fn host_calls(&self) -> f64 {
        self.calls.values().sum()
    }
}

impl fmt::Display for PerRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let calls: Vec<String> = self
            .calls
            .iter()
            .map(|(name, n)| format!("{} {}", name.trim_start_matches("proxy_"), number(*n)))
            .collect();
        write!(
            f,
            "{} host calls ({}); {} B in, {} B out, {} allocations; {} callbacks, {} wasm ops, {:.1} µs",
            number(self.host_calls()),
            calls.join(", "),
            self.bytes_in,
            self.bytes_out,
            number(self.allocations),
            number(self.callbacks),
            self.fuel,
            self.busy.as_secs_f64() * 1e6,
        )
    }
}

/// A per-request count: whole when it is, else with two decimals.
pub fn number(n: f64) -> String {
    if (n - n.round()).abs() < 1e-9 {
        format!("{}", n.round() as i64)
    } else {
        format!("{n:.2}")
    }
}
