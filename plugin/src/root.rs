//! The root context: parses the policy document once and shares it.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};
use sluice_policies::Document;

use crate::filter::Sluice;

pub struct SluiceRoot {
    context_id: u32,
    doc: Option<Rc<Document>>,
}

impl SluiceRoot {
    pub fn new(context_id: u32) -> SluiceRoot {
        SluiceRoot { context_id, doc: None }
    }
}

impl Context for SluiceRoot {}

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
                self.doc = Some(Rc::new(doc));
                true
            }
            Err(err) => refuse(&err.to_string()),
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Envoy creates no stream unless on_configure succeeded; returning
        // None would abort the VM, so an unconfigured filter passes traffic.
        Some(Box::new(Sluice::new(self.doc.clone(), self.context_id, context_id)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

fn refuse(reason: &str) -> bool {
    log::error!("invalid policy document: {reason}");
    false
}
