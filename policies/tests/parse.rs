//! Parsing policy documents: what a valid document becomes.

use sluice_policies::{parse, FailureMode, Limit};

/// The demo document parses into the dual window of scenario S0.
#[test]
fn demo_example_parses() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/demo.json"))
        .expect("examples/demo.json is readable");
    let doc = parse(&text).expect("demo.json is valid");
    assert_eq!(doc.shim.cluster, "sluice_shim");
    assert_eq!(doc.shim.timeout_ms.get(), 50);
    assert_eq!(doc.failure_mode, FailureMode::Allow);
    let policy = &doc.policies[0];
    assert_eq!(policy.name.as_str(), "partner-api");
    let windows: Vec<(u32, u64)> = policy
        .limits
        .iter()
        .map(|l| match l {
            Limit::SlidingWindow { limit, window, approximate: false } => (limit.get(), window.as_millis()),
            other => panic!("unexpected limit {other:?}"),
        })
        .collect();
    assert_eq!(windows, [(25, 5_000), (300, 60_000)]);
}

/// Omitted settings take their documented defaults.
#[test]
fn defaults_apply() {
    let doc = parse(r#"{"policies": [{"name": "p", "limits": [{"type": "sliding_window", "limit": 1, "window": "1s"}]}]}"#)
        .expect("minimal document is valid");
    assert_eq!(doc.shim.cluster, "sluice_shim");
    assert_eq!(doc.shim.timeout_ms.get(), 100);
    assert_eq!(doc.failure_mode, FailureMode::Allow);
    assert!(doc.policies[0].key.is_empty());
}
