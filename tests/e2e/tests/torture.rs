//! 64 concurrent clients against one key, through the real shim over HTTP,
//! in real time. Every window and refill period is far longer than the test,
//! so an exact limiter must admit exactly its limit: more is over-admission,
//! less is under-admission.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use sluice_harness::Backend;

const CLIENTS: usize = 64;

struct Target {
    _backend: Backend,
    url: String,
    client: reqwest::Client,
}

fn start() -> Target {
    let backend = Backend::start().expect("starting redis-server and the shim");
    Target { url: backend.shim_url(), _backend: backend, client: reqwest::Client::new() }
}

async fn post(t: &Target, path: &str, body: &Value) -> Value {
    let resp =
        t.client.post(format!("{}{path}", t.url)).body(body.to_string()).send().await.expect("shim answers");
    assert_eq!(resp.status(), 200, "{path}");
    serde_json::from_slice(&resp.bytes().await.expect("answer body")).expect("json answer")
}

fn check(policy: &str, limit: Value) -> Value {
    json!({"checks": [{"policy": policy, "key": "one-key", "limits": [limit]}]})
}

/// `total` checks from 64 concurrent clients; the answers.
async fn hammer(t: &Arc<Target>, body: Value, total: usize) -> Vec<Value> {
    let sent = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (t, body, sent) = (t.clone(), body.clone(), sent.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while sent.fetch_add(1, Ordering::Relaxed) < total {
                    answers.push(post(&t, "/v1/check", &body).await);
                }
                answers
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("client task"));
    }
    all
}

fn admitted(answers: &[Value]) -> usize {
    answers.iter().filter(|a| a["allowed"] == true).count()
}

/// Every exact type admits exactly its limit under 64-way contention.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_exact_type_admits_exactly_its_limit() {
    let t = Arc::new(tokio::task::spawn_blocking(start).await.expect("start"));
    let cases = [
        ("sliding", json!({"type": "sliding_window", "limit": 500, "window_ms": 3_600_000}), 500),
        (
            "approx",
            json!({"type": "sliding_window", "limit": 500, "window_ms": 3_600_000, "approximate": true}),
            500,
        ),
        ("fixed", json!({"type": "fixed_window", "limit": 500, "window_ms": 31_536_000_000u64}), 500),
        ("token", json!({"type": "token_bucket", "rate": 1, "per_ms": 3_600_000, "burst": 500}), 500),
        ("leaky", json!({"type": "leaky_bucket", "capacity": 500, "drain_ms": 31_536_000_000u64}), 500),
        ("interval", json!({"type": "interval", "every_ms": 3_600_000}), 1),
        ("points", json!({"type": "points", "capacity": 1000, "refill_ms": 3_600_000, "cost": 7}), 142),
    ];
    for (policy, limit, want) in cases {
        let answers = hammer(&t, check(policy, limit), 2_000).await;
        assert_eq!(answers.len(), 2_000);
        assert_eq!(admitted(&answers), want, "{policy}: admitted of 2000");
    }
}

