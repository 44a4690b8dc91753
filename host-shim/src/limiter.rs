//! The decisions: each request's checks as one atomic script call, and the
//! releases and adjustments that follow it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sluice_policies::algorithm::Algorithm;
use sluice_policies::wire::{
    AdjustRequest, CheckOutcome, CheckRequest, CheckResponse, LimitOutcome, ReleaseRequest, ReleaseResponse,
};

use crate::keys::{script_adjustments, script_limits};
use crate::scripts::Scripts;

/// Why a request could not be decided.
#[derive(Debug)]
pub enum CheckError {
    /// The request is malformed; answered with 400.
    BadRequest(String),
    /// Redis failed or answered nonsense; answered with 503.
    Store(String),
}

pub struct Limiter {
    conn: ConnectionManager,
    scripts: Scripts,
    test_time: bool,
    /// Random per process: with `sequence` it makes request ids unique across shims.
    nonce: u64,
    sequence: AtomicU64,
}

impl Limiter {
    /// Connects lazily: the shim starts while Redis is down, and checks fail
    /// (and reconnect) until it is up.
    pub fn new(redis_url: &str, timeout: Duration, test_time: bool) -> anyhow::Result<Limiter> {
        let client = redis::Client::open(redis_url)
            .map_err(|e| anyhow::anyhow!("invalid --redis {redis_url:?}: {e}"))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| anyhow::anyhow!("cannot set up the Redis connection: {e}"))?;
        Ok(Limiter {
            conn,
            scripts: Scripts::new(),
            test_time,
            nonce: rand::random(),
            sequence: AtomicU64::new(0),
        })
    }

    /// The script's time argument: empty for Redis TIME.
    fn time_arg(&self, now_us: Option<u64>) -> Result<String, CheckError> {
        match (now_us, self.test_time) {
            (None, _) => Ok(String::new()),
            (Some(now), true) => Ok(now.to_string()),
            (Some(_), false) => {
                Err(CheckError::BadRequest("now_us is honoured only with --test-time".into()))
            }
        }
    }

    pub async fn check(&self, req: &CheckRequest) -> Result<CheckResponse, CheckError> {
        let limits = script_limits(&req.checks).map_err(CheckError::BadRequest)?;
        let now = self.time_arg(req.now_us)?;
        if limits.is_empty() {
            return Ok(CheckResponse {
                allowed: true,
                retry_after_ms: Some(0),
                checks: Vec::new(),
                lease: None,
            });
        }
        let id = format!("{:x}.{:x}", self.nonce, self.sequence.fetch_add(1, Ordering::Relaxed));
        let mut call = self.scripts.check.prepare_invoke();
        call.arg(now).arg(&id);
        for limit in &limits {
            let (name, [a, b, c]) = limit.algorithm.script_args();
            call.key(&limit.key).arg(name).arg(a).arg(b).arg(c);
        }
        let reply: Vec<i64> = call.invoke_async(&mut self.conn.clone()).await.map_err(store_error)?;
        let mut resp = decode(req, &reply)
            .ok_or_else(|| CheckError::Store(format!("unexpected script reply {reply:?}")))?;
        let holds_lease = limits.iter().any(|l| matches!(l.algorithm, Algorithm::Concurrency { .. }));
        if resp.allowed && holds_lease {
            resp.lease = Some(id);
        }
        Ok(resp)
    }

    /// Ends the lease of an admitted request on each of its concurrency limits.
    pub async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResponse, CheckError> {
        let limits = script_limits(&req.checks).map_err(CheckError::BadRequest)?;
        let keys: Vec<&str> = limits
            .iter()
            .filter(|l| matches!(l.algorithm, Algorithm::Concurrency { .. }))
            .map(|l| l.key.as_str())
            .collect();
        if keys.is_empty() || req.lease.is_empty() || req.lease.len() > 64 {
            return Err(CheckError::BadRequest("a release needs a lease and a concurrency limit".into()));
        }
        let mut call = self.scripts.release.prepare_invoke();
        call.arg(&req.lease);
        for key in keys {
            call.key(key);
        }
        let released: u64 = call.invoke_async(&mut self.conn.clone()).await.map_err(store_error)?;
        Ok(ReleaseResponse { released })
    }

    /// Charges or refunds points once the true costs are known.
    pub async fn adjust(&self, req: &AdjustRequest) -> Result<(), CheckError> {
        let adjustments = script_adjustments(&req.adjustments).map_err(CheckError::BadRequest)?;
        let now = self.time_arg(req.now_us)?;
        let changes: Vec<_> = adjustments.iter().filter(|a| a.delta != 0).collect();
        if changes.is_empty() {
            return Ok(());
        }
        let mut call = self.scripts.adjust.prepare_invoke();
        call.arg(now);
        for a in changes {
            call.key(&a.key).arg(a.interval_us).arg(a.delta);
        }
        let _: i64 = call.invoke_async(&mut self.conn.clone()).await.map_err(store_error)?;
        Ok(())
    }
}

fn store_error(err: redis::RedisError) -> CheckError {
    CheckError::Store(format!("redis: {err}"))
}

/// Reads the check script's flat reply (see `lua/check.lua`) back into the
/// shape of the request. A retry of -1 is unknown.
fn decode(req: &CheckRequest, reply: &[i64]) -> Option<CheckResponse> {
    let (head, rest) = reply.split_at_checked(2)?;
    let total: usize = req.checks.iter().map(|c| c.limits.len()).sum();
    if rest.len() != 5 * total {
        return None;
    }
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let retry = |n: i64| u64::try_from(n).ok();
    let mut outcomes = rest.chunks_exact(5).map(|r| LimitOutcome {
        allowed: r[0] == 1,
        remaining: count(r[1]),
        reset_ms: count(r[2]),
        retry_after_ms: retry(r[3]),
        reclaimed: count(r[4]),
    });
    let checks = req
        .checks
        .iter()
        .map(|c| CheckOutcome { limits: outcomes.by_ref().take(c.limits.len()).collect() })
        .collect();
    Some(CheckResponse { allowed: head[0] == 1, retry_after_ms: retry(head[1]), checks, lease: None })
}
