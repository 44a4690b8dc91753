//! The root context: parses the policy document once and shares it, with
//! the VM's stats, breaker and outbox, with every request. On each tick it
//! sends the release and adjust calls that streams queued, and it receives
//! their answers, counting released leases.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, MapType};
use sluice_policies::wire::ReleaseResponse;

use crate::callout::{background_timeout, post_bytes};
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

    /// A release call failed: the lease TTL will reclaim the slots.
    fn release_failed(vm: &Vm, policies: &[usize], reason: &str) {
        for &index in policies {
            vm.stats.count(index, |s| s.release_failed);
        }
        vm.log_failure(now_ms(), &format!("release failed ({reason}); the lease TTL will reclaim the slot"));
    }
}

impl Context for SluiceRoot {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _trailers: usize) {
        let Some(vm) = self.vm.clone() else { return };
        let Some(policies) = vm.releasing.borrow_mut().remove(&token) else { return };
        let status = match num_headers {
            0 => None,
            _ => hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status").ok().flatten(),
        };
        if status.as_deref() != Some(b"200") {
            let shown =
                status.map(|s| String::from_utf8_lossy(&s).into_owned()).unwrap_or("no answer".into());
            return SluiceRoot::release_failed(&vm, &policies, &shown);
        }
        let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten();
        match serde_json::from_slice::<ReleaseResponse>(&body.unwrap_or_default()) {
            Ok(resp) if resp.released > 0 => {
                for &index in &policies {
                    vm.stats.count(index, |s| s.released);
                }
            }
            // Already reclaimed: the check that reclaimed it counted it.
            Ok(_) => log::debug!("lease already gone when released"),
            Err(err) => SluiceRoot::release_failed(&vm, &policies, &format!("malformed answer: {err}")),
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
                self.vm = Some(Rc::new(Vm::new(doc)));
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
        let outgoing = std::mem::take(&mut *vm.outbox.borrow_mut());
        for call in outgoing {
            match post_bytes(&vm.doc, call.path, &call.body, background_timeout(&vm.doc)) {
                Ok(token) if !call.releases.is_empty() => {
                    vm.releasing.borrow_mut().insert(token, call.releases);
                }
                Ok(_) => {}
                Err(reason) if !call.releases.is_empty() => {
                    SluiceRoot::release_failed(&vm, &call.releases, &reason)
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
