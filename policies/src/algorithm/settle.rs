//! `settle`: a settlement (`adjust`) applied once, and a refund that gives
//! back exactly its own charge's unused part. Twin of `lua/lib/settle.lua`.
//!
//! **Once.** Each key records the ids of the settlements applied to it
//! ([`State::Settled`], Redis: `:s`) for [`SETTLED_US`]: the same settlement
//! sent again changes nothing.
//!
//! **Exactly its own.** Charges lie on the bucket's `tat` axis in the order
//! they were made. A refund cuts the tail of its own charge and moves every
//! later charge earlier by as much, never an earlier one. The refund log
//! ([`State::Given`], Redis: `:g`) holds each refund as (the refund counter
//! before it, the end its charge had then, the µs it gave back), so where a
//! charge ends now is where its check left it less the logged refunds since
//! of the charges that ended before it ([`charge_end`]). `refund.lua` (a
//! Cluster's charge-then-refund, [`super::refund`]) logs its refunds too. A
//! refund the log does not hold (trimmed past [`LOG_MAX`], or one whose
//! charge's end was not known) may have been of a charge before it or
//! after: the end is then
//! kept as two bounds and the refund takes the lower, which can only
//! under-refund. (Before the log, every refund since a charge was taken as
//! one before it: six charges settled newest first gave the oldest nothing
//! back.)

use std::collections::BTreeMap;

use super::{RedisTwin, State};

/// How long a key remembers a settlement's id: an hour.
pub const SETTLED_US: u64 = 3_600_000_000;
/// The most refunds a bucket's log holds.
pub const LOG_MAX: usize = 512;

/// The key of a key's settled ids ([`State::Settled`]).
pub fn settled_key(key: &str) -> String {
    format!("{key}:s")
}

/// The key of a bucket's refund log ([`State::Given`]).
pub fn log_key(key: &str) -> String {
    format!("{key}:g")
}

/// Whether settlement `id` was applied to `key` already; if not, records
/// it. No id (an older filter) is never recorded.
pub fn settled_before(store: &mut RedisTwin, key: &str, now: u64, id: Option<&str>) -> bool {
    let Some(id) = id else { return false };
    let entry = store.keys.entry(settled_key(key)).or_insert_with(|| State::Settled(BTreeMap::new()));
    if !matches!(entry, State::Settled(_)) {
        *entry = State::Settled(BTreeMap::new());
    }
    let State::Settled(ids) = entry else { return false };
    if ids.contains_key(id) {
        return true;
    }
    ids.retain(|_, at| *at > now.saturating_sub(SETTLED_US));
    ids.insert(id.to_string(), now);
    false
}

/// The bucket's refund log: (counter before, end, shift) per refund, oldest first.
pub fn log<'s>(store: &'s RedisTwin, key: &str) -> &'s [(u64, u64, u64)] {
    match store.keys.get(&log_key(key)) {
        Some(State::Given(entries)) => entries,
        _ => &[],
    }
}

/// Where the charge a check left ending at `held_until`, with the refund
/// counter then at `at_check`, ends now, by `log`; the counter is
/// `refunded` now. Exact when the log holds every refund since the check;
/// never later than the charge's true end.
pub fn charge_end(log: &[(u64, u64, u64)], held_until: u64, at_check: u64, refunded: u64) -> u64 {
    let first = log.partition_point(|&(c, _, _)| c < at_check);
    let (mut low, mut high, mut at) = (held_until, held_until, at_check);
    for &(c, end, shift) in &log[first..] {
        // Refunds not logged, before this one.
        low = low.saturating_sub(c - at);
        if end < low {
            low = low.saturating_sub(shift);
            high = high.saturating_sub(shift);
        } else if end < high {
            low = low.saturating_sub(shift);
        }
        at = c + shift;
    }
    low.saturating_sub(refunded.saturating_sub(at))
}

/// Logs a refund of `shift` µs of the charge ending at `end`, made with the
/// counter at `refunded`; the newest [`LOG_MAX`] are kept.
pub fn log_refund(store: &mut RedisTwin, key: &str, refunded: u64, end: u64, shift: u64) {
    let entry = store.keys.entry(log_key(key)).or_insert_with(|| State::Given(Vec::new()));
    if !matches!(entry, State::Given(_)) {
        *entry = State::Given(Vec::new());
    }
    if let State::Given(entries) = entry {
        entries.push((refunded, end, shift));
        let over = entries.len().saturating_sub(LOG_MAX);
        entries.drain(..over);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two charges of 10 µs from 0: [0, 10] and [10, 20]. The later's
    /// refund of 5 leaves the earlier where it was; the earlier's refund of
    /// 5 moves the later to end at 15.
    #[test]
    fn a_refund_moves_only_the_charges_after_it() {
        let later_first = [(0, 20, 5)];
        assert_eq!(charge_end(&later_first, 10, 0, 5), 10);
        let earlier_first = [(0, 10, 5)];
        assert_eq!(charge_end(&earlier_first, 20, 0, 5), 15);
    }

    /// A refund the log does not hold counts as one before the charge.
    #[test]
    fn an_unlogged_refund_counts_as_before() {
        assert_eq!(charge_end(&[], 20, 0, 5), 15);
        // Unlogged 3, then a logged refund ending at 16, before the lower
        // bound 17: both bounds move.
        assert_eq!(charge_end(&[(3, 16, 4)], 20, 0, 7), 13);
    }
}
