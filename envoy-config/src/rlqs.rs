//! The RLQS face's Envoy configuration: Envoy's `rate_limit_quota` filter
//! reporting to `sluice serve --grpc-listen`, with one bucket matcher per
//! RLQS-face policy of the document (in document order: the first that
//! matches a request builds its bucket id, as the first policy that applies
//! governs a bucket).
//!
//! Each bucket id key the policy reads (`match.bucket`, `bucket:NAME`) is
//! the request header of the same name, and the matcher holds the
//! policy's condition on it: `equals` the exact value (the id then carries
//! that constant), `prefix` its prefix, `present: true` (and a key without
//! a condition) any value; `present: false` the header's absence, and the
//! key is left out of the id. So a request reaches the first policy, in
//! document order, whose conditions its headers meet, and the id it builds
//! is one that policy governs; a request no policy takes matches no
//! matcher (Envoy admits it, as the face answers an unmatched bucket).
//! A document where an earlier policy's `present: false` could claim a
//! later one's ids is refused (see [`claims`]). Each bucket reports every [`REPORTING_INTERVAL`] (Envoy
//! 1.40 ignores it and reports every 5 s), and until its first assignment,
//! or once one expires with Sluice away, it follows the policy's
//! `failure_mode`: `deny_all` for `deny` (exact: the filter never admits a
//! request no assignment covers, so a new bucket's first requests wait for
//! its first assignment, one round trip), `allow_all` for `allow`. An
//! `unlimited` policy's buckets are `allow_all` from the start.

use anyhow::bail;
use serde_json::{json, Map, Value};
use sluice_policies::condition::ValueCondition;
use sluice_policies::{Document, Face, FailureMode, HeaderName, KeySource, Policy};

/// `envoy/rlqs.yaml`, built in.
pub const RLQS_TEMPLATE: &str = include_str!("../../envoy/rlqs.yaml");

/// How often each bucket's usage is reported: how soon Sluice sees a bucket
/// spend its tokens, and so how large `leased.tokens` must be (see docs/rlqs.md).
pub const REPORTING_INTERVAL: &str = "0.5s";

const SETTINGS: &str =
    "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings";
const HEADER_INPUT: &str = "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput";

/// The template's `DOMAIN` and `BUCKET_MATCHERS`.
pub fn rlqs_values(doc: &Document) -> anyhow::Result<Vec<(String, String)>> {
    let rlqs: Vec<&Policy> = doc.policies.iter().filter(|p| p.matcher.face() == Face::Rlqs).collect();
    if rlqs.is_empty() {
        bail!(
            "the document has no RLQS-face policy (a `match` naming `bucket`): no bucket for Envoy to report"
        );
    }
    let mut domains: Vec<&str> = rlqs.iter().filter_map(|p| p.matcher.domain.as_deref()).collect();
    domains.dedup();
    let domain = match domains.as_slice() {
        [] => crate::rls::DEFAULT_DOMAIN,
        [one] => one,
        [first, second, ..] => {
            bail!("policies name the domains {first:?} and {second:?}: Envoy's rate_limit_quota filter reports one domain")
        }
    };
    for (i, later) in rlqs.iter().enumerate() {
        for earlier in &rlqs[..i] {
            if let Some(key) = claims(earlier, later) {
                bail!(
                    "policy {} requires bucket key {key:?} absent, and policy {} after it does not read {key:?}: a request with that header that {} takes would build a bucket id {} governs; give {} a condition on {key:?}",
                    earlier.name, later.name, later.name, earlier.name, later.name
                );
            }
        }
    }
    let matchers = rlqs.iter().map(|p| matcher(doc, p)).collect::<anyhow::Result<Vec<Value>>>()?;
    Ok(vec![
        ("DOMAIN".to_string(), serde_json::to_string(domain)?),
        ("BUCKET_MATCHERS".to_string(), serde_json::to_string(&matchers)?),
    ])
}

/// Each bucket id key `policy` reads, with its condition (`None`: a
/// `bucket:NAME` key with none, which must be present).
fn reads(policy: &Policy) -> Vec<(&str, Option<&ValueCondition>)> {
    let key_names = policy.key.iter().filter_map(|k| match k {
        KeySource::Bucket(name) => Some(name.as_str()),
        _ => None,
    });
    let mut reads: Vec<(&str, Option<&ValueCondition>)> =
        policy.matcher.bucket.iter().map(|(k, c)| (k.as_str(), Some(c))).collect();
    reads.extend(key_names.filter(|n| !policy.matcher.bucket.contains_key(*n)).map(|n| (n, None)));
    reads
}

