//! The Sluice policy model: parse, validate, match, key, and the wire format
//! between the filter and the shim. Plain Rust that runs natively (the `sluice`
//! CLI and shim) and in wasm32 (the proxy-wasm filter).
//!
//! # Layout
//!
//! - [`document`]: the JSON policy document, validated while it is parsed, so
//!   every error carries a path and a line and column; which policies apply.
//! - [`condition`]: `match` and `bypass` conditions on a request.
//! - [`class`]: priority classes, most important first.
//! - [`limit`]: the limit types and what each means.
//! - [`cost`]: a points cost read from a header, clamped to the capacity.
//! - [`key`]: key sources, the missing-key rule, and the encoding that keeps
//!   user input out of Redis key syntax.
//! - [`units`]: the validated scalars: durations, counts, names.
//! - [`request`]: what matching and keying read from a request.
//! - [`response`]: what the gateway answers and when: headers, denial
//!   responses, failure modes, the breaker and over-limit cache settings.
//! - [`error`]: [`ParseError`], the one error type of [`parse`].
//! - [`feedback`]: which upstream answers mean "slow down", and for how long.
//! - [`shed`]: a policy's `shed`, and the utilization shedder's controller,
//!   over an injected clock.
//! - [`load`]: the utilization signal a shedding policy reads.
//! - [`leased`]: leased mode, a policy's `leased`, and the bounds of its lease calls.
//! - [`wait`]: egress waiting, a policy's `wait`, and the bounds of its wire fields.
//! - [`wire`]: the compact JSON exchanged with the shim.
//! - [`bounds`]: the size bounds of a request to the shim, which the parser
//!   holds every document to and the shim enforces.
//! - [`algorithm`]: the reference model of every limit type, twin of the
//!   Redis scripts in `lua/`.
//! - [`replay`]: traffic replayed through a document and the model, for
//!   `sluice simulate` and the playground.
//! - `schema` (feature `schema`): the JSON Schema of the document.

pub mod algorithm;
pub mod bounds;
pub mod class;
pub mod condition;
pub mod cost;
pub mod document;
pub mod error;
pub mod feedback;
pub mod key;
pub mod leased;
pub mod limit;
pub mod load;
pub mod replay;
pub mod request;
pub mod response;
#[cfg(feature = "schema")]
pub mod schema;
pub mod shed;
pub mod units;
pub mod wait;
pub mod wire;

pub use condition::Condition;
pub use document::{Applied, Document, Evaluation, FailureMode, Policy, Shim, Verdict};
pub use error::{parse, ParseError};
pub use key::{KeySource, OnMissingKey};
pub use limit::{Cost, Limit, Reserve};
pub use request::Request;
pub use response::{DenyResponse, DenyStatus, HeadersMode};
pub use units::{Count, Duration, HeaderName, PolicyName};
pub use wait::Wait;
