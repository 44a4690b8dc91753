//! The fuzz targets' logic: each function takes libFuzzer's bytes, drives
//! one part of Sluice that reads untrusted input, and panics only where a
//! stated property breaks. `fuzz_targets/*.rs` are one-line wrappers, so a
//! crash found here is replayed as a plain test in the crate it concerns.
//!
//! - [`parse`]: the policy document parser (operators' input).
//! - [`wire`]: the shim's request bodies (the filter's, or an attacker's).
//! - [`evaluate`]: conditions, key sources and header handling over
//!   arbitrary requests (clients' input), against every example document.
//! - [`key`]: key encoding: whatever the bytes, the key is safe to name a
//!   Redis key with.
//! - [`answer`]: the filter reading the shim's answers, and the over-limit
//!   cache and leased mode's pool reading shared data.
//! - [`rls`]: the RLS face's decoder: a `RateLimitRequest` (Envoy's, or an
//!   attacker's protobuf) as descriptors, evaluated and planned against a
//!   document of gRPC-face policies, and answered.
//! - [`rlqs`]: the RLQS face's decoder: a `RateLimitQuotaUsageReports` as
//!   bucket reports, governed by a document of RLQS-face policies and
//!   driven through the stream's machine to its lease calls and assignments.

use std::cell::RefCell;
use std::collections::HashMap;

use arbitrary::{Arbitrary, Unstructured};
use sluice_core::cache::OverLimitCache;
use sluice_core::decision::{read_answer, retry_after_secs};
use sluice_core::host::{SetError, SharedData};
use sluice_policies::algorithm::Algorithm;
use sluice_policies::key;
use sluice_policies::request::SimpleRequest;
use sluice_policies::units::Millis;
use sluice_policies::wire::{
    AdjustRequest, Check, CheckRequest, CheckResponse, Encoding, ReleaseRequest, ReleaseResponse, WireLimit,
};
use sluice_policies::Document;

/// The example documents, the policies the other targets run requests through.
const EXAMPLES: &[&str] = &[
    include_str!("../../policies/examples/demo.json"),
    include_str!("../../policies/examples/erp-concurrency.json"),
    include_str!("../../policies/examples/fixed-windows.json"),
    include_str!("../../policies/examples/leaky-bucket.json"),
    include_str!("../../policies/examples/one-call-per-second.json"),
    include_str!("../../policies/examples/partner-api.json"),
    include_str!("../../policies/examples/public-api-by-ip.json"),
    include_str!("../../policies/examples/query-cost-points.json"),
    include_str!("../../policies/examples/token-bucket-per-user.json"),
];

fn examples() -> Vec<Document> {
    EXAMPLES.iter().map(|text| sluice_policies::parse(text).expect("the examples are valid")).collect()
}

/// A document that parses yields only checks the shim accepts.
pub fn parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match sluice_policies::parse(text) {
        Ok(doc) => {
            let req = SimpleRequest::new("GET", "/").header("x-api-key", "k");
            if let Ok(applied) = doc.evaluate(&req) {
                for a in applied.iter() {
                    shim_accepts(&a.check(&req));
                }
            }
        }
        Err(err) => assert!(!err.to_string().is_empty(), "an error with no message"),
    }
}

/// Every request body the shim reads parses or fails cleanly, and every
/// limit that validates has an algorithm and a key suffix.
pub fn wire(data: &[u8]) {
    if let Ok(req) = serde_json::from_slice::<CheckRequest>(data) {
        for check in req.checks.iter() {
            for limit in &check.limits {
                if limit.validate().is_ok() {
                    let algorithm = Algorithm::of(limit);
                    let _ = (algorithm.state_suffix(), algorithm.script_args(0));
                }
            }
        }
    }
    // The check and its answer in the binary wire, as the filter and the shim read them.
    if let Ok(req) = Encoding::Binary.decode::<CheckRequest>(data) {
        for limit in req.checks.iter().flat_map(|c| &c.limits) {
            if limit.validate().is_ok() {
                let _ = Algorithm::of(limit).script_args(0);
            }
        }
    }
    let _ = Encoding::Binary.decode::<CheckResponse>(data);
    let _ = serde_json::from_slice::<ReleaseRequest>(data);
    let _ = serde_json::from_slice::<AdjustRequest>(data);
    let _ = serde_json::from_slice::<CheckResponse>(data);
    let _ = serde_json::from_slice::<ReleaseResponse>(data);
    if let Ok(req) = serde_json::from_slice::<sluice_policies::wire::LeaseRequest>(data) {
        if req.validate().is_ok() {
            let algorithm = Algorithm::of(&req.limit);
            let _ = (algorithm.state_suffix(), algorithm.script_args(0));
        }
    }
    let _ = serde_json::from_slice::<sluice_policies::wire::LeaseResponse>(data);
}

