//! The Sluice decision core: each request's flow as a sans-IO state
//! machine, and what one worker shares between its requests. No proxy-wasm
//! here: it builds natively and for wasm32, and its tests drive every mode
//! with a fake host and a fake clock, in milliseconds.
//!
//! A face (the proxy-wasm filter in `plugin/`, and any later one) turns its
//! world into [`Flow`] and [`Worker`] events and performs the [`Effect`]s
//! they return. It never decides anything itself.
//!
//! # Layout
//!
//! The machine:
//! - [`flow`]: one request's [`Flow`], its [`Phase`]s, events and effects;
//!   its parts (admission, answers, release, upstream, bodies) below it.
//! - [`worker`]: the [`Worker`]: the document, the breaker, and the calls
//!   that outlive a stream (releases, renewals, shed reports, lease calls,
//!   reports of failure-mode passes), with when it next needs a tick
//!   (`due`: kept as its parts change, not computed on every event).
//! - [`effect`]: the [`Effect`] values, calls and their results.
//! - [`sharing`]: shared callouts: a worker's checks queued while its
//!   calls are out, sent together as one batch, answered each alone.
//! - [`host`]: the [`Host`] trait: shared data, response headers, bodies.
//! - [`now`]: [`Now`], the time an event happens at.
//! - [`stats`]: every stat's name, once.
//!
//! Its parts, plain functions and small state machines:
//! - [`plan`]: the one way every face plans a request (the enforced and
//!   shadow split among it), `sluice_policies::plan` re-exported.
//! - [`check_call`]: one check call of a request and what it leaves to do.
//! - [`decision`]: reads the shim's answer, or why it is none.
//! - [`breaker`]: the outage breaker.
//! - [`cache`]: the over-limit cache in shared data.
//! - [`leased`]: leased mode's pool of tokens in shared data; [`hot_keys`]:
//!   which keys of a keyed leased policy are hot enough for a lease, over
//!   [`stream_summary`], Space-Saving with O(1) updates.
//! - [`renewals`]: the concurrency leases of live streams, and when each is due for renewal.
//! - [`passes`]: failure-mode passes, counted and reported to the shim.
//! - [`shedding`]: load shedding in one worker: its reports, the fleet's level.
//! - [`feedback`]: which policies a response's upstream answer pauses.
//! - [`llm`]: token budgets: a response read for its token count, streamed
//!   or not ([`llm::json`], [`llm::sse`], [`llm::meter`]), and settled once.
//! - [`wait`]: egress waiting: the request's wait, the call's timeout, `server-timing`.
//! - [`local_reply`]: the local responses: a denial, a failure, a missing key.
//! - [`ratelimit_headers`]: the IETF `RateLimit` and `RateLimit-Policy` headers.
//! - [`x_ratelimit`]: the draft-03 `X-RateLimit-*` headers over every limit
//!   of a call, as the RLS face answers them with `header_format`
//!   `draft_version_03`.
//! - [`verdict`]: what the filter did with a request, for `x-sluice-verdict`.
//! - [`log_throttle`]: a log line an outage cannot turn into a flood.
//! - `testing` (behind the `testing` feature): a fake host for tests of this
//!   crate and its faces, and a Zipf key population for the leased mode's
//!   model test and the bench.
//!
//! Another face's machine:
//! - [`rlqs`]: one RLQS stream (Envoy's `rate_limit_quota` filter): its
//!   buckets' assignments, and the lease calls that take their tokens.

pub mod breaker;
pub mod cache;
pub mod check_call;
pub mod decision;
mod due;
pub mod effect;
pub mod feedback;
pub mod flow;
pub mod host;
pub mod hot_keys;
pub mod leased;
pub mod llm;
pub mod local_reply;
pub mod log_throttle;
pub mod now;
pub mod passes;
pub mod plan;
pub mod ratelimit_headers;
pub mod renewals;
pub mod rlqs;
pub mod sharing;
pub mod shedding;
pub mod stats;
pub mod stream_summary;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod verdict;
pub mod wait;
pub mod worker;
pub mod x_ratelimit;

pub use effect::{CallId, CallResult, Deferred, Effect, Outgoing};
pub use flow::{Flow, Phase};
pub use host::{Host, SetError, SharedData};
pub use now::Now;
pub use worker::Worker;
