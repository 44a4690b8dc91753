//! The root context: parses the policy document once and shares it, with
//! the worker and the stats, with every request; drives the
//! [`Worker`] on each tick and hands it the answers to its calls.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType};
use sluice_core::sharing::Member;
use sluice_core::{CallId, CallResult, Deferred, Effect, Now, Worker};

use crate::abi::{self, Refused};
use crate::filter::Filter;
use crate::host::{clock, ProxyHost};
use crate::perform::{answer, perform, send, Calls};
use crate::stats::Stats;
use crate::vm::{SharingStream, Vm};

pub struct SluiceRoot {
    /// The host's id of this context.
    id: u32,
    vm: Option<Rc<Vm>>,
    /// The host's token of each background call in flight.
    tokens: HashMap<u32, CallId>,
    /// The host's token of each shared batch of checks in flight.
    batches: HashMap<u32, CallId>,
}

impl SluiceRoot {
    pub fn new(id: u32) -> SluiceRoot {
        SluiceRoot { id, vm: None, tokens: HashMap::new(), batches: HashMap::new() }
    }

    /// Shared callouts, from the root (a stream's calls end with it): the
    /// queued checks past their deadline answered as timed out, and the
    /// batches due sent. Batches go out from here only, so their answers
    /// come back here. `resumed`: a stream's context is the effective one,
    /// which a batch must not be sent from; the root's is made so again.
    fn share(&mut self, vm: &Vm, mut resumed: bool, now: &Now, host: &ProxyHost) {
        loop {
            let answers = vm.worker.change_sharing(|s| s.poll_answers(now.ms()));
            resumed |= !answers.is_empty();
            for (member, result) in answers {
                resume(vm, member, result, now, host);
            }
            let Some(batch) = vm.worker.change_sharing(|s| s.poll_batch(now.ms())) else { break };
            if std::mem::take(&mut resumed) {
                self.to_root();
            }
            match send(&vm.worker.doc.shim.cluster, &batch) {
                Ok(token) => {
                    self.batches.insert(token, batch.id);
                }
                Err(reason) => {
                    let result = CallResult::NotSent(reason.to_string());
                    let members = vm.worker.change_sharing(|s| s.batch_answered(batch.id, result));
                    resumed |= !members.is_empty();
                    for (member, result) in members {
                        resume(vm, member, result, now, host);
                    }
                }
            }
        }
        if resumed {
            self.to_root();
        }
    }

    fn perform(&mut self, vm: &Vm, effects: Vec<Effect>, now: &Now, host: &ProxyHost) {
        let mut calls = WorkerCalls { worker: &vm.worker, tokens: &mut self.tokens, now, host };
        let performed = perform(effects, &vm.worker.doc.shim.cluster, &vm.stats, &mut calls);
        vm.worker.recycle(performed);
    }

    /// Makes the root's context the effective one again.
    fn to_root(&self) {
        if let Err(status) = hostcalls::set_effective_context(self.id) {
            log::debug!("cannot return to the root context: {status:?}");
        }
    }
}

struct WorkerCalls<'a> {
    worker: &'a Worker,
    tokens: &'a mut HashMap<u32, CallId>,
    now: &'a Now<'a>,
    host: &'a ProxyHost,
}

impl Calls for WorkerCalls<'_> {
    fn sent(&mut self, id: CallId, token: u32) {
        self.tokens.insert(token, id);
    }

    fn not_sent(&mut self, id: CallId, reason: String) -> Vec<Effect> {
        self.worker.handle_answer(self.now, id, CallResult::NotSent(reason), self.host)
    }

    fn defer(&mut self, call: Deferred) {
        self.worker.defer(call);
    }
}

/// Hands a shared check's result to its stream's flow, in the stream's
/// context; a stream that ended has left [`Vm::shared`] and gets nothing.
fn resume(vm: &Vm, member: Member, result: CallResult, now: &Now, host: &ProxyHost) {
    let Some(stream) = vm.shared.borrow().get(&member.stream).cloned() else { return };
    if let Err(status) = hostcalls::set_effective_context(member.stream) {
        log::debug!("cannot resume stream {}: {status:?}", member.stream);
        return;
    }
    stream.borrow_mut().resume(vm, member.stream, member.call, result, now, host);
}

