//! Shared callouts under random interleavings, in the real `dist/sluice.wasm`
//! with the real shim on a real redis-server: requests arrive, lone calls
//! and batches return, the root wakes or ticks, and clients reset, in an
//! order the property picks. Whatever the order:
//!
//! - no request stays held once every call has returned: each that was
//!   not reset is resumed or refused;
//! - no key admits more than its limit;
//! - every place among the worker's calls out comes back: afterwards a lone
//!   request's checks (its enforced and its shadow one) go at once, as
//!   many as the worker may keep out.
//!
//! The last is what a stream that kept only one of its lone calls broke.

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::test_runner::Config;
use sluice_harness::Backend;
use sluice_wasm_host::proxy::ROOT;
use sluice_wasm_host::{Answer, Effect, End, HostConfig, Proxy, Returned, Route};

const LIMIT: usize = 4;
const KEYS: [&str; 3] = ["k0", "k1", "k2"];

/// `shared_calls` calls out at most; every request checks `enforced` on its
/// `x-api-key`, and with `shadow` a shadow policy too.
fn document(shared_calls: u32, shadow: bool, run: u32) -> String {
    let trial = if shadow {
        format!(
            r#",{{"name": "trial{run}", "shadow": true, "key": ["header:x-api-key"],
                "limits": [{{"type": "fixed_window", "limit": 1, "window": "1h"}}]}}"#
        )
    } else {
        String::new()
    };
    format!(
        r#"{{"shim": {{"cluster": "sluice_shim", "timeout_ms": 5000, "shared_calls": {shared_calls}}},
            "failure_mode": "deny",
            "policies": [{{"name": "enforced{run}", "key": ["header:x-api-key"],
              "limits": [{{"type": "fixed_window", "limit": {LIMIT}, "window": "1h"}}]}}{trial}]}}"#
    )
}

/// One step the host may take next.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A request for key `KEYS[k]`.
    Arrive(usize),
    /// The oldest pending call of the `n`th open stream returns.
    Answer(usize),
    /// The root's oldest pending call (a batch) returns.
    Batch,
    /// The root is woken, if an enqueue asked for it.
    Wake,
    /// The clock moves 1 ms and the root ticks.
    Tick,
    /// The `n`th open stream's client resets it.
    Reset(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS.len()).prop_map(Op::Arrive),
        4 => (0..8usize).prop_map(Op::Answer),
        2 => Just(Op::Batch),
        2 => Just(Op::Wake),
        1 => Just(Op::Tick),
        1 => (0..8usize).prop_map(Op::Reset),
    ]
}

struct Open {
    id: u32,
    key: usize,
    decided: bool,
}

struct Run {
    proxy: Proxy,
    open: Vec<Open>,
    resumed: HashMap<usize, usize>,
}

impl Run {
    fn arrive(&mut self, key: usize) -> Result<(), TestCaseError> {
        let id = self.proxy.open().map_err(fail)?;
        let headers = [(":method", "GET"), (":path", "/"), (":authority", "api"), ("x-api-key", KEYS[key])];
        let outcome = self.proxy.request_headers(id, headers.into_iter().collect(), true).map_err(fail)?;
        prop_assert_eq!(outcome.returned, Returned::Pause);
        self.open.push(Open { id, key, decided: false });
        self.settle();
        Ok(())
    }

