//! The Redis the shim keeps its limits in: one server over a managed,
//! multiplexed connection, a Redis Cluster, or the master a Redis Sentinel
//! names (asked again whenever a call fails on it). All reconnect by themselves;
//! both run scripts by EVALSHA and load them again on NOSCRIPT. `rediss://`
//! URLs connect over TLS (rustls), and a password in a URL authenticates
//! (AUTH); it never appears in a log line or an error.
//!
//! Each script call is timed and its failures and reloads counted
//! ([`crate::metrics`]): a reload is the `SCRIPT LOAD` redis-rs sends after
//! Redis answered NOSCRIPT, seen on its way through [`Observed`].

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{
    Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, ScriptInvocation, TlsCertificates, Value,
};
use tokio::sync::OnceCell;

use crate::metrics::Metrics;
use crate::scripts::Invocation;

/// Where the limits live. Its `Debug` and `Display` hide any password in
/// the URLs, so it can be logged.
#[derive(Clone)]
pub enum Target {
    Single(String),
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
    /// Redis Sentinel: the sentinels' URLs (or `host:port`) and the name of
    /// the master they watch.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Single(url) => f.write_str(&redact(url)),
            Target::Cluster(seeds) => {
                let seeds: Vec<String> = seeds.iter().map(|s| redact(s)).collect();
                write!(f, "cluster {}", seeds.join(","))
            }
            Target::Sentinel { sentinels, master } => {
                let sentinels: Vec<String> = sentinels.iter().map(|s| redact(s)).collect();
                write!(f, "sentinel {} master {master}", sentinels.join(","))
            }
        }
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `url` with the password of its user info, if any, replaced by `***`:
/// `redis://:secret@host:6379/0` becomes `redis://:***@host:6379/0`. Text
/// that is not a URL passes unchanged unless it holds an `@`, whose user
/// info is hidden whole.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return match url.rfind('@') {
            Some(at) => format!("***{}", &url[at..]),
            None => url.to_string(),
        };
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    let user = match rest[..at].split_once(':') {
        Some((user, _password)) => format!("{user}:***"),
        None => "***".to_string(),
    };
    format!("{}{user}{}", &url[..scheme_end], &rest[at..])
}

/// How to reach Redis: where, how long to wait, and the CA to trust for
/// `rediss://` (the system's roots without one).
pub struct Connect<'a> {
    pub target: &'a Target,
    pub timeout: Duration,
    /// PEM of the CA certificates that sign Redis's TLS certificate.
    pub ca: Option<Vec<u8>>,
}

/// The shim's connection to Redis, one server or a Redis Cluster: runs the
/// scripts and counts each call in the metrics.
pub struct RedisClient {
    conn: Conn,
    metrics: Arc<Metrics>,
    /// Whether Redis runs functions; false once it refused them (Redis
    /// before 7, or an ACL that forbids `FCALL` or `FUNCTION`).
    functions: AtomicBool,
}

enum Conn {
    Single(ConnectionManager),
    /// Connected on first use, so the shim starts while the cluster is down.
    Cluster {
        client: ClusterClient,
        conn: OnceCell<ClusterConnection>,
    },
    Sentinel(SentinelConn),
}

/// The master a Sentinel names, followed across failovers: connected on
/// first use by asking the sentinels (which check its `ROLE`); a call that
/// fails on the connection (refused, dropped, timed out) or meets a
/// demoted master (`READONLY`) drops it, so the next call asks again.
struct SentinelConn {
    client: tokio::sync::Mutex<SentinelClient>,
    current: std::sync::Mutex<Option<MultiplexedConnection>>,
    timeout: Duration,
}

impl SentinelConn {
    fn cached(&self) -> Option<MultiplexedConnection> {
        self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The master's client, as the sentinels name it now.
    async fn master(&self) -> RedisResult<redis::Client> {
        let mut client = self.client.lock().await;
        match tokio::time::timeout(self.timeout, client.async_get_client()).await {
            Ok(found) => found,
            Err(_) => Err(redis::RedisError::from((redis::ErrorKind::Io, "no sentinel answered in time"))),
        }
    }

    async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        if let Some(conn) = self.cached() {
            return Ok(conn);
        }
        let master = self.master().await?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let conn = master.get_multiplexed_async_connection_with_config(&config).await?;
        let mut current = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(current.get_or_insert(conn).clone())
    }