/// A request as a client could send it.
#[derive(Debug, Arbitrary)]
struct FuzzRequest {
    document: u8,
    method: String,
    path: Vec<u8>,
    authority: Vec<u8>,
    /// Values for headers the examples read, and any others.
    headers: Vec<(HeaderName, Vec<u8>)>,
    source: Option<Vec<u8>>,
}

#[derive(Debug, Arbitrary)]
enum HeaderName {
    ApiKey,
    Account,
    User,
    Tenant,
    Cost,
    ForwardedFor,
    Other(String),
}

impl HeaderName {
    fn as_str(&self) -> &str {
        match self {
            HeaderName::ApiKey => "x-api-key",
            HeaderName::Account => "x-account",
            HeaderName::User => "x-user",
            HeaderName::Tenant => "x-tenant",
            HeaderName::Cost => "x-cost",
            HeaderName::ForwardedFor => "x-forwarded-for",
            HeaderName::Other(name) => name,
        }
    }
}

/// Whatever the request, matching does not panic, and every check it yields
/// has an encoded key and limits the shim accepts.
pub fn evaluate(data: &[u8]) {
    thread_local! {
        static DOCS: Vec<Document> = examples();
    }
    let Ok(fuzz) = FuzzRequest::arbitrary(&mut Unstructured::new(data)) else { return };
    let mut req = SimpleRequest::new(&fuzz.method, "");
    req.path = fuzz.path;
    req.authority = fuzz.authority;
    req.source_address = fuzz.source;
    for (name, value) in &fuzz.headers {
        req = req.header(name.as_str(), value);
    }
    DOCS.with(|docs| {
        let doc = &docs[usize::from(fuzz.document) % docs.len()];
        if let Ok(applied) = doc.evaluate(&req) {
            for a in applied.iter() {
                shim_accepts(&a.check(&req));
            }
        }
    });
}

/// Every key is safe in a Redis key name: encoded, so no `{`, `}` or space
/// can move its hash slot or collide with another tenant's key.
pub fn key(data: &[u8]) {
    let encoded = key::encode(data);
    assert!(key::is_encoded(&encoded), "encode({data:?}) = {encoded:?} is not an encoded key");
    assert!(!encoded.contains(['{', '}', ' ']), "{encoded:?} holds key syntax");
}

/// The shim's answer, any status and body, is read without panicking, and
/// an accepted answer has one outcome per limit asked. The over-limit cache
/// reads whatever shared data holds without panicking.
pub fn answer(data: &[u8]) {
    let checks = [
        Check {
            policy: "a".into(),
            key: "k".into(),
            limits: vec![WireLimit::SlidingWindow { limit: 1, window_ms: Millis(1000), approximate: false }],
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        },
        Check {
            policy: "b".into(),
            key: "k".into(),
            limits: vec![WireLimit::Interval { every_ms: Millis(10) }],
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        },
    ];
    // The first byte: 0, a 200 in JSON; 1, a 200 in the binary wire; else
    // a status from the next three bytes.
    let (status, encoding, body): (&[u8], _, &[u8]) = match data.split_first() {
        Some((0, rest)) => (b"200", Encoding::Json, rest),
        Some((1, rest)) => (b"200", Encoding::Binary, rest),
        Some((_, rest)) => (rest.get(..3).unwrap_or(rest), Encoding::Json, rest),
        None => (b"200", Encoding::Json, data),
    };
    if let Ok(resp) = read_answer(encoding, Some(status), Some(body), &checks) {
        assert_eq!(resp.checks.len(), checks.len());
        let _ = retry_after_secs(resp.retry_after_ms);
        let _ = resp.denied_check();
    }
    thread_local! {
        static DOC: Document = sluice_policies::parse(
            r#"{"policies": [{"name": "a", "limits": [{"type": "sliding_window", "limit": 1, "window": "1s"}]},
                             {"name": "b", "limits": [{"type": "interval", "every": "10ms"}]}]}"#,
        )
        .expect("valid");
    }
    lease_pool(data);
    let cache = OverLimitCache::new(Bytes(RefCell::new(HashMap::new()), data.to_vec()), 16);
    let now = u64::from_le_bytes(data.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
    DOC.with(|doc| {
        for (policy, check) in doc.policies.iter().zip(&checks) {
            let _ = cache.lookup(policy, check, now);
        }
    });
}

