//! The local responses the filter sends: a policy's denial, a refusal for
//! want of capacity, a refusal when the shim failed, and a 400 for a missing key.
//!
//! A policy whose `llm` names an API denies in that API's own error shape
//! (the one its SDKs read their message from), and tells the SDKs not to
//! retry a wait longer than [`SHOULD_RETRY_MAX_SECS`] (`x-should-retry:
//! false`, which the OpenAI and Anthropic SDKs obey; both retry a 429 twice
//! by default, and Anthropic's waits for any `retry-after`, however long).

use std::borrow::Cow;

use serde::Serialize;
use sluice_policies::llm::Api;
use sluice_policies::{DenyResponse, DenyStatus, Policy};

use crate::ratelimit_headers::RateLimitHeaders;

/// The default denial's body, `{"error":"rate_limited","policy":…,"retry_after":…}`:
/// written straight from this struct (a denial from the over-limit cache is
/// the cheapest path there is, and a `json!` value would cost a map).
#[derive(Serialize)]
struct Denied<'a> {
    error: &'static str,
    policy: &'a str,
    retry_after: u64,
}

/// A local response: status, headers, body. A header's name or value is
/// borrowed when it is a constant (most are), so a denial does not copy it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u16,
    pub headers: Vec<(Header, Header)>,
    pub body: Vec<u8>,
}

/// A header's name or value in a [`LocalReply`].
pub type Header = Cow<'static, str>;

/// The most headers a refusal starts with: `retry-after`, the two
/// `RateLimit` headers, `x-should-retry`, `content-type` and `x-sluice-verdict`.
const REFUSAL_HEADERS: usize = 6;

/// The longest wait (`retry-after`, in seconds) a policy with an LLM API
/// lets an SDK retry after: past it, `x-should-retry: false`. An SDK's
/// caller blocks for each retry's wait, twice by default: 20 s each is
/// about what a caller of a chat answer waits anyway; a budget spent for
/// minutes or hours is better told at once.
pub const SHOULD_RETRY_MAX_SECS: u64 = 20;

/// The header the OpenAI and Anthropic SDKs obey over their own retry rules.
pub const SHOULD_RETRY: &str = "x-should-retry";

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";
const PROBLEM_JSON: &str = "application/problem+json";
/// The IETF RateLimit draft's problem type for a service short of capacity.
pub const REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

impl LocalReply {
    /// `policy` denies: its response (429 and the small JSON body unless it
    /// says otherwise), always with `retry-after`, and the RateLimit headers if given.
    /// A policy with an `llm` API answers in that API's error shape instead
    /// (see [`llm_denial`]), with `x-should-retry: false` past
    /// [`SHOULD_RETRY_MAX_SECS`]; its `response` still overrides both.
    pub fn denial(policy: &Policy, retry_after_secs: u64, ratelimit: Option<RateLimitHeaders>) -> LocalReply {
        let api = policy.llm.as_ref().and_then(|llm| llm.api);
        let json = || match api {
            Some(api) => llm_denial(api, policy.name.as_str(), retry_after_secs),
            None => {
                let body = Denied {
                    error: "rate_limited",
                    policy: policy.name.as_str(),
                    retry_after: retry_after_secs,
                };
                serde_json::to_vec(&body).unwrap_or_default()
            }
        };
        let should_retry = api.is_some() && retry_after_secs > SHOULD_RETRY_MAX_SECS;
        let extra = should_retry.then_some((SHOULD_RETRY.into(), "false".into()));
        LocalReply::refusal(
            policy,
            DenyStatus::TOO_MANY_REQUESTS,
            json,
            JSON,
            retry_after_secs,
            ratelimit,
            extra,
        )
    }

    /// `policy` refuses for want of capacity, not for a client's quota: a
    /// pool's reserve held the request's class out (S4c), or the shedder
    /// shed it (S4d). 503 and the IETF problem type
    /// `temporary-reduced-capacity`, unless the policy's response says
    /// otherwise; always with `retry-after`.
    pub fn reduced_capacity(policy: &Policy, class: &str, retry_after_secs: u64) -> LocalReply {
        let json = serde_json::json!({
            "type": REDUCED_CAPACITY,
            "title": "Temporary reduced capacity",
            "status": 503,
            "policy": policy.name.as_str(),
            "class": class,
            "retry_after": retry_after_secs,
        });
        LocalReply::refusal(
            policy,
            DenyStatus::UNAVAILABLE,
            || json.to_string().into_bytes(),
            PROBLEM_JSON,
            retry_after_secs,
            None,
            None,
        )
    }