    /// After a failed call: forgets the connection if the master may have moved.
    fn failed(&self, err: &redis::RedisError) {
        let moved = err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_timeout()
            || err.is_unrecoverable_error()
            || detail_has(err, "READONLY");
        if moved {
            *self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        }
    }
}

impl RedisClient {
    pub fn new(target: &Target, timeout: Duration) -> anyhow::Result<RedisClient> {
        RedisClient::connect(&Connect { target, timeout, ca: None })
    }

    pub fn connect(how: &Connect<'_>) -> anyhow::Result<RedisClient> {
        crate::tls::install_default_provider();
        let timeout = how.timeout;
        let certs = || TlsCertificates { client_tls: None, root_cert: how.ca.clone() };
        match how.target {
            Target::Single(url) => {
                let client = match how.ca {
                    Some(_) => redis::Client::build_with_tls(url.as_str(), certs()),
                    None => redis::Client::open(url.as_str()),
                };
                let client = client.map_err(|e| anyhow::anyhow!("invalid --redis {}: {e}", redact(url)))?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(3)
                    .set_max_delay(Duration::from_millis(500));
                let conn = ConnectionManager::new_lazy_with_config(client, config)
                    .map_err(|e| anyhow::anyhow!("cannot set up the Redis connection: {e}"))?;
                Ok(RedisClient {
                    conn: Conn::Single(conn),
                    metrics: Arc::default(),
                    functions: AtomicBool::new(true),
                })
            }
            Target::Cluster(seeds) => {
                let mut builder = ClusterClient::builder(seeds.iter().map(String::as_str))
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(3);
                if how.ca.is_some() {
                    builder = builder.certs(certs());
                }
                let client = builder
                    .build()
                    .map_err(|e| anyhow::anyhow!("invalid --redis-cluster {}: {e}", how.target))?;
                Ok(RedisClient {
                    conn: Conn::Cluster { client, conn: OnceCell::new() },
                    metrics: Arc::default(),
                    functions: AtomicBool::new(true),
                })
            }
            Target::Sentinel { sentinels, master } => {
                if how.ca.is_some() {
                    anyhow::bail!("--redis-ca: TLS through Sentinel is not supported");
                }
                let client = SentinelClient::build(
                    sentinels.iter().map(|s| sentinel_url(s)).collect(),
                    master.as_str(),
                    None,
                    SentinelServerType::Master,
                )
                .map_err(|e| anyhow::anyhow!("invalid --redis-sentinel {}: {e}", how.target))?;
                Ok(RedisClient {
                    conn: Conn::Sentinel(SentinelConn {
                        client: tokio::sync::Mutex::new(client),
                        current: std::sync::Mutex::new(None),
                        timeout,
                    }),
                    metrics: Arc::default(),
                    functions: AtomicBool::new(true),
                })
            }
        }
    }

    /// A client for the master a Sentinel names now (the wake-up
    /// subscriber's, which follows failovers too); `None` for a fixed Redis.
    pub async fn sentinel_master(&self) -> Option<RedisResult<redis::Client>> {
        match &self.conn {
            Conn::Sentinel(sentinel) => Some(sentinel.master().await),
            _ => None,
        }
    }

