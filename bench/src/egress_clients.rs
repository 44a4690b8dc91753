//! The hand-written ways to call a limited partner, as plain Rust clients
//! that go straight to the partner (no gateway), written from SCENARIOS.md
//! with their known habits kept:
//!
//! - [`Client::RetryOn429`]: no limiter at all; on the partner's 429, sleep
//!   0.5 s and call again (what a job framework does with an OverLimit).
//! - [`Client::SetNxPx`] (S1): `SET key NX PX <interval>`; the winner
//!   calls, a loser reads `PTTL`, sleeps that long plus an offset of 10 to
//!   50 ms that shrinks with each retry, and tries again; gives up after 15 s.
//! - [`Client::DualWindowScript`] (S0): the hand-written two-sorted-set
//!   script of `bench/handwritten/dual_window_zset.lua` with the caller's
//!   clock; when either remaining count is zero the job raises OverLimit,
//!   sleeps 0.5 s and retries (as does a 429 from the partner).
//!
//! Each worker makes calls until the run's total is reached, or until the
//! run's budget is spent (the S0 script can starve itself: it charges the
//! window that admits even when the other one refuses); every call carries
//! the account and a sequence number, like the gateway's callers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use redis::aio::MultiplexedConnection;
use sluice_harness::partner::{self, Limits};

/// What a job framework sleeps before retrying an OverLimit or a 429.
const RETRY_SLEEP: Duration = Duration::from_millis(500);
/// S1's callers give up after this long.
const S1_GIVE_UP: Duration = Duration::from_secs(15);
/// How long one Redis command may take.
const REDIS_TIMEOUT: Duration = Duration::from_secs(10);
/// Any other caller gives up after this long, so a run always ends.
const GIVE_UP: Duration = Duration::from_secs(180);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Client {
    RetryOn429,
    SetNxPx,
    DualWindowScript,
}

impl Client {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Client::RetryOn429 => "hand-written: retry on 429 after 0.5 s",
            Client::SetNxPx => "hand-written: SET NX PX, PTTL sleep + 10-50 ms",
            Client::DualWindowScript => "hand-written: S0 dual-zset script, OverLimit sleeps 0.5 s",
        }
    }

    /// The hand-written clients that fit a scenario's limits.
    pub(crate) fn for_limits(limits: &Limits) -> Vec<Client> {
        let mut clients = vec![Client::RetryOn429];
        if limits.interval.is_some() {
            clients.push(Client::SetNxPx);
        }
        if limits.windows.len() == 2 {
            clients.push(Client::DualWindowScript);
        }
        clients
    }
}

/// What the callers saw.
pub(crate) struct Tally {
    pub(crate) served: usize,
    /// Calls given up (or failed without an answer), and calls never
    /// started because the budget was spent.
    pub(crate) gave_up: usize,
    pub(crate) elapsed: Duration,
    /// The budget ran out before every call was made.
    pub(crate) stopped: bool,
}

struct Ctx {
    client: Client,
    http: reqwest::Client,
    url: String,
    account: String,
    limits: Limits,
    redis: MultiplexedConnection,
    script: redis::Script,
    next: AtomicU64,
    total: u64,
    /// No call starts after this.
    deadline: Instant,
}

/// Runs `workers` callers of kind `client` until `calls` calls are made,
/// starting none after `budget`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    client: Client,
    partner_port: u16,
    redis_url: &str,
    account: &str,
    limits: &Limits,
    workers: usize,
    calls: usize,
    budget: Duration,
) -> Result<Tally> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let mut redis = redis::Client::open(redis_url)?.get_multiplexed_async_connection().await?;
        // The crate's 500 ms default is too short for a loaded machine with
        // MONITOR on; a slow answer is still an answer here.
        redis.set_response_timeout(REDIS_TIMEOUT);
        let ctx = Arc::new(Ctx {
            client,
            http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?,
            url: format!("http://127.0.0.1:{partner_port}/v42/orders"),
            account: account.to_string(),
            limits: limits.clone(),
            redis,
            script: redis::Script::new(include_str!("../handwritten/dual_window_zset.lua")),
            next: AtomicU64::new(0),
            total: calls as u64,
            deadline: Instant::now() + budget,
        });
        let started = Instant::now();
        let tasks: Vec<_> = (0..workers).map(|w| tokio::spawn(worker(ctx.clone(), w as u64))).collect();
        let mut tally = Tally { served: 0, gave_up: 0, elapsed: Duration::ZERO, stopped: false };
        for task in tasks {
            let (served, gave_up) = task.await.context("a worker panicked")??;
            tally.served += served;
            tally.gave_up += gave_up;
        }
        tally.elapsed = started.elapsed();
        let never_started = calls.saturating_sub(tally.served + tally.gave_up);
        tally.stopped = never_started > 0;
        tally.gave_up += never_started;
        Ok(tally)
    })
}

