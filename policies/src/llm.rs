//! Token budgets for LLM APIs: a policy's `llm`, which says where a request's
//! true cost in tokens is read and what to reserve before it is known. The
//! policy's `points` limits with `"cost": "llm_tokens"` are charged in tokens.
//!
//! ```json
//! "llm": {"api": "openai_chat", "default_max_tokens": 1024}
//! ```
//!
//! **Reserve, then settle.** The check charges a reservation, computed from
//! the request's body by [`Llm::reserve`]: the output part is the request's
//! own cap (`max_completion_tokens`, `max_tokens` or `max_output_tokens`,
//! times `n` choices), or `default_max_tokens`; the input part is the body's
//! length over `bytes_per_token`. Once the response tells the true count (its
//! `usage`, in a JSON body or in a stream's events), the difference is
//! charged or refunded once: the `points` correction, with the body as the
//! source (`POST /v1/adjust`).
//!
//! **The bound.** With the default `bytes_per_token` of 1, the input part is
//! at least the prompt's true count: every token of a byte-level tokenizer
//! covers at least one byte of text, and the JSON around each message covers
//! its few framing tokens (images, audio and files are counted by other
//! rules: they are not covered). So with a cap in every request, the
//! reservation is at least the true count, and a budget is never overspent.
//! Without one, it is overspent by at most what the requests in flight use
//! beyond their reservations.
//!
//! The presets ([`Api`]) name each API's usage fields; `usage` names them by
//! JSON pointer for any other API, with `weights` for input and output.

use serde::de::{self, Deserialize, Deserializer};

use crate::body::{Body, Pointer};
use crate::invalid::Invalid;

/// The most pointers one usage part may sum.
pub const MAX_FIELDS: usize = 8;
/// The largest weight of a usage part.
pub const MAX_WEIGHT: f64 = 1000.0;
/// `default_max_tokens` when a policy gives none.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// `content_bytes_per_token` when a policy gives none: about what English
/// text and code take per token in the common tokenizers.
pub const CONTENT_BYTES_PER_TOKEN: u32 = 4;
/// The largest `default_max_tokens` and `bytes_per_token`.
pub const MAX_SETTING: u32 = 1_000_000_000;
/// The most choices (`n`) a reservation multiplies its output part by.
pub const MAX_CHOICES: u64 = 128;

/// The request fields that cap a response's output tokens, in the order read.
pub const MAX_TOKENS_FIELDS: [&str; 3] = ["/max_completion_tokens", "/max_tokens", "/max_output_tokens"];

/// An LLM API whose shape Sluice knows: where its usage is, in a JSON
/// response and in a stream's events, what its content looks like, and how
/// it says "error" inside a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// OpenAI chat completions (`/v1/chat/completions`): `usage.prompt_tokens`
    /// and `completion_tokens`; streamed, in the final chunk when the request
    /// sets `stream_options.include_usage`.
    OpenaiChat,
    /// OpenAI responses (`/v1/responses`): `usage.input_tokens` and
    /// `output_tokens`; streamed, in `response.completed`.
    OpenaiResponses,
    /// Anthropic messages (`/v1/messages`): `usage.input_tokens` (with the
    /// cache's) and `output_tokens`; streamed, in `message_start` and the
    /// last `message_delta`.
    AnthropicMessages,
}

