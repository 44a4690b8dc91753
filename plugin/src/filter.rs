//! The HTTP context: drives one request's [`Flow`] with the host's
//! callbacks, and performs what it returns.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use sluice_core::{CallId, Deferred, Effect, Flow, Now, Phase};
use sluice_policies::request::SimpleRequest;

use crate::host::{clock, HostRequest, ProxyHost};
use crate::perform::{answer, perform, Calls};
use crate::vm::Vm;

pub struct Filter {
    vm: Rc<Vm>,
    /// The host's id of this stream's context.
    id: u32,
    flow: Flow,
    /// The host's token of each call in flight.
    tokens: Vec<(u32, CallId)>,
    /// The request body's size buffered so far, while the flow reads it.
    body_size: usize,
    /// The request's headers, copied while the flow reads its body.
    request: Option<SimpleRequest>,
}

impl Filter {
    pub fn new(vm: Rc<Vm>, id: u32) -> Filter {
        let flow = Flow::new(vm.worker.clone());
        Filter { vm, id, flow, tokens: Vec::new(), body_size: 0, request: None }
    }

    fn perform(&mut self, effects: Vec<Effect>, now: &Now, host: &ProxyHost) {
        let vm = self.vm.clone();
        let mut calls =
            StreamCalls { flow: &mut self.flow, tokens: &mut self.tokens, now, host, vm: &vm, id: self.id };
        let performed = perform(effects, &vm.worker.doc.shim.cluster, &vm.stats, &mut calls);
        vm.worker.recycle(performed);
        vm.arm(now);
    }

    fn request_action(&mut self) -> Action {
        if self.flow.hold_request() {
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
        if self.flow.phase() == Phase::Reading {
            self.body_size = size;
            let (now, host) = (Now::read(&clock), ProxyHost::new());
            let request = self.request.take().unwrap_or_default();
            let effects = self.flow.handle_request_body(&now, &request, size, end_of_stream, &host);
            if self.flow.phase() == Phase::Reading {
                self.request = Some(request);
            }
            self.perform(effects, &now, &host);
        }
        if self.flow.hold_request_body() {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn response_action(&mut self) -> Action {
        if self.flow.hold_response() {
            Action::Pause
        } else {
            Action::Continue
        }
    }
}

struct StreamCalls<'a> {
    flow: &'a mut Flow,
    tokens: &'a mut Vec<(u32, CallId)>,
    now: &'a Now<'a>,
    host: &'a ProxyHost,
    vm: &'a Vm,
    id: u32,
}

impl Calls for StreamCalls<'_> {
    fn sent(&mut self, id: CallId, token: u32) {
        self.tokens.push((token, id));
    }

    fn not_sent(&mut self, id: CallId, reason: String) -> Vec<Effect> {
        self.flow.handle_answer(self.now, id, sluice_core::CallResult::NotSent(reason), self.host)
    }

    fn defer(&mut self, call: Deferred) {
        self.vm.worker.defer(call);
    }

    fn end_response(&mut self) {
        self.vm.ending.borrow_mut().push(self.id);
    }
}

impl Context for Filter {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _trailers: usize) {
        let Some(at) = self.tokens.iter().position(|(t, _)| *t == token) else { return };
        let (_, id) = self.tokens.swap_remove(at);
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = self.flow.handle_answer(&now, id, answer(num_headers, body_size), &host);
        self.perform(effects, &now, &host);
    }

    fn on_done(&mut self) -> bool {
        self.vm.body_came(self.id);
        self.vm.ending.borrow_mut().retain(|&id| id != self.id);
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = self.flow.handle_stream_end(&now, &host);
        self.perform(effects, &now, &host);
        true
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = self.flow.handle_request_headers(&now, &HostRequest::read(), &host);
        self.perform(effects, &now, &host);
        if self.flow.phase() == Phase::Reading {
            self.request = Some(HostRequest::capture());
        }
        if end_of_stream && self.flow.phase() == Phase::Reading {
            // No body will come: the flow reads an empty one.
            return self.request_body(0, true);
        }
        if self.flow.phase() == Phase::Reading {
            if self.vm.no_body_while_held.get() {
                // This host hands over no body while the headers are held:
                // they go on, the body is held until the decision.
                return Action::Continue;
            }
            // Held (StopIteration) while the body is read; the root lets
            // the headers go if the host never hands the body over.
            self.vm.reading.borrow_mut().push((self.id, now.ms()));
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
        let effects = self.flow.handle_response_headers(&now, end_of_stream, &host);
        self.perform(effects, &now, &host);
        self.response_action()
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = self.flow.handle_response_body(&now, body_size, end_of_stream, &host);
        self.perform(effects, &now, &host);
        self.response_action()
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = self.flow.handle_response_trailers(&now);
        self.perform(effects, &now, &host);
        self.response_action()
    }

    fn on_log(&mut self) {
        let (now, host) = (Now::read(&clock), ProxyHost::new());
        let effects = self.flow.handle_stream_end(&now, &host);
        self.perform(effects, &now, &host);
    }
}
