//! The Wasm deny floor, for `cargo xtask bench` only: a proxy-wasm filter
//! that refuses every request with a local reply (429, no body), on its
//! request headers.
//!
//! It reads no configuration, matches nothing, keeps no state and calls
//! nothing: one `send_http_response` per request. It is the least any Wasm
//! filter that denies a request can cost in Envoy's V8, so Sluice's deny
//! path (a denial answered from its over-limit cache) is measured against it.

#[cfg(target_arch = "wasm32")]
mod filter {
    use proxy_wasm::traits::{Context, HttpContext, RootContext};
    use proxy_wasm::types::{Action, ContextType};

    pub struct DenyRoot;

    impl Context for DenyRoot {}

    impl RootContext for DenyRoot {
        fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
            Some(Box::new(Deny))
        }

        fn get_type(&self) -> Option<ContextType> {
            Some(ContextType::HttpContext)
        }
    }

    pub struct Deny;

    impl Context for Deny {}

    impl HttpContext for Deny {
        fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
            self.send_http_response(429, vec![], None);
            Action::Pause
        }
    }
}

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| Box::new(filter::DenyRoot));
}}
