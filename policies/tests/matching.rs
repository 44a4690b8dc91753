//! Which policies apply to a request, on which key: `match`, `bypass`, key
//! sources and `on_missing_key`.

use sluice_policies::request::SimpleRequest;
use sluice_policies::units::Millis;
use sluice_policies::wire::WireLimit;
use sluice_policies::{parse, Document};

const LIMIT: &str = r#"[{"type": "sliding_window", "limit": 1, "window": "1s"}]"#;

/// A document with one policy of these extra fields.
fn doc_with(fields: &str) -> Document {
    let text = format!(r#"{{"policies": [{{"name": "p", {fields}, "limits": {LIMIT}}}]}}"#);
    parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn get(path: &str) -> SimpleRequest {
    SimpleRequest::new("GET", path)
}

/// The key the one policy applies on, or `None` if it does not apply.
fn key(doc: &Document, req: &SimpleRequest) -> Option<String> {
    let applied = doc.evaluate(req).expect("no missing-key denial");
    applied.first().map(|a| a.key.clone())
}

fn applies(doc: &Document, req: &SimpleRequest) -> bool {
    key(doc, req).is_some()
}

#[test]
fn path_conditions_ignore_the_query() {
    let prefix = doc_with(r#""match": {"path_prefix": "/v42/"}"#);
    assert!(applies(&prefix, &get("/v42/orders?x=1")));
    assert!(!applies(&prefix, &get("/v42")));
    assert!(!applies(&prefix, &get("/x?/v42/")));

    let exact = doc_with(r#""match": {"path_exact": "/login"}"#);
    assert!(applies(&exact, &get("/login?next=/")));
    assert!(!applies(&exact, &get("/login/")));

    let regex = doc_with(r#""match": {"path_regex": "^/users/[0-9]+/orders$"}"#);
    assert!(applies(&regex, &get("/users/42/orders?page=2")));
    assert!(!applies(&regex, &get("/users/abc/orders")));
}

#[test]
fn methods_host_headers_and_query_must_all_hold() {
    let doc = doc_with(
        r#""match": {"methods": ["POST"], "host": "API.example.com",
                     "headers": {"x-tier": {"equals": "free"}, "authorization": {"prefix": "Bearer "}},
                     "query": {"dry_run": {"present": false}}}"#,
    );
    let good = SimpleRequest::new("POST", "/charge")
        .authority("api.example.com:443")
        .header("x-tier", "free")
        .header("authorization", "Bearer abc");
    assert!(applies(&doc, &good));
    let mut wrong_method = good.clone();
    wrong_method.method = b"GET".to_vec();
    assert!(!applies(&doc, &wrong_method));
    assert!(!applies(&doc, &good.clone().authority("other.example.com")));
    let mut paid = good.clone();
    paid.headers[0].1 = b"paid".to_vec();
    assert!(!applies(&doc, &paid));
    let mut dry = good.clone();
    dry.path = b"/charge?dry_run=1".to_vec();
    assert!(!applies(&doc, &dry));
}

#[test]
fn bypass_exempts_an_admin_header_or_an_allow_listed_key() {
    let doc = doc_with(
        r#""key": ["header:x-api-key"],
           "bypass": [{"headers": {"x-internal": {"present": true}}}, {"keys": ["partner-vip"]}]"#,
    );
    assert!(applies(&doc, &get("/").header("x-api-key", "alice")));
    assert!(!applies(&doc, &get("/").header("x-api-key", "alice").header("x-internal", "1")));
    assert!(!applies(&doc, &get("/").header("x-api-key", "partner-vip")));
}

/// Every policy whose match holds applies, in document order.
#[test]
fn every_matching_policy_applies() {
    let doc = parse(&format!(
        r#"{{"policies": [
            {{"name": "a", "match": {{"path_prefix": "/v42/"}}, "key": ["header:x-api-key"], "limits": {LIMIT}}},
            {{"name": "b", "limits": {LIMIT}}},
            {{"name": "c", "match": {{"methods": ["DELETE"]}}, "limits": {LIMIT}}}
        ]}}"#
    ))
    .expect("valid document");
    let applied = doc.evaluate(&get("/v42/x").header("x-api-key", "k")).expect("applies");
    let names: Vec<(&str, &str)> = applied.iter().map(|a| (a.policy.name.as_str(), a.key.as_str())).collect();
    assert_eq!(names, [("a", "k"), ("b", "")]);
}

#[test]
fn missing_key_is_shared_by_default() {
    let doc = doc_with(r#""key": ["header:x-api-key"]"#);
    assert_eq!(key(&doc, &get("/")).as_deref(), Some("!"));
    let explicit = doc_with(r#""key": ["header:x-api-key"], "on_missing_key": "shared""#);
    assert_eq!(key(&explicit, &get("/")).as_deref(), Some("!"));
}

#[test]
fn missing_key_can_skip_the_policy() {
    let doc = doc_with(r#""key": ["header:x-api-key"], "on_missing_key": "skip""#);
    assert_eq!(key(&doc, &get("/")), None);
    assert_eq!(key(&doc, &get("/").header("x-api-key", "k")).as_deref(), Some("k"));
}

#[test]
fn missing_key_can_deny_the_request() {
    let doc = doc_with(r#""key": ["query:tenant"], "on_missing_key": "deny""#);
    let denied = doc.evaluate(&get("/"));
    assert_eq!(denied.map_err(|p| p.name.as_str()).err(), Some("p"));
    assert_eq!(key(&doc, &get("/?tenant=t1")).as_deref(), Some("t1"));
}

/// Regression (issue item 4, a shadow policy could refuse real traffic): a
/// shadow policy with `on_missing_key: deny` never refuses a request that
/// lacks its key; it is reported as a would-deny, and the enforced policies
/// still apply. Before, `evaluate` returned the shadow policy as the refusal
/// and the filter answered 400.
#[test]
fn a_shadow_policy_missing_key_is_a_would_deny_not_a_refusal() {
    let text = format!(
        r#"{{"policies": [
            {{"name": "enforced", "limits": {LIMIT}}},
            {{"name": "trial", "shadow": true, "key": ["header:x-api-key"], "on_missing_key": "deny", "limits": {LIMIT}}}
        ]}}"#
    );
    let doc = parse(&text).expect("valid document");
    let evaluation = doc.evaluate(&get("/")).expect("a shadow policy never refuses");
    assert_eq!(evaluation.applied.iter().map(|a| a.policy.name.as_str()).collect::<Vec<_>>(), ["enforced"]);
    assert_eq!(evaluation.shadow_missing_key, [1]);
    let with_key = doc.evaluate(&get("/").header("x-api-key", "k")).expect("applies");
    assert_eq!(with_key.len(), 2);
    assert!(with_key.shadow_missing_key.is_empty());
}

/// Without `wait`, a check carries no margin (the shim decides at once, as before).
#[test]
fn a_policy_without_wait_sends_no_margin() {
    let doc = doc_with(r#""key": []"#);
    assert_eq!(doc.policies[0].wait, None);
    assert_eq!(doc.evaluate(&get("/")).expect("applies")[0].check(&get("/")).margin_ms, None);
    let waits = doc_with(r#""wait": {"timeout": "2s"}"#);
    let check = waits.evaluate(&get("/")).expect("applies")[0].check(&get("/"));
    assert_eq!(check.margin_ms, Some(Millis(sluice_policies::wait::DEFAULT_MARGIN_MS)));
}

#[test]
fn client_ip_honours_trusted_hops() {
    let text =
        format!(r#"{{"trusted_hops": 1, "policies": [{{"name": "p", "key": ["ip"], "limits": {LIMIT}}}]}}"#);
    let doc = parse(&text).expect("valid document");
    let req = get("/").source("10.0.0.9:1234").header("x-forwarded-for", "198.51.100.7, 203.0.113.5");
    assert_eq!(key(&doc, &req).as_deref(), Some("203.0.113.5"));
    let direct = doc_with(r#""key": ["ip"]"#);
    assert_eq!(key(&direct, &req).as_deref(), Some("10.0.0.9"));
}

/// Hostile key values are encoded, so Redis key syntax in a header stays inert.
#[test]
fn hostile_key_values_are_encoded() {
    let doc = doc_with(r#""key": ["header:x-api-key", "method"]"#);
    assert_eq!(key(&doc, &get("/").header("x-api-key", "{other}:t")).as_deref(), Some("%7Bother%7D%3At:GET"));
}

/// The limits travel to the shim in milliseconds, with a points cost read
/// from its header, or the default when the header is absent or not a number.
#[test]
fn checks_carry_the_limits_and_the_request_cost() {
    let doc = parse(
        r#"{"policies": [{"name": "p", "limits": [
            {"type": "sliding_window", "limit": 25, "window": "5s"},
            {"type": "points", "capacity": 1000, "refill": "20s", "cost": {"header": "x-cost", "default": 10}}
        ]}]}"#,
    )
    .expect("valid document");
    let limits = |req: &SimpleRequest| {
        let applied = doc.evaluate(req).expect("applies");
        applied[0].check(req).limits
    };
    let window = WireLimit::SlidingWindow { limit: 25, window_ms: Millis(5_000), approximate: false };
    let points = |cost| WireLimit::Points { capacity: 1000, refill_ms: Millis(20_000), cost };
    assert_eq!(limits(&get("/").header("x-cost", " 42 ")), [window, points(42)]);
    assert_eq!(limits(&get("/")), [window, points(10)]);
    assert_eq!(limits(&get("/").header("x-cost", "lots")), [window, points(10)]);
}

/// A gRPC face's request (with a domain) reaches only gRPC-face policies,
/// and an HTTP request only the others, even a policy that matches everything.
#[test]
fn grpc_face_policies_and_http_policies_never_meet() {
    let grpc = doc_with(r#""match": {"domain": "edge", "entries": {"kind": {"present": false}}}"#);
    let everything = doc_with(r#""match": {}"#);
    let rls = SimpleRequest::default().domain("edge").entry("client", "a");
    assert!(applies(&grpc, &rls));
    assert!(!applies(&grpc, &get("/")), "an HTTP request has no absent entries to match");
    assert!(!applies(&everything, &rls), "an HTTP policy never sees a descriptor");
    assert!(applies(&everything, &get("/")));
}

#[test]
fn domain_and_entries_select_descriptors_and_key_them() {
    let doc = doc_with(
        r#""match": {"domain": "edge", "entries": {"generic_key": {"equals": "api"}, "client": {"prefix": "team-"}}},
           "key": ["entry:client"]"#,
    );
    let rls = |domain: &str, pairs: &[(&str, &str)]| {
        pairs.iter().fold(SimpleRequest::default().domain(domain), |r, (k, v)| r.entry(k, v))
    };
    assert_eq!(
        key(&doc, &rls("edge", &[("generic_key", "api"), ("client", "team-a b")])).as_deref(),
        Some("team-a%20b")
    );
    assert!(!applies(&doc, &rls("other", &[("generic_key", "api"), ("client", "team-a")])));
    assert!(!applies(&doc, &rls("edge", &[("generic_key", "web"), ("client", "team-a")])));
    assert!(!applies(&doc, &rls("edge", &[("generic_key", "api"), ("client", "solo")])));
    assert!(!applies(&doc, &rls("edge", &[("generic_key", "api")])));
}

/// An RLQS bucket (a domain and a bucket id) reaches only RLQS-face
/// policies (a `match` naming `bucket`), keyed by `bucket:NAME`; an RLS
/// descriptor with the same domain and pairs never does, and an RLS-face
/// policy never sees a bucket.
#[test]
fn bucket_ids_select_rlqs_policies_and_key_them() {
    use sluice_policies::rlqs::{govern, Governed};
    let doc = parse(
        r#"{"policies": [
          {"name": "rls", "match": {"domain": "edge", "entries": {"name": {"equals": "api"}}},
           "limits": [{"type": "fixed_window", "limit": 5, "window": "1m"}]},
          {"name": "quota", "match": {"domain": "edge", "bucket": {"name": {"equals": "api"}, "client": {"prefix": "team-"}}},
           "key": ["bucket:client"], "leased": {"tokens": 10, "ttl": "5s"},
           "limits": [{"type": "fixed_window", "limit": 100, "window": "1m"}]},
          {"name": "internal", "unlimited": true, "match": {"domain": "edge", "bucket": {"tier": {"equals": "internal"}}}}
        ]}"#,
    )
    .expect("valid document");
    let bucket = |pairs: &[(&str, &str)]| {
        pairs.iter().fold(SimpleRequest::default().domain("edge"), |r, (k, v)| r.bucket(k, v))
    };
    let names = |req: &SimpleRequest| -> Vec<String> {
        doc.evaluate(req)
            .expect("no missing key")
            .iter()
            .map(|a| a.policy.name.as_str().to_string())
            .collect()
    };
    let team = bucket(&[("name", "api"), ("client", "team-a b")]);
    assert_eq!(names(&team), ["quota"]);
    assert_eq!(key(&doc, &team).as_deref(), Some("team-a%20b"));
    let descriptor = SimpleRequest::default().domain("edge").entry("name", "api").entry("client", "team-a");
    assert_eq!(names(&descriptor), ["rls"], "a descriptor never reaches an RLQS-face policy");
    assert!(names(&bucket(&[("name", "api"), ("client", "solo")])).is_empty());

    match govern(&doc, &team).0 {
        Governed::Leased(window) => {
            assert_eq!((window.policy.as_str(), window.key.as_str()), ("quota", "team-a%20b"));
            assert_eq!((window.limit(), window.ttl_s(), window.lease.tokens()), (100, 5, 10));
        }
        other => panic!("expected a leased window, got {other:?}"),
    }
    assert_eq!(
        govern(&doc, &bucket(&[("tier", "internal")])).0,
        Governed::Unlimited { policy: "internal".into() }
    );
    assert_eq!(govern(&doc, &bucket(&[("name", "web")])).0, Governed::Unmatched);
}