    /// Counts its script calls in `metrics` instead of metrics of its own.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> RedisClient {
        self.metrics = metrics;
        self
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster { .. })
    }

    pub async fn invoke<T: FromRedisValue>(&self, call: &ScriptInvocation<'_>) -> RedisResult<T> {
        let started = Instant::now();
        let result = match &self.conn {
            Conn::Single(conn) => call.invoke_async(&mut self.observed(conn.clone())).await,
            Conn::Cluster { client, conn } => {
                match conn.get_or_try_init(|| client.get_async_connection()).await {
                    Ok(conn) => call.invoke_async(&mut self.observed(conn.clone())).await,
                    Err(err) => Err(err),
                }
            }
            Conn::Sentinel(sentinel) => {
                let result = match sentinel.connection().await {
                    Ok(conn) => call.invoke_async(&mut self.observed(conn)).await,
                    Err(err) => Err(err),
                };
                if let Err(err) = &result {
                    sentinel.failed(err);
                }
                result
            }
        };
        self.metrics.script_call(started, &result);
        result
    }

    /// Runs a script that is also a function library: by FCALL, loading the
    /// library on first use and again after Redis lost it (a restart
    /// without persistence, `FUNCTION FLUSH`); by EVALSHA where Redis runs
    /// no functions, from the first refusal on.
    pub async fn call<T: FromRedisValue>(&self, call: &Invocation<'_>) -> RedisResult<T> {
        if !self.functions.load(Ordering::Relaxed) {
            return self.invoke(&call.script()).await;
        }
        let started = Instant::now();
        let mut result = self.query(&call.fcall()).await;
        if result.as_ref().is_err_and(|e| detail_has(e, "Function not found")) {
            result = match self.query::<String>(&call.load()).await {
                Ok(_) => {
                    self.metrics.script_reloaded();
                    self.query(&call.fcall()).await
                }
                Err(err) => Err(err),
            };
        }
        if let Err(err) = &result {
            if refuses_functions(err) {
                if self.functions.swap(false, Ordering::Relaxed) {
                    tracing::warn!(%err, "Redis runs no functions (before 7, or an ACL): running the check script by EVALSHA");
                }
                return self.invoke(&call.script()).await;
            }
        }
        self.metrics.script_call(started, &result);
        result
    }

    /// Runs one plain command (not a script).
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match &self.conn {
            Conn::Single(conn) => cmd.query_async(&mut conn.clone()).await,
            Conn::Cluster { client, conn } => {
                let conn = conn.get_or_try_init(|| client.get_async_connection()).await?;
                cmd.query_async(&mut conn.clone()).await
            }
            Conn::Sentinel(sentinel) => {
                let result = cmd.query_async(&mut sentinel.connection().await?).await;
                if let Err(err) = &result {
                    sentinel.failed(err);
                }
                result
            }
        }
    }

    fn observed<C>(&self, conn: C) -> Observed<'_, C> {
        Observed { conn, metrics: &self.metrics }
    }
}

/// A sentinel as `host:port` or a URL: a URL (`redis://host:port`).
fn sentinel_url(sentinel: &str) -> String {
    if sentinel.contains("://") {
        sentinel.to_string()
    } else {
        format!("redis://{sentinel}")
    }
}

fn detail_has(err: &redis::RedisError, text: &str) -> bool {
    err.detail().is_some_and(|d| d.contains(text)) || err.to_string().contains(text)
}

/// Redis before 7 knows no `FCALL` or `FUNCTION`; an ACL may forbid them.
fn refuses_functions(err: &redis::RedisError) -> bool {
    err.code() == Some("NOPERM") || detail_has(err, "unknown command")
}

/// A connection that counts the scripts loaded through it: redis-rs loads a
/// script only after Redis answered NOSCRIPT to its EVALSHA.
struct Observed<'a, C> {
    conn: C,
    metrics: &'a Metrics,
}

impl<C: redis::aio::ConnectionLike + Send> redis::aio::ConnectionLike for Observed<'_, C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let mut args = cmd.args_iter();
        let is = |arg: Option<redis::Arg<&[u8]>>, word: &[u8]| matches!(arg, Some(redis::Arg::Simple(a)) if a.eq_ignore_ascii_case(word));
        if is(args.next(), b"SCRIPT") && is(args.next(), b"LOAD") {
            self.metrics.script_reloaded();
        }
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("redis://:s3cret@10.0.0.1:6379/0"), "redis://:***@10.0.0.1:6379/0");
        assert_eq!(redact("rediss://sluice:s3cret@redis:6380"), "rediss://sluice:***@redis:6380");
        assert_eq!(redact("redis://s3cret@redis"), "redis://***@redis");
        assert_eq!(redact("redis://:p@ss:w@rd@redis/0"), "redis://:***@redis/0");
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("unix:///run/redis.sock"), "unix:///run/redis.sock");
        assert_eq!(redact("s3cret@redis"), "***@redis");
        let cluster = Target::Cluster(vec!["redis://:a1@n1:7000".into(), "redis://:a2@n2:7000".into()]);
        assert_eq!(format!("{cluster:?}"), "cluster redis://:***@n1:7000,redis://:***@n2:7000");
        assert_eq!(Target::Single("redis://u:pw@h".into()).to_string(), "redis://u:***@h");
        let sentinel = Target::Sentinel {
            sentinels: vec!["redis://:pw@s1:26379".into(), "s2:26379".into()],
            master: "m".into(),
        };
        assert_eq!(sentinel.to_string(), "sentinel redis://:***@s1:26379,s2:26379 master m");
    }
}
