//! The Sluice policy model: parse, validate, match, key, and the wire format
//! between the filter and the shim. Plain Rust that runs natively (the `sluice`
//! CLI and shim) and in wasm32 (the proxy-wasm filter).
//!
//! # Layout
//!
//! - [`document`]: the JSON policy document, strictly typed and validated while
//!   it is parsed, so every error carries a path and a line and column.
//! - [`units`]: the validated scalar types: durations, counts, policy names.
//! - [`error`]: [`ParseError`], the one error type of [`parse`].
//! - [`request`]: what matching and keying read from a request.
//! - [`key`]: key sources and the encoding that keeps user input out of Redis
//!   key syntax.
//! - [`wire`]: the compact JSON exchanged with the shim.

pub mod document;
pub mod error;
pub mod key;
pub mod request;
pub mod units;
pub mod wire;

pub use document::{Document, FailureMode, Limit, Match, Policy, Shim};
pub use error::{parse, ParseError};
pub use key::KeySource;
pub use request::Request;
pub use units::{Count, Duration, PolicyName};
