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
//! - [`rls`] serves `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
//! - [`rlqs`] serves `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`.

use std::sync::Arc;

use sluice_policies::Document;

use crate::dashboard::Policies;
use crate::limiter::Limiter;

pub mod rlqs;
pub mod rls;

/// What every face decides with: the shim's limiter and the policy
/// document, the one `sluice serve` reloads on SIGHUP.
#[derive(Clone)]
pub struct Faces {
    pub limiter: Arc<Limiter>,
    policies: Policies,
    /// The document the faces started with, if a reload ever empties `policies`.
    loaded: Arc<Document>,
}

impl Faces {
    /// The faces of one document.
    pub fn new(limiter: Arc<Limiter>, document: Arc<Document>) -> Faces {
        Faces::reloading(limiter, Some(document.clone()).into(), document)
    }

    /// The faces of the document in `policies`, following its reloads.
    pub fn reloading(limiter: Arc<Limiter>, policies: Policies, loaded: Arc<Document>) -> Faces {
        Faces { limiter, policies, loaded }
    }

    /// The document now.
    pub fn document(&self) -> Arc<Document> {
        self.policies.get().unwrap_or_else(|| self.loaded.clone())
    }
}

/// Every gRPC service of the shim, as one router.
pub fn router(faces: Faces) -> axum::Router {
    let routes = tonic::service::Routes::new(rls::service(faces.clone())).add_service(rlqs::service(faces));
    routes.prepare().into_axum_router()
}
