//! The gRPC faces: Envoy's own rate-limit protocols, served by tonic with
//! the generated servers of the `envoy-types` crate (no protoc, no
//! hand-written protobuf), on `sluice serve --grpc-listen`.
//!
//! [`router`] gathers the services into one axum router, which
//! [`crate::server::serve`] serves like the HTTP endpoints: the same TLS,
//! connection cap and deadlines. A face only translates: it turns what Envoy
//! sends into requests the policy document evaluates, and the document's
//! checks into the limiter's one decision flow.
//!
//! - [`rls`]: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

use std::sync::Arc;

use sluice_policies::Document;

use crate::limiter::Limiter;

pub mod rls;

/// What every face decides with: the shim's limiter and the policy document.
#[derive(Clone)]
pub struct Faces {
    pub limiter: Arc<Limiter>,
    pub document: Arc<Document>,
}

/// Every gRPC service of the shim, as one router.
pub fn router(faces: Faces) -> axum::Router {
    let routes = tonic::service::Routes::new(rls::service(faces.clone()));
    routes.prepare().into_axum_router()
}