impl Api {
    /// Its name in a document.
    pub fn name(self) -> &'static str {
        match self {
            Api::OpenaiChat => "openai_chat",
            Api::OpenaiResponses => "openai_responses",
            Api::AnthropicMessages => "anthropic_messages",
        }
    }

    /// Where its usage is: each field's places, in a JSON body and in a
    /// stream's event data (the last value seen wins).
    pub fn usage(self) -> Usage {
        let pointers = |places: &[&str]| places.iter().filter_map(|p| Pointer::new(p)).collect();
        let field = |places: &[&str]| Field { at: pointers(places), provisional: Vec::new() };
        match self {
            Api::OpenaiChat => Usage::Parts {
                input: vec![field(&["/usage/prompt_tokens"])],
                output: vec![field(&["/usage/completion_tokens"])],
            },
            Api::OpenaiResponses => Usage::Parts {
                input: vec![field(&["/usage/input_tokens", "/response/usage/input_tokens"])],
                output: vec![field(&["/usage/output_tokens", "/response/usage/output_tokens"])],
            },
            Api::AnthropicMessages => {
                // `message_start` reports the input and the first output
                // token; the last `message_delta`, the final counts.
                let input = |name: &str| Field {
                    at: pointers(&[&format!("/usage/{name}")]),
                    provisional: pointers(&[&format!("/message/usage/{name}")]),
                };
                Usage::Parts {
                    input: vec![
                        input("input_tokens"),
                        input("cache_creation_input_tokens"),
                        input("cache_read_input_tokens"),
                    ],
                    output: vec![input("output_tokens")],
                }
            }
        }
    }

    /// Where its generated content is, in a JSON body and in a stream's
    /// event data (`*` is any member or element): what a count of the
    /// content seen counts.
    pub fn content(self) -> &'static [&'static str] {
        match self {
            Api::OpenaiChat => &[
                "/choices/*/message/content",
                "/choices/*/message/tool_calls/*/function/arguments",
                "/choices/*/delta/content",
                "/choices/*/delta/tool_calls/*/function/arguments",
            ],
            Api::OpenaiResponses => &["/output/*/content/*/text", "/output/*/arguments", "/delta"],
            Api::AnthropicMessages => {
                &["/content/*/text", "/delta/text", "/delta/partial_json", "/delta/thinking"]
            }
        }
    }
}

/// One count of the usage: the places it may be (alternatives; in a stream
/// the last value seen wins, as each event repeats the count so far).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// Where the final count is.
    pub at: Vec<Pointer>,
    /// Where a stream reports the count before it is final (its first
    /// event): good for a running count, not for a stream cut short.
    pub provisional: Vec<Pointer>,
}

/// Where a response's usage is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Usage {
    /// One count, the sum of these fields.
    Total(Vec<Field>),
    /// Input and output counts, each the sum of its fields, weighed apart.
    Parts { input: Vec<Field>, output: Vec<Field> },
}

/// What a request's stream is charged when it ends without its usage (a
/// reset, an upstream error, no usage event, a body that cannot be read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// The reservation stays charged: nothing is refunded.
    #[default]
    Reservation,
    /// The input part of the reservation, and the content delivered as the
    /// output (see [`Llm::delivered`]; never more than the reservation's
    /// output part when the request named its cap).
    Content,
}

/// The weight of each usage part: the cost is `input × input + output × output`, rounded up.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Weights {
    /// The weight of an input token, 0 to 1000.
    #[serde(default = "one")]
    pub input: f64,
    /// The weight of an output token, 0 to 1000.
    #[serde(default = "one")]
    pub output: f64,
}

fn one() -> f64 {
    1.0
}

impl Default for Weights {
    fn default() -> Self {
        Weights { input: 1.0, output: 1.0 }
    }
}

/// A policy's `llm`.
#[derive(Debug, Clone, PartialEq)]
pub struct Llm {
    /// The API's shape, if a preset names it.
    pub api: Option<Api>,
    pub usage: Usage,
    pub weights: Weights,
    pub default_max_tokens: u32,
    pub bytes_per_token: u32,
    /// The generated content's bytes counted as one output token where the
    /// response has not told its count (see [`Llm::delivered`]).
    pub content_bytes_per_token: u32,
    pub fallback: Fallback,
    /// End a stream once its running count passes what the key has left.
    pub end_stream: bool,
}

/// What a request reserves, before its response is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// The prompt's estimate: the body's length over `bytes_per_token`.
    pub input: u64,
    /// The request's cap on output tokens (times its choices), or the default.
    pub output: u64,
    /// Whether the request named its cap.
    pub capped: bool,
}

