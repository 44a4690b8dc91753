//! The RLS face's over-limit cache: a call the shim found over its limit is
//! refused again from the shim's memory, with no Redis call, until the
//! moment the shim could admit it.
//!
//! The rules and the entries are core's over-limit cache, the filter's
//! ([`sluice_core::cache`]): an entry is written only when every limit that
//! denied is time-based with a known wait and cannot be refunded, never for
//! a policy that waits; its deadline is the time the check was sent plus
//! that wait; it is keyed by the whole check, a collision is a miss, and it
//! never admits. This module is only its store, the shim's memory where the
//! filter has Envoy's shared data ([`Memory`]), and how a call's groups use
//! it ([`Memory::deny`], [`Memory::record`]).
//!
//! **A group at a time.** Each group of a plan is one request to the
//! limiter, all or nothing. It is answered from memory only when *every*
//! check in it has a live entry: then the limiter would refuse it at once
//! and charge nothing. A group with any other check goes to Redis, which
//! alone knows that check's state.
//!
//! **Counted refusals** (`charge: every_hit`). Redis counts a refused
//! cost; memory's refusal counts nothing, and no decision changes for it:
//! a window that refused holds more than its limit, so it refuses every
//! cost until its end, the entry's deadline is never later than that end,
//! and the next window is a counter of its own. envoyproxy/ratelimit's own
//! cache of over-limit keys skips its increment alike. A check of several
//! limits is not recorded then: while one of its windows refuses, Redis
//! counts the cost in the others too, which memory would not.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use sluice_core::cache::OverLimitCache;
use sluice_core::{SetError, SharedData};
use sluice_policies::algorithm::Refusals;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{Check, CheckOutcome, CheckResponse, LimitOutcome};
use sluice_policies::Policy;

/// The most entries memory holds: the most slots a document can ask for
/// (`over_limit_cache_slots`), so a reload to fewer slots leaves at most
/// that many behind.
pub const MAX_ENTRIES: usize = 65_536;

/// The cache's store: one value per slot key, shared by every request the
/// faces answer, bounded by [`MAX_ENTRIES`].
#[derive(Debug, Default)]
pub struct Memory {
    entries: Mutex<HashMap<String, Vec<u8>>>,
}

impl SharedData for Memory {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        (entries.get(key).cloned(), None)
    }

    fn set(&self, key: &str, value: &[u8], _cas: Option<u32>) -> Result<(), SetError> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let full = entries.len() >= MAX_ENTRIES;
        match entries.get_mut(key) {
            Some(entry) => {
                entry.clear();
                entry.extend_from_slice(value);
            }
            None if full => return Err(SetError::Failed(format!("{MAX_ENTRIES} entries already"))),
            None => {
                entries.insert(key.to_string(), value.to_vec());
            }
        }
        Ok(())
    }
}

impl Memory {
    /// The limiter's answer to the group `checks` (each of its policy in
    /// `policies`) at `now_ms`, from memory: a denial when every check has a
    /// live entry in a cache of `slots`; `None` otherwise (Redis answers).
    pub fn deny(
        &self,
        slots: u32,
        policies: &[&Policy],
        checks: &[Check],
        now_ms: u64,
    ) -> Option<CheckResponse> {
        if checks.is_empty() || policies.len() != checks.len() {
            return None;
        }
        let cache = OverLimitCache::new(self, slots);
        let mut outcomes = Vec::with_capacity(checks.len());
        let mut wait_ms = 0;
        for (policy, check) in policies.iter().zip(checks) {
            let hit = cache.lookup(policy, check, now_ms)?;
            wait_ms = wait_ms.max(hit.wait_ms);
            let limits = check.limits.iter().enumerate();
            let limits = limits.map(|(i, l)| if i == hit.limit { hit.outcome(l) } else { unknown() });
            outcomes.push(CheckOutcome { limits: limits.collect(), paused_ms: None });
        }
        Some(CheckResponse {
            allowed: false,
            retry_after_ms: Some(Millis(wait_ms)),
            checks: outcomes,
            lease: None,
            waited_ms: None,
        })
    }

    /// Records the limiter's answer `resp` to the group `checks`, sent at
    /// `sent_ms`, whose refusals were charged as `refusals` says: each check
    /// it refused, where core's rules allow (counted: only checks of one
    /// limit, above).
    pub fn record(
        &self,
        slots: u32,
        policies: &[&Policy],
        checks: &[Check],
        resp: &CheckResponse,
        sent_ms: u64,
        refusals: Refusals,
    ) {
        if resp.allowed {
            return;
        }
        let cache = OverLimitCache::new(self, slots);
        for ((policy, check), outcome) in policies.iter().zip(checks).zip(&resp.checks) {
            if refusals == Refusals::Counted && check.limits.len() > 1 {
                continue;
            }
            cache.record(policy, check, outcome, sent_ms);
        }
    }
}

/// A limit an entry says nothing of (only the one that refused longest is
/// kept): shown as admitting with all it could hold, which never outranks
/// the refusal beside it in its check (a refusal is the most restrictive,
/// [`sluice_core::ratelimit_headers::most_restrictive`]), so no answer
/// shows it.
fn unknown() -> LimitOutcome {
    LimitOutcome {
        allowed: true,
        remaining: u64::MAX,
        reset_ms: Millis(0),
        retry_after_ms: Some(Millis(0)),
        reclaimed: 0,
        held_until_us: None,
        refunded_us: Micros(0),
    }
}