    /// Who is decided now, read from the host (a root callback resumes
    /// streams in their own contexts): no longer held, and resumed unless
    /// answered locally.
    fn settle(&mut self) {
        for open in self.open.iter_mut().filter(|o| !o.decided) {
            if !self.proxy.paused(open.id) {
                open.decided = true;
                if self.proxy.answered(open.id).is_none() {
                    *self.resumed.entry(open.key).or_default() += 1;
                }
            }
        }
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Arrive(key) => self.arrive(key)?,
            Op::Answer(n) if !self.open.is_empty() => {
                let at = n % self.open.len();
                let id = self.open[at].id;
                if let Some(&token) = self.proxy.pending_calls(id).first() {
                    self.proxy.deliver(token, Answer::Real).map_err(fail)?;
                    self.settle();
                }
            }
            Op::Batch => {
                if let Some(&token) = self.proxy.pending_calls(ROOT).first() {
                    self.proxy.deliver(token, Answer::Real).map_err(fail)?;
                    self.settle();
                }
            }
            Op::Wake => {
                if self.proxy.queue_ready_due() {
                    self.proxy.queue_ready().map_err(fail)?;
                    self.settle();
                }
            }
            Op::Tick => {
                self.proxy.advance(std::time::Duration::from_millis(1));
                if self.proxy.tick_period_ms() > 0 {
                    self.proxy.tick().map_err(fail)?;
                    self.settle();
                }
            }
            Op::Reset(n) if !self.open.is_empty() => {
                let open = self.open.swap_remove(n % self.open.len());
                self.proxy.end(open.id, End::Reset).map_err(fail)?;
            }
            Op::Answer(_) | Op::Reset(_) => {}
        }
        // A decided stream's response goes out and it ends.
        for open in self.open.iter().filter(|o| o.decided) {
            self.proxy.end(open.id, End::Complete).map_err(fail)?;
        }
        self.open.retain(|o| !o.decided);
        Ok(())
    }

    /// Every call returns, the root wakes and ticks, until no stream is
    /// held and no call is out (a batch may outlive a stream of its own).
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..10_000 {
            let idle = self.proxy.pending_calls(ROOT).is_empty() && !self.proxy.queue_ready_due();
            if self.open.is_empty() && idle {
                return Ok(());
            }
            let pending = self.open.iter().position(|o| !self.proxy.pending_calls(o.id).is_empty());
            let op = match (pending, self.proxy.pending_calls(ROOT).is_empty()) {
                (Some(n), _) => Op::Answer(n),
                (None, false) => Op::Batch,
                (None, true) if self.proxy.queue_ready_due() => Op::Wake,
                (None, true) => Op::Tick,
            };
            self.step(op)?;
        }
        let held: Vec<u32> = self.open.iter().map(|o| o.id).collect();
        Err(TestCaseError::fail(format!("streams {held:?} still held after every call returned")))
    }
}

fn fail(err: anyhow::Error) -> TestCaseError {
    TestCaseError::fail(format!("{err:#}"))
}

proptest! {
    #![proptest_config(Config { cases: 300, failure_persistence: None, ..Config::default() })]

    #[test]
    fn shared_callouts_hold_nobody_and_admit_no_more_than_the_limit(
        ops in proptest::collection::vec(op(), 1..60),
        shared_calls in 1u32..=2,
        shadow in any::<bool>(),
    ) {
        static BACKEND: std::sync::OnceLock<Backend> = std::sync::OnceLock::new();
        static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let backend = BACKEND.get_or_init(|| Backend::start().expect("starting redis-server and the shim"));
        let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let config = HostConfig::new(&document(shared_calls, shadow, run))
            .cluster("sluice_shim", Route::Shim { port: backend.shim.port });
        let mut proxy = Proxy::boot(config).map_err(fail)?;
        prop_assert_eq!(proxy.configure().map_err(fail)?.returned, Returned::Bool(true));
        let mut run = Run { proxy, open: Vec::new(), resumed: HashMap::new() };
        for op in ops {
            run.step(op)?;
        }
        run.drain()?;
        for (key, resumed) in &run.resumed {
            prop_assert!(*resumed <= LIMIT, "{} admitted {resumed}, more than {LIMIT}", KEYS[*key]);
        }
        // Every place came back: a lone request goes at once, with its
        // enforced and its shadow check.
        let id = run.proxy.open().map_err(fail)?;
        let headers = [(":method", "GET"), (":path", "/"), (":authority", "api"), ("x-api-key", "fresh")];
        let outcome = run.proxy.request_headers(id, headers.into_iter().collect(), true).map_err(fail)?;
        let calls = outcome.effects.iter().filter(|e| matches!(e, Effect::HttpCall(_))).count();
        let checks = 1 + usize::from(shadow);
        prop_assert_eq!(calls, checks.min(shared_calls as usize), "a lone request waited: places leaked");
    }
}