impl Llm {
    /// What a request of this `body` (`None`: no body) reserves.
    pub fn reserve(&self, body: Option<&Body>) -> Reservation {
        let input = body.map_or(0, |b| b.len.div_ceil(u64::from(self.bytes_per_token)));
        let cap = body.and_then(|b| MAX_TOKENS_FIELDS.iter().find_map(|f| b.count(f)));
        let choices = body.and_then(|b| b.count("/n")).unwrap_or(1).clamp(1, MAX_CHOICES);
        let output = cap.unwrap_or(u64::from(self.default_max_tokens)).saturating_mul(choices);
        Reservation { input, output, capped: cap.is_some() }
    }

    /// The output tokens a response delivered, as far as its content tells
    /// them: `bytes` of generated content over `content_bytes_per_token`,
    /// and at least one per event that carried content (no API sends a
    /// content event before it has generated a token).
    pub fn delivered(&self, bytes: u64, events: u64) -> u64 {
        bytes.div_ceil(u64::from(self.content_bytes_per_token)).max(events)
    }

    /// The cost of `input` and `output` tokens: weighed, rounded up, at most `u32::MAX`.
    pub fn cost(&self, input: u64, output: u64) -> u32 {
        let cost = match self.usage {
            Usage::Total(_) => (input as f64) + (output as f64),
            Usage::Parts { .. } => {
                (input as f64) * self.weights.input + (output as f64) * self.weights.output
            }
        };
        // Float to int casts saturate.
        cost.ceil() as u32
    }
}

/// `usage` as a document writes it: `{"total": P}` or `{"input": P, "output":
/// P}`, each a pointer or a list of pointers to sum.
#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUsage {
    /// The total count (a pointer, or a list of pointers to sum).
    total: Option<Pointers>,
    /// The input count (a pointer, or a list of pointers to sum).
    input: Option<Pointers>,
    /// The output count (a pointer, or a list of pointers to sum).
    output: Option<Pointers>,
}

/// A pointer, or a list of pointers.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(untagged))]
pub(crate) enum Pointers {
    One(Pointer),
    Many(Vec<Pointer>),
}

impl<'de> Deserialize<'de> for Pointers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PointersVisitor;
        impl<'de> de::Visitor<'de> for PointersVisitor {
            type Value = Pointers;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON pointer, or a list of JSON pointers")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Pointers, E> {
                Pointer::deserialize(de::value::StrDeserializer::new(text)).map(Pointers::One)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Pointers, A::Error> {
                Vec::<Pointer>::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(Pointers::Many)
            }
        }
        d.deserialize_any(PointersVisitor)
    }
}

impl Pointers {
    fn fields(self) -> Result<Vec<Field>, Invalid> {
        let pointers = match self {
            Pointers::One(p) => vec![p],
            Pointers::Many(ps) => ps,
        };
        if pointers.is_empty() || pointers.len() > MAX_FIELDS {
            return Err(Invalid::new(format!("a usage count sums 1 to {MAX_FIELDS} pointers")));
        }
        Ok(pointers.into_iter().map(|p| Field { at: vec![p], provisional: Vec::new() }).collect())
    }
}

impl RawUsage {
    fn check(self) -> Result<Usage, Invalid> {
        match (self.total, self.input, self.output) {
            (Some(total), None, None) => Ok(Usage::Total(total.fields()?)),
            (None, Some(input), Some(output)) => {
                Ok(Usage::Parts { input: input.fields()?, output: output.fields()? })
            }
            _ => Err(Invalid::new("give `usage.total`, or both `usage.input` and `usage.output`")),
        }
    }
}