/// Leased mode's pool as any bytes in shared data make it: what decodes
/// encodes back to itself, and its rules never panic on it.
fn lease_pool(data: &[u8]) {
    use sluice_core::leased::{Pool, Token};
    let Some(mut pool) = Pool::decode(data) else { return };
    assert_eq!(Pool::decode(&pool.encode()), Some(pool));
    let lease = sluice_policies::leased::Leased::new(10, 1_000).expect("valid");
    let now = pool.demand_ms ^ pool.ends_ms;
    let token = pool.spend(now);
    pool.unspend(token.unwrap_or(Token { window: pool.window }), now);
    let _ = pool.tick(lease, now);
    let answer = sluice_policies::wire::LeaseResponse {
        granted: u32::try_from(pool.tokens % 1_000).unwrap_or(0),
        window: pool.window,
        expires_in_ms: Millis(pool.expires_ms),
        remaining: 0,
    };
    pool.granted(lease, pool.asking_ms, now, answer);
    pool.failed(now);
}

/// Shared data in which every key holds the fuzzer's bytes (until written).
struct Bytes(RefCell<HashMap<String, Vec<u8>>>, Vec<u8>);

impl SharedData for Bytes {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        (Some(self.0.borrow().get(key).cloned().unwrap_or_else(|| self.1.clone())), None)
    }
    fn set(&self, key: &str, value: &[u8], _cas: Option<u32>) -> Result<(), SetError> {
        self.0.borrow_mut().insert(key.to_string(), value.to_vec());
        Ok(())
    }
}

/// What the shim's `keys` module checks of a check the filter sends.
fn shim_accepts(check: &Check) {
    assert!(key::is_encoded(&check.key), "the filter built an unencoded key {:?}", check.key);
    for limit in &check.limits {
        assert_eq!(limit.validate(), Ok(()), "the filter sent a limit the shim refuses: {limit:?}");
    }
}

/// gRPC-face policies for [`rls`]: every limit kind the face takes, keys
/// from entries, shadow and unlimited.
const RLS_DOCUMENT: &str = r#"{"headers": "always", "policies": [
  {"name": "a", "match": {"domain": "edge", "entries": {"k": {"present": true}}}, "key": ["entry:k"],
   "limits": [{"type": "fixed_window", "limit": 2, "window": "1m"}, {"type": "interval", "every": "1s"}]},
  {"name": "b", "match": {"entries": {"p": {"prefix": "x"}}}, "key": ["entry:p", "entry:q"], "on_missing_key": "deny",
   "limits": [{"type": "points", "capacity": 10, "refill": "1m", "cost": 1}]},
  {"name": "c", "shadow": true, "match": {"domain": "edge"}, "limits": [{"type": "token_bucket", "rate": 1, "per": "1s", "burst": 2}]},
  {"name": "d", "unlimited": true, "match": {"domain": "edge", "entries": {"u": {"equals": "1"}}}},
  {"name": "t", "match": {"domain": "edge", "descriptor_tree": [{"key": "t"}, {"key": "v", "value": "a*b"}]},
   "key": ["entry:v"], "limits": [{"type": "fixed_window", "limit": 2, "window": "1m"}]},
  {"name": "z", "blocked": "1m", "match": {"domain": "edge", "descriptor_tree": [{"key": "t", "value": "z"}]}}
]}"#;

