//! Matching and key building, which the filter runs for every request, over
//! documents of 1, 10 and 100 policies. Run with
//! `cargo bench -p sluice-policies --bench evaluate`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use sluice_policies::request::SimpleRequest;
use sluice_policies::{parse, Document};

/// `n` policies, each on its own path prefix with a method list, a header
/// condition and a two-part key; the last one matches the request.
fn document(n: usize) -> Document {
    let policies: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"name": "p{i}", "match": {{"path_prefix": "/svc{i}/", "methods": ["GET", "POST"],
                    "headers": {{"x-tier": {{"prefix": "fr"}}}}}},
                    "key": ["header:x-api-key", "method"],
                    "limits": [{{"type": "sliding_window", "limit": 25, "window": "5s"}}]}}"#
            )
        })
        .collect();
    parse(&format!(r#"{{"policies": [{}]}}"#, policies.join(","))).expect("valid document")
}

fn evaluate(c: &mut Criterion) {
    let mut group = c.benchmark_group("match_and_key");
    for n in [1, 10, 100] {
        let doc = document(n);
        let req = SimpleRequest::new("GET", &format!("/svc{}/orders?page=2", n - 1))
            .header("x-api-key", "acct-123456")
            .header("x-tier", "free")
            .header("user-agent", "bench");
        assert_eq!(doc.evaluate(&req).map(|a| a.len()), Ok(1));
        group.bench_with_input(BenchmarkId::from_parameter(n), &req, |b, req| {
            b.iter(|| std::hint::black_box(doc.evaluate(req)))
        });
    }
    group.finish();
}

criterion_group!(benches, evaluate);
criterion_main!(benches);
