//! The local responses the filter sends: a policy's denial, a refusal when
//! the shim failed, and a 400 for a missing key.

use sluice_policies::{DenyResponse, Policy};

use crate::ratelimit_headers::RateLimitHeaders;

/// A local response: status, headers, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";

impl Reply {
    /// `policy` denies: its response (429 and the small JSON body unless it
    /// says otherwise), always with `retry-after`, and the RateLimit headers if given.
    pub fn denial(policy: &Policy, retry_after_secs: u64, ratelimit: Option<RateLimitHeaders>) -> Reply {
        let response: &DenyResponse = &policy.response;
        let (body, content_type) = match &response.body {
            Some(body) => (body.clone().into_bytes(), TEXT),
            None => {
                let name = policy.name.as_str();
                let json = serde_json::json!({"error": "rate_limited", "policy": name, "retry_after": retry_after_secs});
                (json.to_string().into_bytes(), JSON)
            }
        };
        let mut headers = vec![("retry-after".to_string(), retry_after_secs.to_string())];
        if let Some(h) = ratelimit {
            headers.push((RateLimitHeaders::POLICY.into(), h.policy));
            headers.push((RateLimitHeaders::RATELIMIT.into(), h.ratelimit));
        }
        let mut reply = Reply { status: response.status(), headers, body };
        reply.finish(content_type, &response.headers.0);
        reply
    }

    /// The shim failed and `failure_mode` is `deny`.
    pub fn unavailable(status: u16) -> Reply {
        let body = br#"{"error":"rate_limiter_unavailable"}"#.to_vec();
        Reply { status, headers: vec![("content-type".into(), JSON.into())], body }
    }

    /// A request without a key source its policy requires.
    pub fn missing_key(policy: &Policy) -> Reply {
        let body = serde_json::json!({"error": "missing_key", "policy": policy.name.as_str()});
        Reply {
            status: 400,
            headers: vec![("content-type".into(), JSON.into())],
            body: body.to_string().into_bytes(),
        }
    }

    /// Adds the policy's extra headers, and `content_type` unless they set one.
    fn finish(&mut self, content_type: &str, extra: &[(sluice_policies::HeaderName, String)]) {
        if !extra.iter().any(|(name, _)| name.as_str() == "content-type") {
            self.headers.push(("content-type".into(), content_type.into()));
        }
        for (name, value) in extra {
            self.headers.retain(|(n, _)| n != name.as_str());
            self.headers.push((name.as_str().into(), value.clone()));
        }
    }
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

    fn header<'a>(reply: &'a Reply, name: &str) -> Option<&'a str> {
        reply.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_default_denial_is_429_with_the_small_json_body() {
        let reply = Reply::denial(&policy(""), 3, None);
        assert_eq!(reply.status, 429);
        assert_eq!(header(&reply, "retry-after"), Some("3"));
        assert_eq!(header(&reply, "content-type"), Some(JSON));
        let body: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
        assert_eq!(body, serde_json::json!({"error": "rate_limited", "policy": "p", "retry_after": 3}));
    }

    #[test]
    fn a_policy_sets_status_body_and_headers_and_retry_after_stays() {
        let p = policy(
            r#""response":{"status":503,"body":"shedding load\n","headers":{"x-shed":"1","retry-after":"9"}},"#,
        );
        let reply = Reply::denial(&p, 3, None);
        assert_eq!(reply.status, 503);
        assert_eq!(reply.body, b"shedding load\n");
        assert_eq!(header(&reply, "content-type"), Some(TEXT));
        assert_eq!(header(&reply, "x-shed"), Some("1"));
        assert_eq!(header(&reply, "retry-after"), Some("9"), "a policy's own header wins");
        let json =
            policy(r#""response":{"body":"{}","headers":{"content-type":"application/problem+json"}},"#);
        let reply = Reply::denial(&json, 1, None);
        assert_eq!(header(&reply, "content-type"), Some("application/problem+json"));
        assert_eq!(reply.headers.iter().filter(|(n, _)| n == "content-type").count(), 1);
    }
}