/// Any bytes as a `RateLimitRequest`: decoding refuses or yields at most
/// the bounded number of descriptors, each bounded; planning refuses or
/// yields at most the shim's checks; the answer has one status per
/// descriptor and every key is a safe Redis key.
pub fn rls(data: &[u8]) {
    use prost::Message;
    use sluice_shim::grpc::rls::{answer, decode, plan, Outcomes, MAX_DESCRIPTORS, MAX_ENTRIES};
    thread_local! {
        static DOC: Document = sluice_policies::parse(RLS_DOCUMENT).expect("the RLS document");
    }
    let Ok(req) = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest::decode(data) else {
        return;
    };
    let Ok(descriptors) = decode(&req) else { return };
    assert!(!descriptors.is_empty() && descriptors.len() <= MAX_DESCRIPTORS);
    assert!(descriptors.iter().all(|d| d.hits >= 1 && d.request.entries.len() <= MAX_ENTRIES));
    DOC.with(|doc| {
        let Ok(plan) = plan(doc, &descriptors) else { return };
        assert_eq!(plan.descriptors.len(), descriptors.len());
        for checks in [&plan.enforced.checks, &plan.shadow.checks] {
            assert!(checks.len() <= sluice_policies::bounds::MAX_CHECKS);
            assert!(checks.iter().all(|c| key::is_encoded(&c.key)));
        }
        let resp = answer(doc, &plan, Outcomes::default(), 0);
        assert_eq!(resp.statuses.len(), descriptors.len());
    });
}

/// RLQS-face policies for [`rlqs`]: leased windows keyed by the bucket id,
/// a missing key denied, and unlimited.
const RLQS_DOCUMENT: &str = r#"{"policies": [
  {"name": "a", "match": {"domain": "edge", "bucket": {"k": {"present": true}}}, "key": ["bucket:k"],
   "leased": {"tokens": 5, "ttl": "2s"}, "limits": [{"type": "fixed_window", "limit": 20, "window": "1m"}]},
  {"name": "b", "match": {"bucket": {"p": {"prefix": "x"}}}, "key": ["bucket:p", "bucket:q"], "on_missing_key": "deny",
   "leased": {"tokens": 3, "ttl": "1s"}, "limits": [{"type": "fixed_window", "limit": 3, "window": "10s"}]},
  {"name": "d", "unlimited": true, "match": {"domain": "edge", "bucket": {"u": {"equals": "1"}}}}
]}"#;

/// Any bytes (a first byte, then the message) as an RLQS usage report, on a
/// stream whose domain is known or not (the first byte's low bit): decoding
/// refuses or yields bounded reports of sorted bucket ids; each governed
/// bucket, driven through the stream's machine for a minute with every
/// lease granted in full, asks only lease calls the shim accepts and gets
/// assignments of at least a second, encoded as one response.
pub fn rlqs(data: &[u8]) {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
    use prost::Message;
    use sluice_core::rlqs::{Action, LeaseResult, Stream, TICK_MS};
    use sluice_policies::rlqs::govern;
    use sluice_policies::wire::LeaseResponse;
    use sluice_shim::grpc::rlqs::{bucket_request, decode, response, MAX_ID_ENTRIES, MAX_REPORTED};
    thread_local! {
        static DOC: Document = sluice_policies::parse(RLQS_DOCUMENT).expect("the RLQS document");
    }
    let Some((&first, rest)) = data.split_first() else { return };
    let Ok(msg) = RateLimitQuotaUsageReports::decode(rest) else { return };
    let Ok(decoded) = decode(&msg, (first & 1 == 1).then_some("edge")) else { return };
    assert!(!decoded.domain.is_empty() && decoded.reports.len() <= MAX_REPORTED);
    for report in &decoded.reports {
        assert!((1..=MAX_ID_ENTRIES).contains(&report.id.len()));
        assert!(report.id.windows(2).all(|pair| pair[0].0 < pair[1].0), "sorted, unique keys");
    }
    DOC.with(|doc| {
        let mut stream = Stream::new(u64::from(first));
        let mut now = 1;
        for report in &decoded.reports {
            let (governed, _) = govern(doc, &bucket_request(&decoded.domain, &report.id));
            stream.handle_report(now, report, governed);
        }
        while now < 60_000 {
            for call in stream.poll_calls() {
                assert_eq!(
                    call.request.validate(),
                    Ok(()),
                    "a lease call the shim refuses: {:?}",
                    call.request
                );
                assert!(key::is_encoded(&call.request.key));
                let granted = LeaseResponse {
                    granted: call.request.want,
                    window: 1,
                    expires_in_ms: Millis(50_000),
                    remaining: 0,
                };
                stream.handle_lease(now, &call.id, call.seq, LeaseResult::Answered(granted));
            }
            let actions = stream.poll_actions();
            for action in &actions {
                if let Action::Assign { ttl_s, .. } = action {
                    assert!(*ttl_s >= 1, "Envoy expires a time to live under a second at once");
                }
            }
            assert_eq!(response(&actions).bucket_action.len(), actions.len());
            now += TICK_MS;
            stream.tick(now);
        }
    });
}
