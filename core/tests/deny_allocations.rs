//! What one request refused from the over-limit cache allocates, counted by
//! a counting global allocator around the flow's callbacks (this test
//! binary's allocator; the filter's is the same code in wasm), with the
//! effects given back to the worker once performed, as the filter does.
//! The deny path's goal is none per request; the count is printed
//! (`--nocapture`), quoted in `docs/performance.md` ("The deny path"), and
//! held here so it cannot grow unnoticed.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::stats::PolicyStat;
use sluice_policies::wire::CHECK_PATH;
use support::*;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn counted<T>(f: impl FnOnce() -> T) -> (T, u64, u64) {
    let (a, b) = (ALLOCATIONS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed));
    let out = f();
    (out, ALLOCATIONS.load(Ordering::Relaxed) - a, BYTES.load(Ordering::Relaxed) - b)
}

/// The most allocations one cached denial may make, stream to end: the
/// request's key and the list of the policies that apply, which the
/// policies crate's evaluation returns owned (docs/performance.md, "The
/// deny path").
const AT_MOST: u64 = 2;

/// A request refused from the over-limit cache, stream created to its end:
/// the allocations of each callback, printed, and their sum held to
/// [`AT_MOST`]. One policy keyed by a header, like the bench's and the
/// wasm host's cached denial.
#[test]
fn a_cached_denial_allocates_at_most_its_count() {
    let t = Test::new(
        r#"{"policies": [{"name": "a", "key": ["header:x-api-key"],
            "limits": [{"type": "fixed_window", "limit": 1, "window": "1h"}]}]}"#,
    );
    let req = get("/api/").header("x-api-key", "acct-123456");
    let mut first = t.stream();
    let check = sent(&first.request(&req), CHECK_PATH);
    first.answer(&check, &Shim::deny_check(0, 1, 3_600_000));
    drop(first);
    // Warm: one refused request first, so lazily built state is not
    // counted; its effects performed and given back, as the filter does.
    let mut warm = t.stream();
    t.worker.recycle(warm.request(&req));
    t.worker.recycle(warm.end());
    drop(warm);

    let (mut s, created, created_bytes) = counted(|| t.stream());
    let (fx, request, request_bytes) = counted(|| s.request(&req));
    assert_eq!(replied(&fx).map(|r| r.status), Some(429), "refused from the cache");
    assert!(sends(&fx).is_empty(), "no call");
    assert_eq!(count(&fx, 0, PolicyStat::CacheDenied), 1);
    let ((), effects, effects_bytes) = counted(|| t.worker.recycle(fx));
    let (end_fx, end, end_bytes) = counted(|| s.end());
    let ((), dropped, dropped_bytes) = counted(|| {
        t.worker.recycle(end_fx);
        drop(s);
    });
    let total = created + request + effects + end + dropped;
    println!("| callback | allocations | bytes |");
    println!("|---|---:|---:|");
    println!("| stream created | {created} | {created_bytes} |");
    println!("| request headers: match, key, cache, the denial | {request} | {request_bytes} |");
    println!("| the effects performed and given back | {effects} | {effects_bytes} |");
    println!("| stream end | {end} | {end_bytes} |");
    println!("| stream dropped | {dropped} | {dropped_bytes} |");
    println!("| **total** | **{total}** | |");
    assert!(total <= AT_MOST, "a cached denial allocated {total} times, more than {AT_MOST}");
}