async fn worker(ctx: Arc<Ctx>, id: u64) -> Result<(usize, usize)> {
    let (mut served, mut gave_up) = (0, 0);
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (id + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
    loop {
        if Instant::now() >= ctx.deadline {
            return Ok((served, gave_up));
        }
        let seq = ctx.next.fetch_add(1, Ordering::SeqCst);
        if seq >= ctx.total {
            return Ok((served, gave_up));
        }
        let done = match ctx.client {
            Client::RetryOn429 => retry_on_429(&ctx, seq).await,
            Client::SetNxPx => set_nx_px(&ctx, seq, &mut rng).await?,
            Client::DualWindowScript => dual_window(&ctx, seq).await?,
        };
        if done {
            served += 1;
        } else {
            gave_up += 1;
        }
    }
}

/// One call to the partner: true if it answered 200.
async fn call(ctx: &Ctx, seq: u64) -> bool {
    let request = ctx.http.get(&ctx.url).header(partner::ACCOUNT, &ctx.account).header(partner::SEQ, seq);
    matches!(request.send().await, Ok(response) if response.status() == 200)
}

async fn retry_on_429(ctx: &Ctx, seq: u64) -> bool {
    let started = Instant::now();
    while started.elapsed() < GIVE_UP {
        if call(ctx, seq).await {
            return true;
        }
        tokio::time::sleep(RETRY_SLEEP).await;
    }
    false
}

async fn set_nx_px(ctx: &Ctx, seq: u64, rng: &mut XorShift) -> Result<bool> {
    let every = ctx.limits.interval.context("SET NX PX needs an interval")?;
    let key = format!("hand:{{{}}}:interval", ctx.account);
    let mut redis = ctx.redis.clone();
    let started = Instant::now();
    let mut retries: u64 = 0;
    while started.elapsed() < S1_GIVE_UP {
        let won: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(every.as_millis() as u64)
            .query_async(&mut redis)
            .await?;
        if won.is_some() {
            if call(ctx, seq).await {
                return Ok(true);
            }
            // The partner refused: the turn is lost, queue up again.
            continue;
        }
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut redis).await?;
        // The offset shrinks from 10..50 ms towards 10 ms as retries grow.
        let top = 50u64.saturating_sub(5 * retries).max(10);
        let offset = 10 + rng.next() % (top - 10 + 1);
        tokio::time::sleep(Duration::from_millis(pttl.max(0) as u64 + offset)).await;
        retries += 1;
    }
    Ok(false)
}

async fn dual_window(ctx: &Ctx, seq: u64) -> Result<bool> {
    let [first, second] = ctx.limits.windows[..] else {
        anyhow::bail!("the dual-window script needs exactly two windows");
    };
    let mut redis = ctx.redis.clone();
    let started = Instant::now();
    while started.elapsed() < GIVE_UP {
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
        let remaining: Vec<i64> = ctx
            .script
            .key(format!("hand:{{{}}}:w1", ctx.account))
            .key(format!("hand:{{{}}}:w2", ctx.account))
            .arg(now)
            .arg(first.window.as_secs_f64())
            .arg(first.limit)
            .arg(second.window.as_secs_f64())
            .arg(second.limit)
            .invoke_async(&mut redis)
            .await?;
        // As written in S0: the caller raises when either count is zero.
        if remaining.iter().all(|&r| r > 0) && call(ctx, seq).await {
            return Ok(true);
        }
        tokio::time::sleep(RETRY_SLEEP).await;
    }
    Ok(false)
}

/// A tiny deterministic generator for the offsets; no crate needed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
