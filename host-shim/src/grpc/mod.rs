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
//! - [`rls`] serves `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`;
//!   [`memory`] holds its over-limit cache (core's, in the shim's memory),
//!   [`dynamic_metadata`] its answer's `dynamic_metadata`.
//! - [`rlqs`] serves `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sluice_policies::Document;

use crate::dashboard::Policies;
use crate::limiter::Limiter;

pub mod dynamic_metadata;
pub mod memory;
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
    /// The RLS face's over-limit cache, shared by every call.
    pub(crate) memory: Arc<memory::Memory>,
    clock: Clock,
}

/// The faces' clock, in milliseconds since the epoch.
#[derive(Clone, Default)]
enum Clock {
    /// The system's; Redis's scripts read Redis's own.
    #[default]
    System,
    /// A test's: every check carries it, for a limiter in test-time mode.
    Test(Arc<AtomicU64>),
}

impl Faces {
    /// The faces of one document.
    pub fn new(limiter: Arc<Limiter>, document: Arc<Document>) -> Faces {
        Faces::reloading(limiter, Some(document.clone()).into(), document)
    }

    /// The faces of the document in `policies`, following its reloads.
    pub fn reloading(limiter: Arc<Limiter>, policies: Policies, loaded: Arc<Document>) -> Faces {
        Faces { limiter, policies, loaded, memory: Arc::default(), clock: Clock::System }
    }

    /// The same faces on a test's clock: `ms` is the time they read, and
    /// every check they send carries it (the limiter must be built with
    /// `test_time`), so a test moves time for the face and Redis alike.
    pub fn with_test_clock(self, ms: Arc<AtomicU64>) -> Faces {
        Faces { clock: Clock::Test(ms), ..self }
    }

    /// The time now, in milliseconds since the epoch.
    pub(crate) fn now_ms(&self) -> u64 {
        match &self.clock {
            Clock::System => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            Clock::Test(ms) => ms.load(Ordering::Relaxed),
        }
    }

    /// The time a check sent now carries: none on the system's clock
    /// (Redis reads its own), the test's on a test clock.
    pub(crate) fn check_time(&self, now_ms: u64) -> Option<sluice_policies::units::Micros> {
        match self.clock {
            Clock::System => None,
            Clock::Test(_) => Some(sluice_policies::units::Micros(now_ms.saturating_mul(1000))),
        }
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
