//! The callout floor, for `cargo xtask bench` only: a proxy-wasm filter that
//! makes exactly one `dispatch_http_call` per request and resumes the request
//! when the answer arrives, whatever it is.
//!
//! It reads no configuration, matches nothing, encodes and parses nothing: it
//! is the least any filter that asks another process per request can cost, so
//! Sluice's added latency is measured against it. It calls `GET /healthz` on
//! the Envoy cluster `floor` (the bench points that cluster at `sluice serve`,
//! whose `/healthz` is the same HTTP/2 server doing no work).

#[cfg(target_arch = "wasm32")]
mod filter {
    use std::time::Duration;

    use proxy_wasm::traits::{Context, HttpContext, RootContext};
    use proxy_wasm::types::{Action, ContextType};

    const CLUSTER: &str = "floor";
    const TIMEOUT: Duration = Duration::from_secs(1);

    pub struct FloorRoot;

    impl Context for FloorRoot {}

    impl RootContext for FloorRoot {
        fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
            Some(Box::new(Floor))
        }

        fn get_type(&self) -> Option<ContextType> {
            Some(ContextType::HttpContext)
        }
    }

    pub struct Floor;

    impl Context for Floor {
        fn on_http_call_response(&mut self, _token: u32, _headers: usize, _body: usize, _trailers: usize) {
            // Resume on any outcome: the floor measures the round trip, not a decision.
            let _ = self.resume_http_request();
        }
    }

    impl HttpContext for Floor {
        fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
            let headers = vec![(":method", "GET"), (":path", "/healthz"), (":authority", "floor")];
            match self.dispatch_http_call(CLUSTER, headers, None, vec![], TIMEOUT) {
                Ok(_) => Action::Pause,
                Err(_) => Action::Continue,
            }
        }
    }
}

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| Box::new(filter::FloorRoot));
}}
