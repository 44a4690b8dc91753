//! The Redis the shim keeps its limits in: one server over a managed,
//! multiplexed connection, or a Redis Cluster. Both reconnect by themselves;
//! both run scripts by EVALSHA and load them again on NOSCRIPT.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, RedisResult, ScriptInvocation};
use tokio::sync::OnceCell;

/// Where the limits live.
#[derive(Debug, Clone)]
pub enum Target {
    Single(String),
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
}

pub enum Store {
    Single(ConnectionManager),
    /// Connected on first use, so the shim starts while the cluster is down.
    Cluster {
        client: ClusterClient,
        conn: OnceCell<ClusterConnection>,
    },
}

impl Store {
    pub fn new(target: &Target, timeout: Duration) -> anyhow::Result<Store> {
        match target {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str())
                    .map_err(|e| anyhow::anyhow!("invalid --redis {url:?}: {e}"))?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(3)
                    .set_max_delay(Duration::from_millis(500));
                let conn = ConnectionManager::new_lazy_with_config(client, config)
                    .map_err(|e| anyhow::anyhow!("cannot set up the Redis connection: {e}"))?;
                Ok(Store::Single(conn))
            }
            Target::Cluster(seeds) => {
                let client = ClusterClient::builder(seeds.iter().map(String::as_str))
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(3)
                    .build()
                    .map_err(|e| anyhow::anyhow!("invalid --redis-cluster {seeds:?}: {e}"))?;
                Ok(Store::Cluster { client, conn: OnceCell::new() })
            }
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Store::Cluster { .. })
    }

    pub async fn invoke<T: FromRedisValue>(&self, call: &ScriptInvocation<'_>) -> RedisResult<T> {
        match self {
            Store::Single(conn) => call.invoke_async(&mut conn.clone()).await,
            Store::Cluster { client, conn } => {
                let conn = conn.get_or_try_init(|| client.get_async_connection()).await?;
                call.invoke_async(&mut conn.clone()).await
            }
        }
    }
}