    fn refusal(
        policy: &Policy,
        status: DenyStatus,
        json: impl FnOnce() -> Vec<u8>,
        json_type: &'static str,
        retry_after_secs: u64,
        ratelimit: Option<RateLimitHeaders>,
        extra: Option<(Header, Header)>,
    ) -> LocalReply {
        let response: &DenyResponse = &policy.response;
        let (body, content_type) = match &response.body {
            Some(body) => (body.clone().into_bytes(), TEXT),
            None => (json(), json_type),
        };
        let mut headers = Vec::with_capacity(REFUSAL_HEADERS + response.headers.0.len());
        headers.push(("retry-after".into(), retry_after_secs.to_string().into()));
        if let Some(h) = ratelimit {
            headers.push((RateLimitHeaders::POLICY.into(), h.policy.into()));
            headers.push((RateLimitHeaders::RATELIMIT.into(), h.ratelimit.into()));
        }
        headers.extend(extra);
        let status = response.status.unwrap_or(status).get();
        let mut reply = LocalReply { status, headers, body };
        reply.finish(content_type, &response.headers.0);
        reply
    }

    /// The shim failed and `failure_mode` is `deny`.
    pub fn unavailable(status: u16) -> LocalReply {
        let body = br#"{"error":"rate_limiter_unavailable"}"#.to_vec();
        LocalReply { status, headers: vec![("content-type".into(), JSON.into())], body }
    }

    /// A request without a key source its policy requires.
    pub fn missing_key(policy: &Policy) -> LocalReply {
        let body = serde_json::json!({"error": "missing_key", "policy": policy.name.as_str()});
        LocalReply {
            status: 400,
            headers: vec![("content-type".into(), JSON.into())],
            body: body.to_string().into_bytes(),
        }
    }

    /// Adds the policy's extra headers, and `content_type` unless they set one.
    fn finish(&mut self, content_type: &'static str, extra: &[(sluice_policies::HeaderName, String)]) {
        if !extra.iter().any(|(name, _)| name.as_str() == "content-type") {
            self.headers.push(("content-type".into(), content_type.into()));
        }
        for (name, value) in extra {
            self.headers.retain(|(n, _)| n != name.as_str());
            self.headers.push((name.as_str().to_owned().into(), value.clone().into()));
        }
    }
}

