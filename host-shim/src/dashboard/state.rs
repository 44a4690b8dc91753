//! A key's state, read from Redis with plain commands when the page asks:
//! what every shim of the fleet has charged, not only this one.
//!
//! The raw state is what `lua/*.lua` keeps under `sluice:{<policy>:<key>}:
//! <suffix>` ([`crate::keys`]), a hierarchy's level under its own key
//! within it (each level read from its own key, as the check charges it); remaining and reset are computed from it by
//! the reference model (`sluice_policies::algorithm`), the twin of the
//! scripts, as the next check would see them. Reading changes nothing:
//! expired entries stay until the next check prunes them.

use std::sync::Arc;

use serde::Serialize;
use sluice_policies::algorithm::{fixed_window, gcra, sliding_approx, Algorithm, State, View};
use sluice_policies::key::is_encoded;
use sluice_policies::wire::{split_shown, WireLimit};
use sluice_policies::{Invalid, PolicyName};

use crate::keys::{state_keys, tag};
use crate::store::RedisClient;

/// One limit of one key, now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LimitState {
    /// What a request could still take now: requests, tokens or points, or
    /// free concurrency slots.
    pub remaining: u64,
    /// Milliseconds until capacity next frees; `None` for a concurrency
    /// limit (a slot frees when a stream ends).
    pub reset_ms: Option<u64>,
    /// Concurrency: leases held right now, by any gateway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<u64>,
    /// Concurrency: requests queued for a slot (egress wait), fleet-wide.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiters: Option<u64>,
}

/// Why a key's state could not be read; the page shows it beside the key.
/// Cloned: one failed clock read is every key's error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StateError {
    #[error("redis: {0}")]
    Redis(Arc<redis::RedisError>),
    /// The key names a level the policy does not have.
    #[error("no level {0:?}")]
    NoLevel(String),
    #[error("the levels do not fit the limits")]
    LevelsDoNotFit,
    #[error("invalid level name or key")]
    LevelKey,
    /// The policy's name or key, or a limit, fails the checks of a request.
    #[error(transparent)]
    Key(#[from] Invalid),
}

impl From<redis::RedisError> for StateError {
    fn from(err: redis::RedisError) -> StateError {
        StateError::Redis(Arc::new(err))
    }
}

/// Redis's clock, in microseconds: the scripts' clock too.
pub async fn now_us(store: &RedisClient) -> Result<u64, StateError> {
    let (secs, micros): (u64, u64) = store.query(&redis::cmd("TIME")).await?;
    Ok(secs * 1_000_000 + micros)
}

/// The state of `policy`'s key `shown` (a key of `Check::shown_keys`: the
/// check's key, or one level's) at `now` (µs), one entry per limit of
/// `limits`: `None` for the limits of the other levels. `levels` are the
/// hierarchy's levels, each name with the index of its first limit.
pub async fn read(
    store: &RedisClient,
    now: u64,
    policy: &str,
    shown: &str,
    limits: &[WireLimit],
    levels: &[(String, usize)],
) -> Result<Vec<Option<LimitState>>, StateError> {
    let (key, level) = split_shown(shown);
    let next_from = |i: usize| levels.get(i).map_or(limits.len(), |l| l.1);
    let range = match &level {
        None => 0..next_from(0),
        Some(level) => {
            let i = (levels.iter().position(|(name, _)| *name == level.name))
                .ok_or_else(|| StateError::NoLevel(level.name.clone()))?;
            levels[i].1..next_from(i + 1)
        }
    };
    let mine = limits.get(range.clone()).ok_or(StateError::LevelsDoNotFit)?;
    let mut tag = tag(policy, key)?;
    if let Some(level) = &level {
        if PolicyName::new(&level.name).is_none() || !is_encoded(&level.key) {
            return Err(StateError::LevelKey);
        }
        tag = level.under(&tag);
    }
    let mut states = vec![None; limits.len()];
    for (slot, limit) in states[range].iter_mut().zip(state_keys(&tag, mine)?) {
        *slot = Some(read_one(store, now, &limit.key, limit.algorithm).await?);
    }
    Ok(states)
}

