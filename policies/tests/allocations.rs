//! Matching and key building allocate nothing beyond the result: the list of
//! applied policies and each key. Counted with a counting allocator, per
//! thread so that tests running in parallel do not disturb each other.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use sluice_policies::parse;
use sluice_policies::request::SimpleRequest;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATIONS.with(Cell::get);
    let out = f();
    (out, ALLOCATIONS.with(Cell::get) - before)
}

/// With 100 policies of path, method, header and query conditions, a request
/// that one of them applies to costs two allocations: the list and the key.
#[test]
fn evaluating_100_policies_allocates_only_the_result() {
    let policies: Vec<String> = (0..100)
        .map(|i| {
            format!(
                r#"{{"name": "p{i}", "match": {{"path_prefix": "/svc{i}/", "methods": ["GET"],
                    "headers": {{"x-tier": {{"equals": "free"}}}}, "query": {{"page": {{"present": true}}}}}},
                    "key": ["header:x-api-key", "method", "path"],
                    "limits": [{{"type": "sliding_window", "limit": 25, "window": "5s"}}]}}"#
            )
        })
        .collect();
    let doc = parse(&format!(r#"{{"policies": [{}]}}"#, policies.join(","))).expect("valid document");
    let req = SimpleRequest::new("GET", "/svc99/orders?page=2")
        .header("x-api-key", "acct")
        .header("x-tier", "free");
    let (applied, count) = allocations_during(|| doc.evaluate(&req));
    let applied = applied.expect("no missing key");
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].key, "acct:GET:%2Fsvc99%2Forders");
    assert_eq!(count, 2, "allocations while evaluating");
}
