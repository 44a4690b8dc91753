//! The HTTP context: drives one request's [`Flow`] with the host's
//! callbacks, and performs what it returns. While one of its checks shares
//! a callout (`sluice_core::sharing`), the root reaches its flow too
//! ([`Vm::shared`]), to hand it the batch's answer.

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use sluice_core::{CallId, CallResult, Deferred, Effect, Flow, Now, Outgoing, Phase};
use sluice_policies::request::SimpleRequest;

use crate::host::{clock, HostRequest, ProxyHost};
use crate::perform::{answer, perform, Calls};
use crate::vm::{SharingStream, Vm};

pub struct Filter {
    vm: Rc<Vm>,
    /// The host's id of this stream's context.
    id: u32,
    stream: Rc<RefCell<StreamState>>,
    /// The request body's size buffered so far, while the flow reads it.
    body_size: usize,
    /// The request's headers, copied while the flow reads its body.
    request: Option<SimpleRequest>,
}

/// A stream's flow and its calls.
pub struct StreamState {
    pub flow: Flow,
    /// The host's token of each call in flight.
    pub tokens: Vec<(u32, CallId)>,
    /// The tokens of this stream's checks that went alone while sharing is
    /// on (its enforced and its shadow check may both): each counts among
    /// the worker's calls out until it ends.
    lone: Vec<u32>,
    /// A check of this stream waits in the worker's queue, or its batch is out.
    pub shares: bool,
}

impl SharingStream for StreamState {
    fn resume(&mut self, vm: &Vm, id: u32, call: CallId, result: CallResult, now: &Now, host: &ProxyHost) {
        let effects = self.flow.handle_answer(now, call, result, host);
        self.perform(vm, id, effects, now, host);
    }

    fn owns(&self, token: u32) -> bool {
        self.tokens.iter().any(|(t, _)| *t == token)
    }

    /// Unknown tokens are ignored.
    fn answered(&mut self, vm: &Vm, id: u32, token: u32, result: CallResult, now: &Now, host: &ProxyHost) {
        let Some(at) = self.tokens.iter().position(|(t, _)| *t == token) else { return };
        let (_, call) = self.tokens.swap_remove(at);
        if let Some(at) = self.lone.iter().position(|t| *t == token) {
            self.lone.swap_remove(at);
            vm.lone_ended();
        }
        let effects = self.flow.handle_answer(now, call, result, host);
        self.perform(vm, id, effects, now, host);
    }
}

impl StreamState {
    /// Performs `effects` for stream `id`.
    pub fn perform(&mut self, vm: &Vm, id: u32, effects: Vec<Effect>, now: &Now, host: &ProxyHost) {
        let mut calls = StreamCalls { state: self, now, host, vm, id, lone: None };
        let performed = perform(effects, &vm.worker.doc.shim.cluster, &vm.stats, &mut calls);
        vm.worker.recycle(performed);
        vm.arm(now);
    }
}

impl Filter {
    pub fn new(vm: Rc<Vm>, id: u32) -> Filter {
        let flow = Flow::new(vm.worker.clone());
        let stream = StreamState { flow, tokens: Vec::new(), lone: Vec::new(), shares: false };
        Filter { vm, id, stream: Rc::new(RefCell::new(stream)), body_size: 0, request: None }
    }

    fn perform(&mut self, effects: Vec<Effect>, now: &Now, host: &ProxyHost) {
        let mut stream = self.stream.borrow_mut();
        stream.perform(&self.vm, self.id, effects, now, host);
        if stream.shares {
            let shared: Rc<RefCell<dyn SharingStream>> = self.stream.clone();
            self.vm.shared.borrow_mut().entry(self.id).or_insert(shared);
        }
    }

    /// The stream ends (its log or its teardown, whichever comes first):
    /// its checks leave the worker's queue unsent, and its lone checks,
    /// cancelled with it, no longer count as out.
    fn leave_sharing(&mut self) {
        if !self.stream.borrow().shares && self.stream.borrow().lone.is_empty() {
            // Nothing of it in the worker's queue, no lone check out.
            return;
        }
        let withdrawn = self.vm.worker.change_sharing(|s| s.stream_ended(self.id));
        for id in withdrawn {
            self.flow().handle_withdrawn(id);
        }
        let lone = std::mem::take(&mut self.stream.borrow_mut().lone);
        for _ in lone {
            self.vm.lone_ended();
        }
        self.vm.shared.borrow_mut().remove(&self.id);
    }

