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

use sluice_policies::wire::{
    LeaseRequest, LeaseResponse, ShedRequest, WireLimit, LEASE_PATH, RENEW_PATH, SHED_PATH,
};

use crate::callout::{background_timeout, call_answer, post_bytes};
use crate::filter::Sluice;
use crate::host::{now_ms, update_pool};
use crate::vm::{LeaseCall, Vm};

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
        let lease = vm.lease_calls.borrow_mut().remove(&token);
        if let Some(call) = lease {
            let (status, body) = call_answer(num_headers, body_size);
            return lease_answered(&vm, call, status.as_deref(), body.as_deref());
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
        ask_for_leases(&vm);
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

/// Leased mode: for each leased policy, the pool's rule says whether to ask
/// for the next lease or give unused tokens back now; one worker's root
/// claims the call in the pool, so one Envoy has one call in flight.
fn ask_for_leases(vm: &Vm) {
    let now = now_ms();
    for (index, policy) in vm.doc.policies.iter().enumerate() {
        let Some(lease) = policy.leased else { continue };
        let Some(key) = vm.pool_key(index) else { continue };
        let Some(Some(ask)) = update_pool(key, |pool| pool.tick(lease, now)) else { continue };
        let Some(limit) = policy.limits.first() else { continue };
        let request = LeaseRequest {
            policy: policy.name.as_str().to_string(),
            key: String::new(),
            limit: WireLimit::with_cost(limit, 1),
            want: ask.want,
            give_back: ask.give_back,
            now_us: None,
        };
        let sent = serde_json::to_vec(&request)
            .map_err(|e| e.to_string())
            .and_then(|body| post_bytes(&vm.doc, LEASE_PATH, &body, background_timeout(&vm.doc)));
        match sent {
            Ok(token) => {
                let given_back = ask.give_back.map_or(0, |b| u64::from(b.tokens));
                vm.lease_calls
                    .borrow_mut()
                    .insert(token, LeaseCall { policy: index, asked_ms: now, given_back });
            }
            Err(reason) => {
                log::debug!("{LEASE_PATH}: {reason}");
                vm.stats.count(index, |s| s.lease_failed);
                update_pool(key, |pool| pool.failed(now));
            }
        }
    }
}

/// A lease call's answer: the grant goes into the pool; a failure quiets it
/// for a while (its requests are checked exactly meanwhile).
fn lease_answered(vm: &Vm, call: LeaseCall, status: Option<&[u8]>, body: Option<&[u8]>) {
    let Some(policy) = vm.doc.policies.get(call.policy) else { return };
    let Some(lease) = policy.leased else { return };
    let Some(key) = vm.pool_key(call.policy) else { return };
    let now = now_ms();
    let answer = match status {
        Some(b"200") => {
            serde_json::from_slice::<LeaseResponse>(body.unwrap_or_default()).map_err(|e| e.to_string())
        }
        Some(other) => Err(format!("status {}", String::from_utf8_lossy(other))),
        None => Err("no answer".to_string()),
    };
    match answer {
        Ok(answer) => {
            update_pool(key, |pool| pool.granted(lease, call.asked_ms, now, answer));
            vm.stats.add(call.policy, |s| s.lease_granted, answer.granted.into());
            vm.stats.add(call.policy, |s| s.lease_given_back, call.given_back);
        }
        Err(reason) => {
            vm.stats.count(call.policy, |s| s.lease_failed);
            vm.log_failure(
                now,
                &format!(
                    "lease call for policy {} failed ({reason}); exact checks until it is retried",
                    policy.name
                ),
            );
            update_pool(key, |pool| pool.failed(now));
        }
    }
}

fn refuse(reason: &str) -> bool {
    log::error!("invalid policy document: {reason}");
    false
}
