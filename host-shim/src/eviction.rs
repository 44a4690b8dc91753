//! Redis's eviction policy, read and judged. Under memory pressure a Redis
//! with `maxmemory` and an evicting `maxmemory-policy` deletes keys to make
//! room, and a deleted Sluice key is a limit silently reset: its window,
//! bucket or leases start again from nothing. Every Sluice key carries a
//! TTL, so the `volatile-*` policies evict them as readily as `allkeys-*`.
//! Only `noeviction` (or no `maxmemory`) keeps them; Redis then refuses
//! writes when full (`OOM`), each check fails, and `failure_mode` decides,
//! counted as `sluice_script_errors_total{kind="oom"}`.
//!
//! The shim reads the two settings at start and every minute, logs a
//! warning when they change to a risky pair, and `GET /healthz` carries the
//! warning while it holds. A Redis that refuses `CONFIG GET` (a managed
//! service may) gives no warning, only a debug line.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::store::RedisClient;

/// How often the settings are read again.
const EVERY: Duration = Duration::from_secs(60);

/// Why `maxmemory` and `maxmemory-policy` can reset limits, if they can.
/// `maxmemory` 0 means no limit: nothing is ever evicted.
pub fn risk(maxmemory: u64, policy: &str) -> Option<String> {
    if maxmemory == 0 || policy == "noeviction" {
        return None;
    }
    let why = if policy.starts_with("volatile-") {
        "every Sluice key has a TTL, so it evicts them"
    } else {
        "it evicts any key"
    };
    Some(format!(
        "Redis maxmemory-policy is {policy} with maxmemory {maxmemory} bytes: {why}, and an evicted key \
         silently resets its limit; set maxmemory-policy noeviction (a full Redis then refuses writes and \
         failure_mode decides, counted)"
    ))
}

/// The latest judgement, shared with `/healthz`.
#[derive(Default)]
pub struct Eviction {
    warning: RwLock<Option<String>>,
}

impl Eviction {
    /// The warning that holds now, if any.
    pub fn warning(&self) -> Option<String> {
        self.warning.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Reads the settings once; logs a warning that is new.
    pub async fn refresh(&self, store: &RedisClient) {
        let now = match read(store).await {
            Ok((maxmemory, policy)) => risk(maxmemory, &policy),
            Err(err) => {
                tracing::debug!(%err, "cannot read Redis's maxmemory settings; no eviction warning");
                None
            }
        };
        let mut held = self.warning.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if now.is_some() && *held != now {
            tracing::warn!("{}", now.as_deref().unwrap_or_default());
        }
        *held = now;
    }
}

/// Reads the settings at once and then every minute, for as long as the
/// returned task runs.
pub fn watch(eviction: Arc<Eviction>, store: Arc<RedisClient>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            eviction.refresh(&store).await;
            tokio::time::sleep(EVERY).await;
        }
    })
}

/// `maxmemory` and `maxmemory-policy`, by `CONFIG GET`.
async fn read(store: &RedisClient) -> redis::RedisResult<(u64, String)> {
    let pairs: Vec<(String, String)> = store.query(redis::cmd("CONFIG").arg("GET").arg("maxmemory*")).await?;
    let get = |name: &str| pairs.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    let maxmemory = get("maxmemory").and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok((maxmemory, get("maxmemory-policy").unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_evicting_policy_under_a_memory_limit_is_a_risk() {
        assert_eq!(risk(0, "allkeys-lru"), None, "no maxmemory: nothing is evicted");
        assert_eq!(risk(1 << 30, "noeviction"), None);
        let all = risk(1 << 30, "allkeys-lru").expect("a risk");
        assert!(all.contains("allkeys-lru") && all.contains("evicts any key"), "{all}");
        let volatile = risk(1 << 30, "volatile-ttl").expect("a risk");
        assert!(volatile.contains("every Sluice key has a TTL"), "{volatile}");
    }
}
