//! The Sluice policy model: parse, validate, match, key, and the wire format
//! between the filter and the shim. Plain Rust that runs natively (the `sluice`
//! CLI and shim) and in wasm32 (the proxy-wasm filter).
//!
//! # Layout
//!
//! Four layers; a module imports only from its own layer and those above it
//! in this list, never from one below (the document is parsed against the
//! wire's bounds and the algorithms' state keys, so it sits under both):
//!
//! ```text
//! model      invalid, units, calendar, body, request, cost, response, load,
//!            condition, tree, key, class, limit (and WireLimit, the form the shim
//!            takes), llm, wait, leased, shed, feedback (and Slowdown), face
//!   ^
//! algorithm  algorithm/*: the Rust twins of lua/lib/ and lua/scripts/
//!   ^
//! wire       wire: the messages between the filter and the shim
//!   ^
//! document   document, bounds, error: a whole document, parsed and held
//!            to the shim's bounds; which policies apply; Applied::check;
//!            plan: the one way every face plans a request;
//!            rlqs: what the RLQS face enforces and which policy governs a bucket;
//!            descriptor_limit, descriptor_metric: an RLS descriptor's own
//!            limit, and the label of its decisions
//!   ^
//! tools      replay, schema
//! ```
//!
//! The model:
//!
//! - [`invalid`]: [`Invalid`], why a value was refused (a part of a
//!   policy, a message to the shim, an RLS call): the field's path and why.
//! - [`units`]: the validated scalars: durations, counts, names, parts per
//!   million, and a bucket's time per unit; past parsing, milliseconds
//!   ([`Millis`](units::Millis)) and microseconds ([`Micros`](units::Micros)).
//! - [`calendar`]: calendar windows (a day, week or month in an IANA time
//!   zone), their bounds, and the two ends a check passes to Redis.
//! - [`body`]: a request's body as policies read it: JSON fields by pointer.
//! - [`request`]: what matching and keying read from a request.
//! - [`cost`]: a points cost read from a header, clamped to the capacity.
//! - [`response`]: what the gateway answers and when: headers, denial
//!   responses, failure modes, the breaker and over-limit cache settings.
//! - [`load`]: the utilization signal a shedding policy reads.
//! - [`condition`]: `match` and `bypass` conditions on a request.
//! - [`tree`]: the RLS face's descriptor trees: which node a descriptor
//!   reaches, most specific first at every level.
//! - [`key`]: key sources, the missing-key rule, the encoding that keeps
//!   user input out of Redis key syntax, and the longest key.
//! - [`class`]: priority classes, most important first.
//! - [`limit`]: the limit types and what each means; a concurrency pool's
//!   reserve ([`PoolReserve`]); [`WireLimit`](limit::WireLimit), a limit as
//!   the shim takes it, and the bounds both ends hold it to.
//! - [`llm`]: LLM token budgets, a policy's `llm`: the presets of each API's
//!   shape, where the usage is, what a request reserves.
//! - [`wait`]: egress waiting, a policy's `wait`, and the bounds of its wire fields.
//! - [`leased`]: leased mode, a policy's `leased`, and the bounds of its lease calls.
//! - [`shed`]: a policy's `shed` ([`ShedPolicy`](shed::ShedPolicy)), and the
//!   utilization shedder's controller, over an injected clock.
//! - [`face`]: what the RLQS face can enforce of a policy, refused at load
//!   time otherwise.
//! - [`feedback`]: which upstream answers mean "slow down", for how long
//!   ([`PartnerPause`](feedback::PartnerPause)), and how a refusal lowers
//!   the rate ([`Slowdown`](feedback::Slowdown)).
//!
//! The algorithms:
//!
//! - [`algorithm`]: the reference model of every limit type, twin of the
//!   Redis scripts in `lua/`, over [`RedisTwin`](algorithm::RedisTwin), the
//!   model's Redis; a check's reply ([`CheckReply`](algorithm::CheckReply),
//!   one [`LimitOutcome`](algorithm::LimitOutcome) per limit).
//!
//! The wire:
//!
//! - [`wire`]: the compact JSON exchanged with the shim. It re-exports the
//!   pieces it carries from the layers above (`WireLimit`, `LimitOutcome`,
//!   `Slowdown`), so `wire::` names every part of a message.
//!
//! The document:
//!
//! - [`document`]: the JSON policy document, validated while it is parsed, so
//!   every error carries a path and a line and column; which policies apply,
//!   and the checks and shed reports a policy sends.
//! - [`bounds`]: the size bounds of a request to the shim, which the parser
//!   holds every document to and the shim enforces.
//! - [`error`]: [`ParseError`], the one error type of [`parse`].
//! - [`plan`]: the one way to plan a request or an RLS call, for every
//!   face: its enforced and shadow checks, its missing keys, the policies
//!   decided without a check, and the headers rule.
//! - [`rlqs`]: the RLQS face's policies: what Envoy's `rate_limit_quota`
//!   filter can enforce (refused at load time otherwise), and which policy
//!   governs a bucket ([`rlqs::govern`]).
//! - [`descriptor_limit`]: an RLS descriptor's own `limit` (Envoy's
//!   override), honoured or ignored as the document says.
//! - [`descriptor_metric`]: the `descriptor` label of a tree node's
//!   decisions, as envoyproxy/ratelimit names its stats.
//!
//! The tools:
//!
//! - [`replay`]: traffic replayed through a document and the model, for
//!   `sluice simulate` and the playground.
//! - `schema` (feature `schema`): the JSON Schema of the document.

pub mod algorithm;
pub mod body;
pub mod bounds;
pub mod calendar;
pub mod class;
pub mod condition;
pub mod cost;
pub mod descriptor_limit;
pub mod descriptor_metric;
pub mod document;
pub mod error;
pub mod face;
pub mod feedback;
pub mod invalid;
pub mod key;
pub mod leased;
pub mod limit;
pub mod llm;
pub mod load;
pub mod plan;
pub mod replay;
pub mod request;
pub mod response;
pub mod rlqs;
#[cfg(feature = "schema")]
pub mod schema;
pub mod shed;
pub mod tree;
pub mod units;
pub mod wait;
pub mod wire;

pub use condition::Condition;
pub use document::{Applied, Document, Evaluation, FailureMode, Keyed, Policy, Shim};
pub use error::{parse, ParseError};
pub use invalid::Invalid;
pub use key::{KeySource, OnMissingKey};
pub use limit::{Cost, Limit, PoolReserve};
pub use request::{Face, Request};
pub use response::{DenyResponse, DenyStatus, HeaderFormat, HeadersMode};
pub use units::{Count, Duration, HeaderName, PolicyName};
pub use wait::Wait;