/// The body of a denial in `api`'s own error shape: OpenAI's
/// `{"error":{"message","type","param","code"}}` (its SDKs raise
/// `RateLimitError` with `error.message`), Anthropic's
/// `{"type":"error","error":{"type":"rate_limit_error","message"}}`.
pub fn llm_denial(api: Api, policy: &str, retry_after_secs: u64) -> Vec<u8> {
    let message = format!(
        "Rate limit reached: the gateway's policy {policy} refused this request; \
         please try again in {retry_after_secs}s."
    );
    let body = match api {
        Api::OpenaiChat | Api::OpenaiResponses => serde_json::json!({"error": {
            "message": message, "type": "rate_limit_exceeded", "param": null, "code": "rate_limit_exceeded"}}),
        Api::AnthropicMessages => {
            serde_json::json!({"type": "error", "error": {"type": "rate_limit_error", "message": message}})
        }
    };
    body.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(extra: &str) -> Policy {
        let doc = format!(
            r#"{{"policies":[{{"name":"p",{extra}"limits":[{{"type":"interval","every":"1s"}}]}}]}}"#
        );
        sluice_policies::parse(&doc).expect("doc").policies[0].clone()
    }

    /// A token budget with `llm` and `extra`.
    fn budget(llm: &str, extra: &str) -> Policy {
        let doc = format!(
            r#"{{"policies":[{{"name":"p","llm":{llm},{extra}"limits":[{{"type":"points","capacity":100,"refill":"1h","cost":"llm_tokens"}}]}}]}}"#
        );
        sluice_policies::parse(&doc).expect("doc").policies[0].clone()
    }

    fn header<'a>(reply: &'a LocalReply, name: &str) -> Option<&'a str> {
        reply.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_ref())
    }

    #[test]
    fn the_default_denial_is_429_with_the_small_json_body() {
        let reply = LocalReply::denial(&policy(""), 3, None);
        assert_eq!(reply.status, 429);
        assert_eq!(header(&reply, "retry-after"), Some("3"));
        assert_eq!(header(&reply, "content-type"), Some(JSON));
        let body: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
        assert_eq!(body, serde_json::json!({"error": "rate_limited", "policy": "p", "retry_after": 3}));
        assert_eq!(reply.body, br#"{"error":"rate_limited","policy":"p","retry_after":3}"#, "byte for byte");
    }

    #[test]
    fn a_policy_sets_status_body_and_headers_and_retry_after_stays() {
        let p = policy(
            r#""response":{"status":503,"body":"shedding load\n","headers":{"x-shed":"1","retry-after":"9"}},"#,
        );
        let reply = LocalReply::denial(&p, 3, None);
        assert_eq!(reply.status, 503);
        assert_eq!(reply.body, b"shedding load\n");
        assert_eq!(header(&reply, "content-type"), Some(TEXT));
        assert_eq!(header(&reply, "x-shed"), Some("1"));
        assert_eq!(header(&reply, "retry-after"), Some("9"), "a policy's own header wins");
        let json =
            policy(r#""response":{"body":"{}","headers":{"content-type":"application/problem+json"}},"#);
        let reply = LocalReply::denial(&json, 1, None);
        assert_eq!(header(&reply, "content-type"), Some("application/problem+json"));
        assert_eq!(reply.headers.iter().filter(|(n, _)| n == "content-type").count(), 1);
    }

    #[test]
    fn an_llm_policy_denies_in_its_apis_shape_and_stops_long_retries() {
        let openai = budget(r#"{"api":"openai_chat"}"#, "");
        let reply = LocalReply::denial(&openai, 3, None);
        assert_eq!(reply.status, 429);
        let body: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
        assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("policy p")), "{body}");
        assert_eq!(header(&reply, SHOULD_RETRY), None, "a short wait: the SDK may retry");
        let reply = LocalReply::denial(&openai, SHOULD_RETRY_MAX_SECS + 1, None);
        assert_eq!(header(&reply, SHOULD_RETRY), Some("false"));

        let anthropic = budget(r#"{"api":"anthropic_messages"}"#, "");
        let reply = LocalReply::denial(&anthropic, 600, None);
        let body: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(header(&reply, SHOULD_RETRY), Some("false"));
        assert_eq!(header(&reply, "retry-after"), Some("600"));

        let own = budget(
            r#"{"api":"openai_chat"}"#,
            r#""response":{"body":"no","headers":{"x-should-retry":"true"}},"#,
        );
        let reply = LocalReply::denial(&own, 600, None);
        assert_eq!(reply.body, b"no", "the policy's response wins");
        assert_eq!(header(&reply, SHOULD_RETRY), Some("true"));
        assert_eq!(reply.headers.iter().filter(|(n, _)| n == SHOULD_RETRY).count(), 1);
    }

    #[test]
    fn a_refusal_for_want_of_capacity_is_503_with_the_problem_type() {
        let reply = LocalReply::reduced_capacity(&policy(""), "batch", 2);
        assert_eq!(reply.status, 503);
        assert_eq!(header(&reply, "retry-after"), Some("2"));
        assert_eq!(header(&reply, "content-type"), Some(PROBLEM_JSON));
        let body: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
        assert_eq!(body["type"], REDUCED_CAPACITY);
        assert_eq!(body["status"], 503);
        assert_eq!(body["class"], "batch");
        let own = policy(r#""response":{"status":429},"#);
        assert_eq!(
            LocalReply::reduced_capacity(&own, "batch", 2).status,
            429,
            "the policy's own status wins"
        );
    }
}