/// A policy's `llm` as a document writes it.
#[derive(serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLlm {
    /// A known API's shape: `openai_chat`, `openai_responses` or `anthropic_messages`.
    api: Option<Api>,
    /// Where the usage is, by JSON pointer; the preset's when `api` is given.
    usage: Option<RawUsage>,
    /// The weight of input and output tokens (with input and output counts).
    weights: Option<Weights>,
    /// The output reserved for a request that names no `max_tokens` (or
    /// `max_completion_tokens`, `max_output_tokens`), 1 to 1e9; 4096 if not given.
    default_max_tokens: Option<u32>,
    /// The prompt's bytes counted as one input token in a reservation, 1 to 1e9;
    /// 1 (never less than the true count) if not given.
    bytes_per_token: Option<u32>,
    /// The generated content's bytes counted as one output token where a
    /// stream has not told its count (it ended without its usage; the
    /// running count of `end_stream`), 1 to 1e9; 4 if not given. At least
    /// one token is counted per event that carries content.
    content_bytes_per_token: Option<u32>,
    /// What a stream that ends without its usage is charged: `reservation` or `content`.
    #[serde(default)]
    fallback: Fallback,
    /// End a stream to the client once its running count passes what its key has left.
    #[serde(default)]
    end_stream: bool,
}

impl RawLlm {
    fn check(self) -> Result<Llm, Invalid> {
        let usage = match (self.usage, self.api) {
            (Some(usage), _) => usage.check()?,
            (None, Some(api)) => api.usage(),
            (None, None) => {
                return Err(Invalid::new("give `api` (a known API's shape) or `usage` (its JSON pointers)"))
            }
        };
        let weights = self.weights.unwrap_or_default();
        if self.weights.is_some() && matches!(usage, Usage::Total(_)) {
            return Err(Invalid::new("`weights` need input and output counts, not `usage.total`"));
        }
        for (name, w) in [("input", weights.input), ("output", weights.output)] {
            if !(0.0..=MAX_WEIGHT).contains(&w) {
                return Err(Invalid::new(format!("weights.{name} {w} out of range (0 to {MAX_WEIGHT})")));
            }
        }
        if weights.input == 0.0 && weights.output == 0.0 {
            return Err(Invalid::new(
                "weights.input and weights.output are both 0: nothing would be charged",
            ));
        }
        let setting = |value: Option<u32>, default: u32, name: &str| match value.unwrap_or(default) {
            n @ 1..=MAX_SETTING => Ok(n),
            n => Err(Invalid::new(format!("{name} {n} out of range (1 to {MAX_SETTING})"))),
        };
        if self.api.is_none() {
            let needs = [
                (self.end_stream, "`end_stream`"),
                (self.fallback == Fallback::Content, "`fallback: content`"),
            ];
            if let Some((_, what)) = needs.iter().find(|(on, _)| *on) {
                return Err(Invalid::new(format!(
                    "{what} needs `api`: the API's shape says what its content and its errors look like"
                )));
            }
        }
        Ok(Llm {
            api: self.api,
            usage,
            weights,
            default_max_tokens: setting(self.default_max_tokens, DEFAULT_MAX_TOKENS, "default_max_tokens")?,
            bytes_per_token: setting(self.bytes_per_token, 1, "bytes_per_token")?,
            content_bytes_per_token: setting(
                self.content_bytes_per_token,
                CONTENT_BYTES_PER_TOKEN,
                "content_bytes_per_token",
            )?,
            fallback: self.fallback,
            end_stream: self.end_stream,
        })
    }
}