impl Context for SluiceRoot {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _trailers: usize) {
        let Some(vm) = self.vm.clone() else { return };
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        if let Some(id) = self.batches.remove(&token) {
            let members = vm.worker.change_sharing(|s| s.batch_answered(id, answer(num_headers, body_size)));
            let resumed = !members.is_empty();
            for (member, result) in members {
                resume(&vm, member, result, &now, &host);
            }
            self.share(&vm, resumed, &now, &host);
            vm.arm(&now);
            return;
        }
        if let Some(id) = self.tokens.remove(&token) {
            let effects = vm.worker.handle_answer(&now, id, answer(num_headers, body_size), &host);
            self.perform(&vm, effects, &now, &host);
            self.share(&vm, false, &now, &host);
            vm.arm(&now);
            return;
        }
        // A call a stream made while the root resumed it comes back here.
        let owns = |s: &Rc<RefCell<dyn SharingStream>>| s.borrow().owns(token);
        let owner = vm.shared.borrow().iter().find(|(_, s)| owns(s)).map(|(id, s)| (*id, s.clone()));
        if let Some((id, stream)) = owner {
            if hostcalls::set_effective_context(id).is_ok() {
                stream.borrow_mut().answered(&vm, id, token, answer(num_headers, body_size), &now, &host);
            }
            self.to_root();
        }
    }
}

impl RootContext for SluiceRoot {
    /// Refusing a bad document here makes Envoy refuse the configuration:
    /// a static config does not start, an xDS update is rejected.
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return refuse("(document): no configuration given"),
            Err(status) => return refuse(&format!("(document): cannot read the configuration: {status:?}")),
        };
        let Ok(text) = std::str::from_utf8(&bytes) else {
            return refuse("(document): the configuration is not UTF-8");
        };
        match sluice_policies::parse(text) {
            Ok(doc) => {
                log::info!("loaded {} policies", doc.policies.len());
                let stats = Stats::define(&doc);
                // Seeded by the host's random source (WASI random_get).
                let seed = RandomState::new().build_hasher().finish();
                let now = clock();
                let worker = Rc::new(Worker::new(doc, now, seed));
                let vm = Rc::new(Vm::new(worker, stats));
                vm.wake.register(seed);
                vm.ticked(now);
                self.vm = Some(vm);
                true
            }
            Err(err) => refuse(&err.to_string()),
        }
    }

    /// The VM's wake-up queue (a stream left a call for the root, or its
    /// lone check ended with checks queued): the calls and the batch go
    /// out now.
    fn on_queue_ready(&mut self, queue: u32) {
        let Some(vm) = self.vm.clone() else { return };
        if !vm.wake.answered(queue) {
            return;
        }
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = vm.worker.send_deferred();
        self.perform(&vm, effects, &now, &host);
        self.share(&vm, false, &now, &host);
        vm.arm(&now);
    }

    fn on_tick(&mut self) {
        let Some(vm) = self.vm.clone() else { return };
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = vm.worker.tick(&now, &host);
        self.perform(&vm, effects, &now, &host);
        self.share(&vm, false, &now, &host);
        let ending = vm.take_ending();
        for id in ending {
            // Its last event went out in an earlier callback: only a reset
            // ends a response early in proxy-wasm.
            let ended = hostcalls::set_effective_context(id)
                .map_err(Refused::from)
                .and_then(|()| abi::reset_http_response());
            if let Err(status) = ended {
                log::debug!("cannot end stream {id}'s response: {status:?}");
            }
        }
        for id in vm.unheld(now.ms()) {
            if !vm.no_body_while_held.replace(true) {
                log::warn!(
                    "the host hands over no request body while the headers are held: set the Wasm \
                     filter's allow_on_headers_stop_iteration (Envoy 1.35 or later), else a request \
                     whose body a policy reads reaches the upstream's headers before its decision"
                );
            }
            let resumed = hostcalls::set_effective_context(id)
                .map_err(Refused::from)
                .and_then(|()| abi::resume_http_request());
            if let Err(status) = resumed {
                log::debug!("cannot let stream {id}'s headers go: {status:?}");
            }
        }
        vm.ticked(now.ms());
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Envoy creates no stream unless on_configure succeeded; returning
        // None would abort the VM, so an unconfigured filter passes traffic.
        Some(match &self.vm {
            Some(vm) => Box::new(Filter::new(vm.clone(), context_id)),
            None => Box::new(PassThrough),
        })
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The stream of a filter with no document: it lets everything through.
struct PassThrough;

impl Context for PassThrough {}

impl HttpContext for PassThrough {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }
}

fn refuse(reason: &str) -> bool {
    log::error!("invalid policy document: {reason}");
    false
}