/// The key by which `earlier` could claim a bucket id `later` builds: one
/// `earlier` requires absent and `later` does not read (so leaves out of
/// its ids whatever the request holds), when every key `earlier` requires
/// present is one `later` reads (else no id of `later` meets `earlier`).
fn claims<'p>(earlier: &'p Policy, later: &Policy) -> Option<&'p str> {
    let later_reads: Vec<&str> = reads(later).into_iter().map(|(k, _)| k).collect();
    let earlier_reads = reads(earlier);
    let needs_present = earlier_reads
        .iter()
        .filter(|(_, c)| *c != Some(&ValueCondition::Present(false)))
        .all(|(k, _)| later_reads.contains(k));
    let absent = earlier_reads
        .iter()
        .find(|(k, c)| *c == Some(&ValueCondition::Present(false)) && !later_reads.contains(k))
        .map(|(k, _)| *k);
    absent.filter(|_| needs_present)
}

/// One policy's matcher: its predicate on the request, and the settings of
/// the bucket it builds.
fn matcher(doc: &Document, policy: &Policy) -> anyhow::Result<Value> {
    let mut builder = Map::new();
    let mut predicates = Vec::new();
    for (name, condition) in reads(policy) {
        let Some(header) = HeaderName::new(name).filter(|h| !h.as_str().starts_with(':')) else {
            bail!("policy {}: bucket key {name:?} is read from the request header of that name, which is no valid header name", policy.name);
        };
        let input =
            json!({"name": name, "typed_config": {"@type": HEADER_INPUT, "header_name": header.as_str()}});
        let any = json!({"safe_regex": {"google_re2": {}, "regex": ".*"}});
        let (value_match, id_value) = match condition {
            Some(ValueCondition::Present(false)) => {
                let present = json!({"single_predicate": {"input": input, "value_match": any}});
                predicates.push(json!({"not_matcher": present}));
                continue;
            }
            Some(ValueCondition::Equals(value)) => (json!({"exact": value}), json!({"string_value": value})),
            Some(ValueCondition::Prefix(prefix)) if !prefix.is_empty() => {
                (json!({"prefix": prefix}), json!({"custom_value": input.clone()}))
            }
            _ => (any, json!({"custom_value": input.clone()})),
        };
        builder.insert(name.to_string(), id_value);
        predicates.push(json!({"single_predicate": {"input": input, "value_match": value_match}}));
    }
    if predicates.is_empty() {
        // A constant bucket: every request (every path starts with `/`).
        let path = json!({"name": "path", "typed_config": {"@type": HEADER_INPUT, "header_name": ":path"}});
        predicates.push(json!({"single_predicate": {"input": path, "value_match": {"prefix": "/"}}}));
    }
    let predicate = match predicates.len() {
        1 => predicates.remove(0),
        _ => json!({"and_matcher": {"predicate": predicates}}),
    };
    // An unlimited policy's buckets are allowed from their first request.
    let blanket = match (policy.unlimited, doc.failure_of(policy).0) {
        (false, FailureMode::Deny) => "DENY_ALL",
        _ => "ALLOW_ALL",
    };
    let settings = json!({
        "@type": SETTINGS,
        "bucket_id_builder": {"bucket_id_builder": builder},
        "reporting_interval": REPORTING_INTERVAL,
        "no_assignment_behavior": {"fallback_rate_limit": {"blanket_rule": blanket}},
    });
    Ok(
        json!({"predicate": predicate, "on_match": {"action": {"name": policy.name.as_str(), "typed_config": settings}}}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(doc: &str) -> anyhow::Result<Vec<(String, String)>> {
        rlqs_values(&sluice_policies::parse(doc).expect("a document"))
    }

    #[test]
    fn each_rlqs_policy_becomes_a_bucket_matcher() {
        let v = values(
            r#"{"failure_mode": "deny", "policies": [
              {"name": "a", "match": {"domain": "edge", "bucket": {"name": {"equals": "api"}, "x-user": {"present": true}, "gone": {"present": false}}},
               "key": ["bucket:x-user"], "leased": {"tokens": 10, "ttl": "5s"}, "limits": [{"type": "fixed_window", "limit": 100, "window": "1m"}]},
              {"name": "http", "match": {"path_prefix": "/"}, "limits": [{"type": "fixed_window", "limit": 1, "window": "1s"}]}]}"#,
        )
        .expect("values");
        let get = |name: &str| v.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str()).expect(name);
        assert_eq!(get("DOMAIN"), "\"edge\"");
        let matchers: Value = serde_json::from_str(get("BUCKET_MATCHERS")).expect("json");
        let one = &matchers[0];
        let settings = &one["on_match"]["action"]["typed_config"];
        assert_eq!(
            settings["bucket_id_builder"]["bucket_id_builder"]["name"],
            json!({"string_value": "api"})
        );
        assert_eq!(
            settings["bucket_id_builder"]["bucket_id_builder"]["x-user"]["custom_value"]["typed_config"]
                ["header_name"],
            "x-user"
        );
        assert!(settings["bucket_id_builder"]["bucket_id_builder"].get("gone").is_none());
        assert_eq!(settings["no_assignment_behavior"]["fallback_rate_limit"]["blanket_rule"], "DENY_ALL");
        // One predicate per key, in the keys' order.
        let predicates = &one["predicate"]["and_matcher"]["predicate"];
        let header = |p: &Value| p["single_predicate"]["input"]["typed_config"]["header_name"].clone();
        assert_eq!(header(&predicates[0]["not_matcher"]), "gone", "gone must be absent");
        assert_eq!(header(&predicates[1]), "name");
        assert_eq!(predicates[1]["single_predicate"]["value_match"], json!({"exact": "api"}));
        assert_eq!(header(&predicates[2]), "x-user");
        assert_eq!(
            predicates[2]["single_predicate"]["value_match"],
            json!({"safe_regex": {"google_re2": {}, "regex": ".*"}})
        );
        assert_eq!(matchers.as_array().map(Vec::len), Some(1), "the HTTP policy has no bucket");
    }

    /// Regression: a policy whose bucket keys are all `equals` was rendered
    /// as a matcher of every request (the constants built its id), so a
    /// request with no header, or another tenant's, was charged to it.
    /// Each `equals` is now the request header's exact value.
    #[test]
    fn an_equals_key_is_matched_on_the_request() {
        let v = values(
            r#"{"policies": [
              {"name": "internal", "unlimited": true, "match": {"domain": "edge", "bucket": {"tier": {"equals": "internal"}}}},
              {"name": "per-client", "match": {"domain": "edge", "bucket": {"client": {"present": true}}},
               "key": ["bucket:client"], "leased": {"tokens": 10, "ttl": "5s"}, "limits": [{"type": "fixed_window", "limit": 100, "window": "1m"}]}]}"#,
        )
        .expect("values");
        let matchers: Value = serde_json::from_str(&v[1].1).expect("json");
        let internal = &matchers[0]["predicate"]["single_predicate"];
        assert_eq!(internal["input"]["typed_config"]["header_name"], "tier");
        assert_eq!(internal["value_match"], json!({"exact": "internal"}));
        assert_eq!(
            matchers[0]["on_match"]["action"]["typed_config"]["bucket_id_builder"]["bucket_id_builder"]
                ["tier"],
            json!({"string_value": "internal"})
        );
        assert_eq!(
            matchers[1]["predicate"]["single_predicate"]["input"]["typed_config"]["header_name"],
            "client"
        );
    }

    /// An earlier policy that requires a key absent would govern the ids a
    /// later one builds without that key, whatever the request held: refused.
    #[test]
    fn an_earlier_absent_key_that_claims_later_ids_is_refused() {
        let doc = |second: &str| {
            format!(
                r#"{{"policies": [
                  {{"name": "guests", "unlimited": true, "match": {{"bucket": {{"x-user": {{"present": false}}, "x-app": {{"present": true}}}}}}}},
                  {{"name": "users", "match": {{"bucket": {{{second}}}}}, "key": ["bucket:x-app"],
                   "leased": {{"tokens": 10, "ttl": "5s"}}, "limits": [{{"type": "fixed_window", "limit": 100, "window": "1m"}}]}}]}}"#
            )
        };
        let err = values(&doc(r#""x-app": {"present": true}"#)).expect_err("refused");
        assert!(err.to_string().contains(r#"policy guests requires bucket key "x-user" absent"#), "{err}");
        values(&doc(r#""x-app": {"present": true}, "x-user": {"present": true}"#))
            .expect("the later reads it");
    }

    #[test]
    fn no_rlqs_policy_is_refused() {
        let rls = r#"{"policies": [{"name": "a", "match": {"domain": "x"}, "unlimited": true}]}"#;
        assert!(values(rls).unwrap_err().to_string().contains("no RLQS-face policy"));
    }
}
