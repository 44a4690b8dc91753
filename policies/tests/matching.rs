//! Which policies apply to a request, and the key each one derives.

use std::collections::HashMap;

use sluice_policies::wire::WireLimit;
use sluice_policies::{parse, Document, Request};

struct Req {
    path: &'static str,
    method: &'static str,
    headers: HashMap<&'static str, &'static [u8]>,
}

impl Request for Req {
    fn path(&self) -> &[u8] {
        self.path.as_bytes()
    }
    fn method(&self) -> &[u8] {
        self.method.as_bytes()
    }
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.headers.get(name).map(|v| v.to_vec())
    }
}

fn req(method: &'static str, path: &'static str, headers: &[(&'static str, &'static [u8])]) -> Req {
    Req { path, method, headers: headers.iter().copied().collect() }
}

fn doc() -> Document {
    parse(
        r#"{"policies": [
            {"name": "partner", "match": {"path_prefix": "/v42/", "methods": ["GET", "POST"]},
             "key": ["header:X-Api-Key"],
             "limits": [{"type": "sliding_window", "limit": 25, "window": "5s"},
                        {"type": "sliding_window", "limit": 300, "window": "1m"}]},
            {"name": "global", "limits": [{"type": "sliding_window", "limit": 1000, "window": "1s"}]}
        ]}"#,
    )
    .expect("valid document")
}

fn applied(doc: &Document, r: &Req) -> Vec<(String, String)> {
    doc.checks(r).into_iter().map(|c| (c.policy, c.key)).collect()
}

/// Path prefix and method must both hold; a policy without `match` applies to all.
#[test]
fn every_matching_policy_applies() {
    let doc = doc();
    let key = [("x-api-key", &b"alice"[..])];
    assert_eq!(
        applied(&doc, &req("GET", "/v42/orders?page=2", &key)),
        [("partner".into(), "alice".into()), ("global".into(), String::new())]
    );
    assert_eq!(applied(&doc, &req("DELETE", "/v42/orders", &key)), [("global".into(), String::new())]);
    assert_eq!(applied(&doc, &req("GET", "/v41/orders", &key)), [("global".into(), String::new())]);
    assert_eq!(applied(&doc, &req("GET", "/v42", &key)), [("global".into(), String::new())]);
}

/// The limits travel to the shim in milliseconds, in document order.
#[test]
fn checks_carry_the_limits() {
    let checks = doc().checks(&req("POST", "/v42/x", &[("x-api-key", b"k")]));
    assert_eq!(
        checks[0].limits,
        [
            WireLimit::SlidingWindow { limit: 25, window_ms: 5_000 },
            WireLimit::SlidingWindow { limit: 300, window_ms: 60_000 }
        ]
    );
}

/// Without the key header a request is counted in one shared bucket, so
/// leaving the header out cannot escape the limit.
#[test]
fn missing_key_shares_one_bucket() {
    let doc = doc();
    let checks = doc.checks(&req("GET", "/v42/x", &[]));
    assert_eq!(checks[0].key, "!");
}

/// Key values are encoded, so Redis key syntax in a header stays inert.
#[test]
fn hostile_key_values_are_encoded() {
    let doc = doc();
    let checks = doc.checks(&req("GET", "/v42/x", &[("x-api-key", b"{other}:tenant")]));
    assert_eq!(checks[0].key, "%7Bother%7D%3Atenant");
}
