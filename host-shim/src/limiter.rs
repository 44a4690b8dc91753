//! The decision: one request's checks as one atomic call of `lua/check.lua`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use sluice_policies::wire::{CheckOutcome, CheckRequest, CheckResponse, LimitOutcome};

use crate::keys::script_limits;

/// Why a check could not be decided.
#[derive(Debug)]
pub enum CheckError {
    /// The request is malformed; answered with 400.
    BadRequest(String),
    /// Redis failed or answered nonsense; answered with 503.
    Store(String),
}

pub struct Limiter {
    conn: ConnectionManager,
    script: Script,
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
            script: Script::new(include_str!("../../lua/check.lua")),
            test_time,
            nonce: rand::random(),
            sequence: AtomicU64::new(0),
        })
    }

    pub async fn check(&self, req: &CheckRequest) -> Result<CheckResponse, CheckError> {
        let limits = script_limits(req).map_err(CheckError::BadRequest)?;
        let now = match (req.now_us, self.test_time) {
            (None, _) => String::new(),
            (Some(now), true) => now.to_string(),
            (Some(_), false) => {
                return Err(CheckError::BadRequest("now_us is honoured only with --test-time".into()))
            }
        };
        if limits.is_empty() {
            return Ok(CheckResponse { allowed: true, retry_after_ms: 0, checks: Vec::new() });
        }
        let id = format!("{:x}.{:x}", self.nonce, self.sequence.fetch_add(1, Ordering::Relaxed));
        let mut call = self.script.prepare_invoke();
        call.arg(now).arg(id);
        for limit in &limits {
            call.key(&limit.key).arg(limit.kind).arg(limit.limit).arg(limit.window_us);
        }
        let reply: Vec<i64> = call
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| CheckError::Store(format!("redis: {e}")))?;
        decode(req, &reply).ok_or_else(|| CheckError::Store(format!("unexpected script reply {reply:?}")))
    }
}

/// Reads the script's flat reply back into the shape of the request.
fn decode(req: &CheckRequest, reply: &[i64]) -> Option<CheckResponse> {
    let (head, rest) = reply.split_at_checked(2)?;
    let mut outcomes = rest.chunks_exact(4).map(|r| LimitOutcome {
        allowed: r[0] == 1,
        remaining: u64::try_from(r[1]).ok().unwrap_or(0),
        reset_ms: u64::try_from(r[2]).ok().unwrap_or(0),
        retry_after_ms: u64::try_from(r[3]).ok().unwrap_or(0),
    });
    let total: usize = req.checks.iter().map(|c| c.limits.len()).sum();
    if rest.len() != 4 * total {
        return None;
    }
    let checks = req
        .checks
        .iter()
        .map(|c| CheckOutcome { limits: outcomes.by_ref().take(c.limits.len()).collect() })
        .collect();
    Some(CheckResponse {
        allowed: head[0] == 1,
        retry_after_ms: u64::try_from(head[1]).ok().unwrap_or(0),
        checks,
    })
}