async fn read_one(
    store: &RedisClient,
    now: u64,
    key: &str,
    algorithm: Algorithm,
) -> redis::RedisResult<LimitState> {
    let state = match algorithm {
        Algorithm::FixedWindow { limit, window_us, .. } => {
            let [w, n] = hmget(store, key, ["w", "n"]).await?;
            let state = w.map(|window| State::Counter { window, count: n.unwrap_or(0) });
            timed(fixed_window::check(state.as_ref(), now, limit, window_us.get(), 1).now)
        }
        Algorithm::FirstHit { limit, window_us, .. } => {
            let [s, n] = hmget(store, key, ["s", "n"]).await?;
            let state = s.map(|start| State::Counter { window: start, count: n.unwrap_or(0) });
            timed(
                sluice_policies::algorithm::first_hit::check(state.as_ref(), now, limit, window_us.get(), 1)
                    .now,
            )
        }
        Algorithm::Calendar { limit, cost, calendar, .. } => {
            let [w, n] = hmget(store, key, ["w", "n"]).await?;
            let state = w.map(|window| State::Counter { window, count: n.unwrap_or(0) });
            let ends = calendar.ends_near(now).unwrap_or((0, 0));
            timed(sluice_policies::algorithm::calendar::check(state.as_ref(), now, limit, cost, ends).now)
        }
        Algorithm::SlidingApprox { limit, window_us } => {
            let [w, c, p] = hmget(store, key, ["w", "c", "p"]).await?;
            let state =
                w.map(|window| State::Approx { window, current: c.unwrap_or(0), previous: p.unwrap_or(0) });
            timed(sliding_approx::check(state.as_ref(), now, limit, window_us.get()).now)
        }
        Algorithm::Gcra { interval_us, burst, cost } => {
            let tat: Option<String> = store.query(redis::cmd("GET").arg(key)).await?;
            let state = tat.as_deref().and_then(number).map(State::Tat);
            timed(gcra::check(state.as_ref(), now, interval_us.get(), burst, cost).now)
        }
        Algorithm::SlidingWindow { limit, window_us } => {
            let window_us = window_us.get();
            // Entries admitted after now - window count (reservations ahead too).
            let since = format!("({}", now.saturating_sub(window_us));
            let count: u64 = store.query(redis::cmd("ZCOUNT").arg(key).arg(&since).arg("+inf")).await?;
            let oldest: Vec<(String, String)> = store
                .query(
                    redis::cmd("ZRANGEBYSCORE")
                        .arg(key)
                        .arg(&since)
                        .arg("+inf")
                        .arg("WITHSCORES")
                        .arg("LIMIT")
                        .arg(0)
                        .arg(1),
                )
                .await?;
            let oldest = oldest.first().and_then(|(_, score)| number(score));
            LimitState {
                remaining: limit.saturating_sub(count),
                reset_ms: Some(oldest.map_or(0, |s| (s + window_us).saturating_sub(now).div_ceil(1000))),
                held: None,
                waiters: None,
            }
        }
        Algorithm::Concurrency { limit, .. } => {
            // A lease scored at its expiry x is live while now < x.
            let held: u64 =
                store.query(redis::cmd("ZCOUNT").arg(key).arg(format!("({now}")).arg("+inf")).await?;
            let waiters: u64 = store.query(redis::cmd("ZCARD").arg(format!("{key}:q"))).await?;
            LimitState {
                remaining: limit.saturating_sub(held),
                reset_ms: None,
                held: Some(held),
                waiters: Some(waiters),
            }
        }
        Algorithm::Pause | Algorithm::Rate => {
            LimitState { remaining: 1, reset_ms: Some(0), held: None, waiters: None }
        }
    };
    Ok(state)
}

fn timed(view: View) -> LimitState {
    LimitState {
        remaining: view.remaining,
        reset_ms: Some(view.reset_us.div_ceil(1000)),
        held: None,
        waiters: None,
    }
}

async fn hmget<const N: usize>(
    store: &RedisClient,
    key: &str,
    fields: [&str; N],
) -> redis::RedisResult<[Option<u64>; N]> {
    let values: Vec<Option<String>> = store.query(redis::cmd("HMGET").arg(key).arg(&fields[..])).await?;
    let mut out = [None; N];
    for (slot, value) in out.iter_mut().zip(values) {
        *slot = value.as_deref().and_then(number);
    }
    Ok(out)
}

/// A number as Lua wrote it: an integer, or a float for a large one.
fn number(text: &str) -> Option<u64> {
    text.parse::<u64>().ok().or_else(|| text.parse::<f64>().ok().filter(|f| *f >= 0.0).map(|f| f as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_as_lua_writes_them() {
        assert_eq!(number("1700000000000000"), Some(1_700_000_000_000_000));
        assert_eq!(number("1.7e+15"), Some(1_700_000_000_000_000));
        assert_eq!(number("-1"), None);
        assert_eq!(number("x"), None);
    }
}
