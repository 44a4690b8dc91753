//! The root context: parses the policy document once and shares it, with
//! the VM's stats, breaker and outbox, with every request. On each tick it
//! renews the leases of live streams, reports the utilization its responses
//! showed and learns the fleet's shed level, sends the release and adjust
//! calls that streams queued, and receives their answers.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};

use sluice_policies::wire::{ShedRequest, RENEW_PATH, SHED_PATH};

use crate::callout::{background_timeout, call_answer, post_bytes};
use crate::filter::Sluice;
use crate::host::now_ms;
use crate::vm::Vm;

/// How often queued releases and adjustments go out: the most a release
/// waits after its stream ends.
const TICK: Duration = Duration::from_millis(20);

pub struct SluiceRoot {
    vm: Option<Rc<Vm>>,
}

impl SluiceRoot {
    pub fn new() -> SluiceRoot {
        SluiceRoot { vm: None }
    }
}

impl Context for SluiceRoot {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _trailers: usize) {
        let Some(vm) = self.vm.clone() else { return };
        let shed = vm.shed_calls.borrow_mut().remove(&token);
        if let Some(index) = shed {
            let (status, body) = call_answer(num_headers, body_size);
            return vm.shed_answered(index, status.as_deref(), body.as_deref());
        }
        let Some(policies) = vm.releasing.borrow_mut().remove(&token) else { return };
        let (status, body) = call_answer(num_headers, body_size);
        vm.release_answered(&policies, status.as_deref(), body.as_deref(), now_ms());
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
                self.vm = Some(Rc::new(Vm::new(doc, now_ms())));
                if let Err(status) = hostcalls::set_tick_period(TICK) {
                    log::warn!("cannot set the tick period: {status:?}; leases will be reclaimed by TTL");
                }
                true
            }
            Err(err) => refuse(&err.to_string()),
        }
    }

    fn on_tick(&mut self) {
        let Some(vm) = self.vm.clone() else { return };
        let renewals = vm.live.borrow_mut().due(now_ms());
        for renewal in renewals {
            vm.send_later(RENEW_PATH, &renewal, Vec::new());
        }
        let reports = vm.shedding.borrow_mut().due(now_ms());
        for (index, utilization) in reports {
            let Some(policy) = vm.doc.policies.get(index) else { continue };
            let Some(shed) = &policy.shed else { continue };
            let report = ShedRequest::new(policy, shed, vm.doc.classes.count(), utilization);
            let sent = serde_json::to_vec(&report)
                .map_err(|e| e.to_string())
                .and_then(|body| post_bytes(&vm.doc, SHED_PATH, &body, background_timeout(&vm.doc)));
            match sent {
                Ok(token) => {
                    vm.shed_calls.borrow_mut().insert(token, index);
                }
                Err(reason) => log::debug!("{SHED_PATH}: {reason}"),
            }
        }
        let outgoing = std::mem::take(&mut *vm.outbox.borrow_mut());
        for call in outgoing {
            match post_bytes(&vm.doc, call.path, &call.body, background_timeout(&vm.doc)) {
                Ok(token) if !call.releases.is_empty() => {
                    vm.releasing.borrow_mut().insert(token, call.releases);
                }
                Ok(_) => {}
                Err(reason) if !call.releases.is_empty() => {
                    vm.release_failed(&call.releases, &reason, now_ms())
                }
                Err(reason) => log::warn!("{}: {reason}", call.path),
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Envoy creates no stream unless on_configure succeeded; returning
        // None would abort the VM, so an unconfigured filter passes traffic.
        Some(Box::new(Sluice::new(self.vm.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

fn refuse(reason: &str) -> bool {
    log::error!("invalid policy document: {reason}");
    false
}