    fn flow(&self) -> std::cell::RefMut<'_, Flow> {
        std::cell::RefMut::map(self.stream.borrow_mut(), |s| &mut s.flow)
    }

    fn request_action(&mut self) -> Action {
        if self.flow().hold_request() {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    /// The request's body: to a flow that reads it (`Reading`); held while
    /// it is read and while the request is held (a body callback that
    /// answered Continue would let a request held for its check go on,
    /// where the host calls body callbacks while the headers are held).
    fn request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        self.vm.body_came(self.id);
        if self.flow().phase() == Phase::Reading {
            self.body_size = size;
            let (now, host) = (Now::read(&clock), ProxyHost::new());
            let request = self.request.take().unwrap_or_default();
            let effects = self.flow().handle_request_body(&now, &request, size, end_of_stream, &host);
            if self.flow().phase() == Phase::Reading {
                self.request = Some(request);
            }
            self.perform(effects, &now, &host);
        }
        if self.flow().hold_request_body() {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn response_action(&mut self) -> Action {
        if self.flow().hold_response() {
            Action::Pause
        } else {
            Action::Continue
        }
    }
}

struct StreamCalls<'a> {
    state: &'a mut StreamState,
    now: &'a Now<'a>,
    host: &'a ProxyHost,
    vm: &'a Vm,
    id: u32,
    /// The check just offered that goes alone and counts among the worker's calls out.
    lone: Option<CallId>,
}

impl Calls for StreamCalls<'_> {
    fn offer(&mut self, call: Outgoing) -> Option<Outgoing> {
        let worker = &self.vm.worker;
        if !(call.shared && worker.sharing().is_on()) {
            // Sent alone, as `Sharing::offer` would: nothing to count.
            return Some(call);
        }
        let call = worker.change_sharing(|s| s.offer(self.id, call, self.now.ms()));
        match &call {
            Some(call) => self.lone = Some(call.id),
            None => self.state.shares = true,
        }
        call
    }

    fn sent(&mut self, id: CallId, token: u32) {
        self.state.tokens.push((token, id));
        if self.lone.take_if(|lone| *lone == id).is_some() {
            self.state.lone.push(token);
        }
    }

    fn not_sent(&mut self, id: CallId, reason: String) -> Vec<Effect> {
        if self.lone.take_if(|lone| *lone == id).is_some() {
            self.vm.lone_ended();
        }
        self.state.flow.handle_answer(self.now, id, CallResult::NotSent(reason), self.host)
    }

    fn defer(&mut self, call: Deferred) {
        self.vm.worker.defer(call);
        // Sent from the root, at once: a freed lease is a waiter's place.
        self.vm.wake.ring();
    }

    fn end_response(&mut self) {
        self.vm.end_response(self.id);
    }
}

impl Context for Filter {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _trailers: usize) {
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let result = answer(num_headers, body_size);
        self.stream.borrow_mut().answered(&self.vm, self.id, token, result, &now, &host);
    }

    fn on_done(&mut self) -> bool {
        self.vm.body_came(self.id);
        self.vm.ended(self.id);
        self.leave_sharing();
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = self.flow().handle_stream_end(&now, &host);
        self.perform(effects, &now, &host);
        true
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = self.flow().handle_request_headers(&now, &HostRequest::read(), &host);
        self.perform(effects, &now, &host);
        if self.flow().phase() == Phase::Reading {
            self.request = Some(HostRequest::capture());
            if end_of_stream {
                // No body will come: the flow reads an empty one.
                return self.request_body(0, true);
            }
            if self.vm.no_body_while_held.get() {
                // This host hands over no body while the headers are held:
                // they go on, the body is held until the decision.
                return Action::Continue;
            }
            // Held (StopIteration) while the body is read; the root lets
            // the headers go if the host never hands the body over.
            self.vm.reading_body(self.id, now.ms());
            self.vm.arm(&now);
        }
        self.request_action()
    }

    /// Paused (and buffered by the host) while the flow reads the body or
    /// holds the request; the headers wait with it (Envoy calls this while
    /// they are held when the filter's `allow_on_headers_stop_iteration` is
    /// set).
    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.request_body(body_size, end_of_stream)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.request_body(self.body_size, true)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = self.flow().handle_response_headers(&now, end_of_stream, &host);
        self.perform(effects, &now, &host);
        self.response_action()
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = self.flow().handle_response_body(&now, body_size, end_of_stream, &host);
        self.perform(effects, &now, &host);
        self.response_action()
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = self.flow().handle_response_trailers(&now);
        self.perform(effects, &now, &host);
        self.response_action()
    }

    fn on_log(&mut self) {
        self.leave_sharing();
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = self.flow().handle_stream_end(&now, &host);
        self.perform(effects, &now, &host);
    }
}