/// Concurrency: exactly `limit` leases from a burst; after their release,
/// exactly `limit` again; and under churn, never more than `limit` held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_holds_exactly_its_limit() {
    let t = Arc::new(tokio::task::spawn_blocking(start).await.expect("start"));
    let limit = json!({"type": "concurrency", "limit": 20, "lease_ms": 60_000});
    let body = check("erp", limit.clone());
    for _round in 0..2 {
        let answers = hammer(&t, body.clone(), 500).await;
        let leases: Vec<&str> = answers.iter().filter_map(|a| a["lease"].as_str()).collect();
        assert_eq!(leases.len(), 20, "leases granted of 500");
        assert_eq!(admitted(&answers), 20);
        for lease in leases {
            let released = post(&t, "/v1/release", &json!({"lease": lease, "checks": body["checks"]})).await;
            assert_eq!(released["released"], 1);
        }
    }

    // Churn: each client takes a slot, holds it a moment, gives it back.
    let held = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (t, body, held, most) = (t.clone(), body.clone(), held.clone(), most.clone());
            tokio::spawn(async move {
                for _ in 0..30 {
                    let answer = post(&t, "/v1/check", &body).await;
                    if let Some(lease) = answer["lease"].as_str() {
                        let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                        held.fetch_sub(1, Ordering::SeqCst);
                        let release = json!({"lease": lease, "checks": body["checks"]});
                        assert_eq!(post(&t, "/v1/release", &release).await["released"], 1);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("client task");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 20, "{most} leases held at once, over the limit of 20");
}

/// Leased mode: 32 gateways take leases of one fixed window, spend some of
/// each and give the rest back, while 32 clients check the same window
/// exactly. However the calls interleave, what the gateways spent and the
/// checks admitted together never exceed the limit, and once every unspent
/// token is back, a final drain admits exactly the rest: nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_from_many_gateways_admit_exactly_the_limit() {
    const LIMIT: usize = 3_000;
    let t = Arc::new(tokio::task::spawn_blocking(start).await.expect("start"));
    let limit = json!({"type": "fixed_window", "limit": LIMIT, "window_ms": 31_536_000_000u64});
    let check = json!({"checks": [{"policy": "leased", "key": "", "limits": [limit.clone()]}]});
    let lease = move |want: u64, back: Option<(u64, u64)>| {
        let mut body = json!({"policy": "leased", "key": "", "limit": limit.clone(), "want": want});
        if let Some((window, tokens)) = back {
            body["give_back"] = json!({"window": window, "tokens": tokens});
        }
        body
    };
    let spent = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let windows = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let gateways: Vec<_> = (0..32u64)
        .map(|g| {
            let (t, spent, windows, lease) = (t.clone(), spent.clone(), windows.clone(), lease.clone());
            tokio::spawn(async move {
                let mut back = None;
                let mut empty = 0;
                for round in 0u64.. {
                    let answer = post(&t, "/v1/lease", &lease(1 + (g + round) % 25, back.take())).await;
                    let granted = answer["granted"].as_u64().expect("granted");
                    let window = answer["window"].as_u64().expect("window");
                    windows.lock().expect("windows").insert(window);
                    if granted == 0 {
                        empty += 1;
                        if empty == 3 {
                            break;
                        }
                        continue;
                    }
                    // Spend all, or part and give the rest back with the next ask.
                    let spend = if (g + round) % 3 == 0 { granted / 2 } else { granted };
                    spent.fetch_add(spend as usize, Ordering::SeqCst);
                    if spend < granted {
                        back = Some((window, granted - spend));
                    }
                }
                if let Some(back) = back {
                    post(&t, "/v1/lease", &lease(0, Some(back))).await;
                }
            })
        })
        .collect();
    let checkers: Vec<_> = (0..32)
        .map(|_| {
            let (t, check, done) = (t.clone(), check.clone(), done.clone());
            tokio::spawn(async move {
                let mut admitted = 0;
                while !done.load(Ordering::SeqCst) {
                    if post(&t, "/v1/check", &check).await["allowed"] == true {
                        admitted += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    for gateway in gateways {
        gateway.await.expect("gateway task");
    }
    done.store(true, Ordering::SeqCst);
    let mut checked = 0;
    for checker in checkers {
        checked += checker.await.expect("checker task");
    }
    let spent = spent.load(Ordering::SeqCst);
    assert!(spent + checked <= LIMIT, "{spent} spent + {checked} checked over the limit of {LIMIT}");
    let mut drained = 0;
    while post(&t, "/v1/check", &check).await["allowed"] == true {
        drained += 1;
    }
    println!("LEASED spent {spent}, checked {checked}, drained {drained} of {LIMIT}");
    assert_eq!(spent + checked + drained, LIMIT, "every token admitted exactly once");
    assert!(spent > LIMIT / 2, "most went through leases: {spent}");
    assert_eq!(windows.lock().expect("windows").len(), 1, "one window all along");
}
