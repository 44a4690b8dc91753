//! One request through every face gets one plan: the filter's `Flow`, the
//! RLS face, the RLQS face, `sluice simulate` and the playground's replay
//! each send (or replay) the checks that `sluice_policies::plan` makes of
//! the request, and no others. The same user, `ann`, reaches each face in
//! that face's form: an HTTP request (the filter, a log line, generated
//! traffic), an RLS descriptor, an RLQS bucket; each face has its policy.

use std::rc::Rc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice_core::testing::FakeHost;
use sluice_core::{Effect, Flow, Now, Worker};
use sluice_policies::plan::{plan, plan_evaluated, Descriptor, Plan};
use sluice_policies::request::SimpleRequest;
use sluice_policies::rlqs::{govern, Governed};
use sluice_policies::wire::{Check, CheckRequest, Encoding, CHECK_PATH};
use sluice_policies::Document;
use sluice_shim::grpc::{rlqs, rls};

const DOCUMENT: &str = r#"{"policies": [
  {"name": "web", "key": ["header:x-user"], "limits": [{"type": "fixed_window", "limit": 5, "window": "1m"}]},
  {"name": "web-trial", "shadow": true, "key": ["header:x-user"],
   "limits": [{"type": "fixed_window", "limit": 1, "window": "1m"}]},
  {"name": "rls", "match": {"domain": "edge", "entries": {"user": {"present": true}}}, "key": ["entry:user"],
   "limits": [{"type": "fixed_window", "limit": 5, "window": "1m"}]},
  {"name": "rlqs", "match": {"domain": "edge", "bucket": {"user": {"present": true}}}, "key": ["bucket:user"],
   "leased": {"tokens": 2, "ttl": "5s"}, "limits": [{"type": "fixed_window", "limit": 5, "window": "1m"}]}
]}"#;

/// 2026-11-23T10:00:00Z in milliseconds.
const T0: u64 = 1_795_428_000_000;

fn document() -> Document {
    sluice_policies::parse(DOCUMENT).unwrap_or_else(|e| panic!("{e}"))
}

fn http_request() -> SimpleRequest {
    SimpleRequest::new("GET", "/orders").header("x-user", "ann")
}

/// The plan of one HTTP request: its own costs, as the filter charges them.
fn http_plan(doc: &Document) -> Plan<'_> {
    let request = http_request();
    let evaluation = doc.evaluate(&request);
    plan_evaluated(doc, [(&request, None, &evaluation)]).expect("plans")
}

/// Each check as (policy, key).
fn named(checks: &[Check]) -> Vec<(String, String)> {
    checks.iter().map(|c| (c.policy.clone(), c.key.clone())).collect()
}

#[test]
fn one_request_through_every_face_gets_one_plan() {
    let doc = document();
    let planned = http_plan(&doc);
    let enforced = named(&planned.enforced.checks);
    let shadow = named(&planned.shadow.checks);
    assert_eq!(enforced, [("web".to_string(), "ann".to_string())]);
    assert_eq!(shadow, [("web-trial".to_string(), "ann".to_string())]);

    // The filter's Flow: the checks of its calls to the shim are the plan's.
    let host = FakeHost::at(T0);
    let mut flow = Flow::new(Rc::new(Worker::new(document(), T0, 7)));
    let mut sent: Vec<Check> = Vec::new();
    for effect in flow.handle_request_headers(&Now::at(T0), &http_request(), &host) {
        if let Effect::Send(call) = effect {
            if call.path == CHECK_PATH {
                let req: CheckRequest = Encoding::Binary.decode(&call.body).expect("a check");
                sent.extend(req.checks.iter().cloned());
            }
        }
    }
    let mut planned_checks: Vec<Check> =
        planned.enforced.checks.iter().chain(&planned.shadow.checks).cloned().collect();
    let by_name = |a: &Check, b: &Check| a.policy.cmp(&b.policy);
    sent.sort_by(by_name);
    planned_checks.sort_by(by_name);
    assert_eq!(sent, planned_checks, "the filter sends the plan's checks");

    // The RLS face: a descriptor decoded and planned.
    let rls_req = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry { key: "user".into(), value: "ann".into() }],
            ..RateLimitDescriptor::default()
        }],
        ..RateLimitRequest::default()
    };
    let descriptors = rls::decode(&rls_req).expect("a valid request");
    let rls_plan = rls::plan(&doc, &descriptors).expect("plans");
    let request = SimpleRequest::default().domain("edge").index(0).entry("user", "ann");
    let expected = plan(&doc, &[Descriptor { request, hits: 1 }]).expect("plans");
    assert_eq!(rls_plan.enforced.checks, expected.enforced.checks);
    assert_eq!(named(&rls_plan.enforced.checks), [("rls".to_string(), "ann".to_string())]);

    // The RLQS face: the bucket is governed by its plan's check.
    let bucket = rlqs::bucket_request("edge", &vec![("user".to_string(), "ann".to_string())]);
    let evaluation = doc.evaluate(&bucket);
    let rlqs_plan = plan_evaluated(&doc, [(&bucket, None, &evaluation)]).expect("plans");
    let check = &rlqs_plan.enforced.checks[0];
    match govern(&doc, &bucket).0 {
        Governed::Leased(window) => {
            assert_eq!((window.policy.as_str(), window.key.as_str()), ("rlqs", "ann"));
            assert_eq!((&window.key, window.limit), (&check.key, check.limits[0]));
        }
        other => panic!("the bucket is leased from its plan's check, got {other:?}"),
    }

    // The playground: generated traffic replayed, the enforced checks the plan's.
    let pattern =
        r#"{"streams": [{"path": "/orders", "headers": {"x-user": "ann"}, "burst": 1, "at": "1s"}]}"#;
    let ran: serde_json::Value =
        serde_json::from_str(&sluice_playground::run(DOCUMENT, pattern)).expect("JSON");
    assert_eq!(ran["events"][0]["decision"], "admitted", "{ran:#}");
    let replayed: Vec<(String, String)> = (ran["events"][0]["policies"].as_array().into_iter().flatten())
        .map(|p| {
            (p["policy"].as_str().unwrap_or("").to_string(), p["key"].as_str().unwrap_or("").to_string())
        })
        .collect();
    assert_eq!(replayed, enforced, "{ran:#}");

    // `sluice simulate`: a log line of the request, and each policy of its
    // plan charged once on its key.
    let dir = sluice_harness::scratch_dir("one-plan").expect("scratch dir");
    let (policy, log) = (dir.join("policy.json"), dir.join("access.log"));
    std::fs::write(&policy, DOCUMENT).expect("writing");
    let line =
        format!(r#"{{"time_ms": {T0}, "method": "GET", "path": "/orders", "headers": {{"x-user": "ann"}}}}"#);
    std::fs::write(&log, format!("{line}\n")).expect("writing");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["simulate", "--format", "json", "--policy"])
        .args([&policy, &log])
        .output()
        .expect("running sluice");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let reports = report.as_array().cloned().unwrap_or_default();
    let keyed: Vec<(String, String)> = reports
        .iter()
        .filter(|r| r["matched"] == 1)
        .filter_map(|r| {
            let key = r["busiest_keys"][0][0].as_str()?;
            Some((r["policy"].as_str()?.to_string(), key.to_string()))
        })
        .collect();
    let all: Vec<(String, String)> = enforced.iter().chain(&shadow).cloned().collect();
    assert_eq!(keyed, all, "{report:#}");
}