impl<'de> Deserialize<'de> for Llm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RawLlm::deserialize(d)?.check().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llm(json: &str) -> serde_json::Result<Llm> {
        serde_json::from_str::<Llm>(json)
    }

    #[test]
    fn a_reservation_takes_the_requests_cap_or_the_default() {
        let l = llm(r#"{"api": "openai_chat", "default_max_tokens": 100}"#).unwrap();
        let body = |json: &str| Body::parse(json.as_bytes());
        let r = l.reserve(Some(&body(r#"{"max_tokens": 50, "messages": []}"#)));
        assert_eq!(r, Reservation { input: 34, output: 50, capped: true });
        let r = l.reserve(Some(&body(r#"{"max_completion_tokens": 7, "max_tokens": 50}"#)));
        assert_eq!((r.output, r.capped), (7, true), "max_completion_tokens first");
        let r = l.reserve(Some(&body(r#"{"max_output_tokens": 9}"#)));
        assert_eq!(r.output, 9);
        let r = l.reserve(Some(&body(r#"{"n": 3, "max_tokens": 10}"#)));
        assert_eq!(r.output, 30, "each choice may use the cap");
        let r = l.reserve(Some(&body(r#"{"messages": []}"#)));
        assert_eq!(r, Reservation { input: 16, output: 100, capped: false });
        assert_eq!(l.reserve(None), Reservation { input: 0, output: 100, capped: false });
        let r = l.reserve(Some(&body("not json at all")));
        assert_eq!((r.input, r.output), (15, 100));
    }

    #[test]
    fn bytes_per_token_divides_the_prompt_rounding_up() {
        let l = llm(r#"{"api": "anthropic_messages", "bytes_per_token": 4}"#).unwrap();
        assert_eq!(l.reserve(Some(&Body::parse(b"{\"a\": 1234}"))).input, 3);
    }

    #[test]
    fn costs_are_weighed_and_rounded_up() {
        let l = llm(r#"{"api": "openai_chat", "weights": {"input": 0.5, "output": 4}}"#).unwrap();
        assert_eq!(l.cost(3, 2), 10);
        assert_eq!(l.cost(u64::MAX, u64::MAX), u32::MAX);
        let total = llm(r#"{"usage": {"total": "/usage/total_tokens"}}"#).unwrap();
        assert_eq!(total.cost(3, 2), 5);
    }

    #[test]
    fn bad_settings_are_refused_with_their_reason() {
        let cases = [
            (r#"{}"#, "give `api` (a known API's shape) or `usage` (its JSON pointers)"),
            (
                r#"{"usage": {"total": "/t", "input": "/i"}}"#,
                "give `usage.total`, or both `usage.input` and `usage.output`",
            ),
            (
                r#"{"usage": {"total": "/t"}, "weights": {"input": 2}}"#,
                "`weights` need input and output counts, not `usage.total`",
            ),
            (
                r#"{"api": "openai_chat", "weights": {"output": 1001}}"#,
                "weights.output 1001 out of range (0 to 1000)",
            ),
            (
                r#"{"api": "openai_chat", "weights": {"input": 0, "output": 0}}"#,
                "weights.input and weights.output are both 0: nothing would be charged",
            ),
            (
                r#"{"api": "openai_chat", "default_max_tokens": 0}"#,
                "default_max_tokens 0 out of range (1 to 1000000000)",
            ),
            (
                r#"{"usage": {"total": "/t"}, "end_stream": true}"#,
                "`end_stream` needs `api`: the API's shape says what its content and its errors look like",
            ),
            (r#"{"usage": {"total": []}}"#, "a usage count sums 1 to 8 pointers"),
        ];
        for (json, want) in cases {
            let got = llm(json).expect_err(json).to_string();
            assert!(got.starts_with(want), "{json}: {got}");
        }
    }

    #[test]
    fn each_preset_names_input_and_output() {
        for api in [Api::OpenaiChat, Api::OpenaiResponses, Api::AnthropicMessages] {
            let Usage::Parts { input, output } = api.usage() else { panic!("{api:?}") };
            assert!(!input.is_empty() && !output.is_empty());
            assert!(
                input.iter().chain(&output).all(|f| !f.at.is_empty()),
                "{api:?}: a pointer failed to parse"
            );
            let name = serde_json::to_string(api.name()).unwrap();
            assert_eq!(serde_json::from_str::<Api>(&name).unwrap(), api);
        }
    }
}
