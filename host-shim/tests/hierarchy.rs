//! Quotas in a hierarchy under a torture: many concurrent requests through
//! the shim on a real Redis Cluster, each charged to an organisation's
//! monthly points budget, its team's share and its API key's rate, all or
//! none. Afterwards every level's count in Redis equals exactly what the
//! admitted requests cost it, and none is over its limit.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::cluster_routing::Slot;
use sluice_harness::RedisCluster;
use sluice_policies::algorithm::Algorithm;
use sluice_policies::request::SimpleRequest;
use sluice_policies::units::Micros;
use sluice_policies::wire::{Check, CheckRequest};
use sluice_shim::keys::script_limits;
use sluice_shim::limiter::Limiter;
use sluice_shim::store::Target;

const DOCUMENT: &str = r#"{
  "policies": [{
    "name": "llm",
    "key": ["header:x-org"],
    "limits": [{"type": "points", "capacity": 3000, "cost": {"header": "x-cost", "default": 10},
                "refill": {"calendar": "month", "zone": "Europe/Paris"}}],
    "levels": [
      {"name": "team", "key": ["header:x-org", "header:x-team"],
       "limits": [{"type": "points", "capacity": 900, "cost": {"header": "x-cost", "default": 10},
                   "refill": {"calendar": "month", "zone": "Europe/Paris"}}]},
      {"name": "api-key", "key": ["header:x-org", "header:x-team", "header:x-api-key"],
       "limits": [{"type": "fixed_window", "limit": 12, "window": "1m"}]}
    ]
  }]
}"#;

/// What one request is, and the check the filter would send for it.
struct Sent {
    org: String,
    team: String,
    api_key: String,
    cost: u64,
    check: Check,
}

fn requests(doc: &sluice_policies::Document, n: usize) -> Vec<Sent> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // A spread of keys and costs, fixed so that a failure repeats.
        let (org, team, api_key) =
            (format!("org{}", i % 2), format!("t{}", (i / 2) % 3), format!("k{}", (i / 6) % 4));
        let cost = 1 + (i * 37 % 60) as u64;
        let req = SimpleRequest::new("POST", "/v1/chat")
            .header("x-org", &org)
            .header("x-team", &team)
            .header("x-api-key", &api_key)
            .header("x-cost", cost.to_string());
        let applied = doc.evaluate(&req).expect("no missing key");
        let check = applied.first().expect("the policy applies").check(&req);
        out.push(Sent { org, team, api_key, cost, check });
    }
    out
}

fn count(conn: &mut redis::cluster::ClusterConnection, key: &str) -> u64 {
    let n: Option<u64> = redis::cmd("HGET").arg(key).arg("n").query(conn).expect("HGET");
    n.unwrap_or(0)
}

/// 1,200 requests, 48 at a time, over 2 organisations, 6 teams and 24 API
/// keys, all at one instant (so that no window turns over): every level is
/// charged exactly what the admitted requests cost it, none is over its
/// limit, and every level of an organisation lives in its one slot.
#[test]
fn a_hierarchy_charges_every_level_or_none() {
    let doc = sluice_policies::parse(DOCUMENT).expect("the document");
    let sent = requests(&doc, 1_200);
    let cluster = RedisCluster::start().expect("cluster");
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let limiter = Arc::new(
        Limiter::new(&Target::Cluster(cluster.urls()), Duration::from_secs(10), true).expect("limiter"),
    );
    let now = Micros(1_780_000_000_000_000);

    // Every level of a check sits in its organisation's slot.
    for s in &sent {
        let keys = script_limits(std::slice::from_ref(&s.check)).expect("valid");
        assert_eq!(keys.len(), 3);
        let slot = Slot::for_key(&keys[0].key);
        assert!(keys.iter().all(|k| Slot::for_key(&k.key) == slot), "{keys:?}");
    }

    let sent = Arc::new(sent);
    let admitted: Vec<bool> = runtime.block_on(async {
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..48 {
            let (limiter, sent, next) = (limiter.clone(), sent.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(s) = sent.get(i) else { break };
                    let req = CheckRequest {
                        checks: vec![s.check.clone()].into(),
                        now_us: Some(now),
                        id: None,
                        wait_ms: None,
                        views: Default::default(),
                    };
                    let resp = limiter.check(&req).await.expect("check");
                    mine.push((i, resp.allowed));
                }
                mine
            }));
        }
        let mut all = vec![false; sent.len()];
        for task in tasks {
            for (i, allowed) in task.await.expect("task") {
                all[i] = allowed;
            }
        }
        all
    });

    // What the admitted requests cost each level, by its key.
    let mut want: HashMap<String, u64> = HashMap::new();
    for (s, &ok) in sent.iter().zip(&admitted) {
        let keys = script_limits(std::slice::from_ref(&s.check)).expect("valid");
        for (k, charge) in keys.iter().zip([s.cost, s.cost, 1]) {
            *want.entry(k.key.clone()).or_default() += if ok { charge } else { 0 };
        }
    }
    let admitted_n = admitted.iter().filter(|a| **a).count();
    assert!(admitted_n > 100 && admitted_n < sent.len(), "some admitted, some denied: {admitted_n}");

    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("client");
    let mut conn = client.get_connection().expect("connection");
    for (key, charged) in &want {
        assert_eq!(count(&mut conn, key), *charged, "{key}: charged exactly what its admitted requests cost");
    }
    // No level over its limit, and each level's counts add up to the one above.
    let by = |f: &dyn Fn(&Sent) -> String| {
        let mut sums: HashMap<String, u64> = HashMap::new();
        for (s, &ok) in sent.iter().zip(&admitted) {
            *sums.entry(f(s)).or_default() += if ok { s.cost } else { 0 };
        }
        sums
    };
    for (org, total) in by(&|s| s.org.clone()) {
        assert!(total <= 3000, "{org}: {total} over its 3000");
    }
    for (team, total) in by(&|s| format!("{}/{}", s.org, s.team)) {
        assert!(total <= 900, "{team}: {total} over its 900");
    }
    let mut per_key: HashMap<String, u64> = HashMap::new();
    for (s, &ok) in sent.iter().zip(&admitted) {
        *per_key.entry(format!("{}/{}/{}", s.org, s.team, s.api_key)).or_default() += u64::from(ok);
    }
    assert!(per_key.values().all(|n| *n <= 12), "{per_key:?}");
    // The state keys name their levels under the organisation's hash tag.
    let keys = script_limits(std::slice::from_ref(&sent[0].check)).expect("valid");
    let names: Vec<&str> = keys.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(
        names,
        [
            "sluice:{llm:org0}:cp:m1:Europe/Paris",
            "sluice:{llm:org0}:@team:t0:cp:m1:Europe/Paris",
            "sluice:{llm:org0}:@api-key:t0:k0:fw:60000",
        ]
    );
    assert!(matches!(keys[2].algorithm, Algorithm::FixedWindow { .. }));
}
