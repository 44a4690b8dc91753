//! The leases of one worker's live streams, and when each is due for
//! renewal. A lease lasts a fixed time from its check; a stream that runs
//! longer would lose it, and the check that reclaims it would admit one more
//! than the limit. So while a stream holds its lease, the root context renews
//! it (`/v1/renew`) every third of its length: a renewal may be late by up
//! to two thirds of a lease before the slot is lost. Pure: the caller gives
//! the time.

use std::collections::HashMap;

use sluice_policies::wire::{RenewRequest, WireLimit};

/// The renewals per lease length.
const RENEWALS_PER_LEASE: u64 = 3;

#[derive(Default)]
pub struct Live {
    leases: HashMap<String, Held>,
    /// No renewal is due before this (one may be due later: a lease that
    /// ended since is still counted until the next [`Live::due`]).
    next_ms: Option<u64>,
}

struct Held {
    request: RenewRequest,
    every_ms: u64,
    due_ms: u64,
}

impl Live {
    /// A stream was admitted at `now_ms` with the lease `request` names.
    /// Renewed for its shortest concurrency limit's lease; a request without
    /// one holds nothing to renew.
    pub fn hold(&mut self, request: RenewRequest, now_ms: u64) {
        let shortest = request.checks.iter().flat_map(|c| &c.limits).filter_map(WireLimit::lease_ms).min();
        let Some(lease_ms) = shortest else { return };
        let every_ms = (lease_ms.get() / RENEWALS_PER_LEASE).max(1);
        let due_ms = now_ms + every_ms;
        self.next_ms = Some(self.next_ms.map_or(due_ms, |next| next.min(due_ms)));
        self.leases.insert(request.lease.clone(), Held { request, every_ms, due_ms });
    }

    /// The stream holding `lease` released it, or ended.
    pub fn end(&mut self, lease: &str) {
        self.leases.remove(lease);
    }

    /// The renewals due at `now_ms`; each is due again a third of its lease later.
    pub fn due(&mut self, now_ms: u64) -> Vec<RenewRequest> {
        let mut out = Vec::new();
        for held in self.leases.values_mut().filter(|h| h.due_ms <= now_ms) {
            held.due_ms = now_ms + held.every_ms;
            out.push(held.request.clone());
        }
        self.next_ms = self.leases.values().map(|h| h.due_ms).min();
        out
    }

    /// When the next renewal may be due, if any lease is held; read on
    /// every event, so kept rather than computed.
    pub fn next_due(&self) -> Option<u64> {
        self.next_ms
    }

    /// How many leases are held (for the tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.leases.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policies::units::Millis;
    use sluice_policies::wire::Check;

    fn request(lease: &str, limits: Vec<WireLimit>) -> RenewRequest {
        let check = Check {
            policy: "p".into(),
            key: "k".into(),
            limits,
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        };
        RenewRequest { lease: lease.into(), checks: vec![check] }
    }

    fn pool(lease_ms: u64) -> WireLimit {
        WireLimit::Concurrency { limit: 3, lease_ms: Millis(lease_ms) }
    }

    #[test]
    fn a_live_lease_is_renewed_every_third_of_its_length() {
        let mut live = Live::default();
        live.hold(request("a", vec![pool(3_000)]), 0);
        assert!(live.due(999).is_empty());
        let due = live.due(1_000);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].lease, "a");
        assert!(live.due(1_999).is_empty(), "renewed at 1 s, due again at 2 s");
        assert_eq!(live.due(2_000).len(), 1);
    }

    #[test]
    fn a_late_tick_renews_once_and_counts_from_then() {
        let mut live = Live::default();
        live.hold(request("a", vec![pool(3_000)]), 0);
        assert_eq!(live.due(2_500).len(), 1);
        assert!(live.due(3_499).is_empty());
        assert_eq!(live.due(3_500).len(), 1);
    }

    #[test]
    fn the_shortest_lease_sets_the_pace() {
        let mut live = Live::default();
        let time = WireLimit::Interval { every_ms: Millis(10) };
        live.hold(request("a", vec![pool(30_000), time, pool(600)]), 0);
        assert_eq!(live.due(200).len(), 1);
    }

    #[test]
    fn an_ended_stream_is_renewed_no_more() {
        let mut live = Live::default();
        live.hold(request("a", vec![pool(3_000)]), 0);
        live.hold(request("b", vec![pool(3_000)]), 0);
        live.end("a");
        let due = live.due(1_000);
        assert_eq!(due.iter().map(|r| r.lease.as_str()).collect::<Vec<_>>(), ["b"]);
        assert_eq!(live.len(), 1);
    }

    #[test]
    fn a_request_without_a_concurrency_limit_holds_nothing() {
        let mut live = Live::default();
        live.hold(request("a", vec![WireLimit::Interval { every_ms: Millis(10) }]), 0);
        assert_eq!(live.len(), 0);
        assert!(live.due(u64::MAX / 2).is_empty());
    }
}
