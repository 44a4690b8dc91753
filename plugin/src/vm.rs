//! What one VM (one Envoy worker) shares between its requests: the parsed
//! document, its stats, the outage breaker, the log throttle, the release
//! and adjust calls waiting for the root context to send them, and the
//! leases of live streams it renews.

use std::cell::{Cell, RefCell};
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use sluice_policies::wire::{ReleaseResponse, ShedResponse};
use sluice_policies::Document;

use crate::breaker::{Breaker, Change};
use crate::leases::Live;
use crate::shedding::Shedding;
use crate::stats::{bump, Stats};
use crate::throttle::Throttle;

/// At most one failure-mode log line per this period, per worker.
const LOG_PERIOD_MS: u64 = 10_000;

/// A call for the root context to send: a release (with the policies, as
/// document indexes, whose slots it frees) or an adjustment (none).
pub struct Outgoing {
    pub path: &'static str,
    pub body: Vec<u8>,
    pub releases: Vec<usize>,
}

/// A lease call in flight: for which policy, when asked (the gateway's
/// clock), and the tokens it gives back.
pub struct LeaseCall {
    pub policy: usize,
    pub asked_ms: u64,
    pub given_back: u64,
}

pub struct Vm {
    pub doc: Document,
    pub stats: Stats,
    pub breaker: RefCell<Breaker>,
    throttle: RefCell<Throttle>,
    /// Queued by streams, sent by the root on its next tick.
    pub outbox: RefCell<Vec<Outgoing>>,
    /// Release calls in flight, by token.
    pub releasing: RefCell<HashMap<u32, Vec<usize>>>,
    /// The leases live streams hold, renewed by the root on its tick.
    pub live: RefCell<Live>,
    /// Load shedding: the utilization seen and the fleet's level, per policy.
    pub shedding: RefCell<Shedding>,
    /// Shed reports in flight, by token: the policy each is for.
    pub shed_calls: RefCell<HashMap<u32, usize>>,
    /// Lease calls in flight, by token.
    pub lease_calls: RefCell<HashMap<u32, LeaseCall>>,
    /// Each policy's lease pool key in shared data (document order), named
    /// once here rather than on every request.
    pool_keys: Vec<String>,
    /// The draws that decide which requests of a partly shed class go.
    rng: RefCell<fastrand::Rng>,
    /// Random per VM: with `sequence`, request ids unique across workers and gateways.
    nonce: u64,
    sequence: Cell<u64>,
}

impl Vm {
    pub fn new(doc: Document, now_ms: u64) -> Vm {
        let stats = Stats::define(&doc);
        let breaker = Breaker::new(doc.shim.failure_threshold.get(), doc.shim.cooldown_ms.get().into());
        // Seeded by the host's random source (WASI random_get).
        let nonce = RandomState::new().build_hasher().finish();
        let shedding = Shedding::new(&doc, now_ms);
        let pool_keys = doc.policies.iter().map(|p| crate::leased::pool_key(p.name.as_str())).collect();
        Vm {
            doc,
            stats,
            breaker: RefCell::new(breaker),
            throttle: RefCell::new(Throttle::new(LOG_PERIOD_MS)),
            outbox: RefCell::new(Vec::new()),
            releasing: RefCell::new(HashMap::new()),
            live: RefCell::new(Live::default()),
            shedding: RefCell::new(shedding),
            shed_calls: RefCell::new(HashMap::new()),
            lease_calls: RefCell::new(HashMap::new()),
            pool_keys,
            rng: RefCell::new(fastrand::Rng::with_seed(nonce)),
            nonce,
            sequence: Cell::new(0),
        }
    }

    /// The lease pool key of policy `index`.
    pub fn pool_key(&self, index: usize) -> Option<&str> {
        self.pool_keys.get(index).map(String::as_str)
    }

    /// A uniform draw from 0 to 1.
    pub fn draw(&self) -> f64 {
        self.rng.borrow_mut().f64()
    }

    /// A fresh request id, for the shim to name the request's lease with.
    pub fn next_id(&self) -> String {
        let n = self.sequence.get();
        self.sequence.set(n.wrapping_add(1));
        format!("{:x}-{n:x}", self.nonce)
    }

    /// Queues a call for the root context; `releases` as in [`Outgoing`].
    pub fn send_later(&self, path: &'static str, body: &impl serde::Serialize, releases: Vec<usize>) {
        match serde_json::to_vec(body) {
            Ok(body) => self.outbox.borrow_mut().push(Outgoing { path, body, releases }),
            Err(err) => log::warn!("cannot encode {path}: {err}"),
        }
    }

    /// Counts a release call's answer for the policies whose slots it frees:
    /// `status` and `body` as the call returned them, `None` if it failed.
    pub fn release_answered(
        &self,
        policies: &[usize],
        status: Option<&[u8]>,
        body: Option<&[u8]>,
        now_ms: u64,
    ) {
        if status != Some(b"200") {
            let shown = status.map(|s| String::from_utf8_lossy(s).into_owned()).unwrap_or("no answer".into());
            return self.release_failed(policies, &shown, now_ms);
        }
        match serde_json::from_slice::<ReleaseResponse>(body.unwrap_or_default()) {
            Ok(resp) if resp.released > 0 => {
                for &index in policies {
                    self.stats.count(index, |s| s.released);
                }
            }
            // Already reclaimed: the check that reclaimed it counted it.
            Ok(_) => log::debug!("lease already gone when released"),
            Err(err) => self.release_failed(policies, &format!("malformed answer: {err}"), now_ms),
        }
    }

    /// The shim answered a shed report for policy `index`: keep the fleet's
    /// level, and show each class's fraction. A failed report keeps the
    /// level it had: shedding neither starts nor stops on a shim outage.
    pub fn shed_answered(&self, index: usize, status: Option<&[u8]>, body: Option<&[u8]>) {
        if status != Some(b"200") {
            return log::debug!("shed report for policy {index} failed");
        }
        match serde_json::from_slice::<ShedResponse>(body.unwrap_or_default()) {
            Ok(resp) => {
                let mut shedding = self.shedding.borrow_mut();
                shedding.set_level(index, resp.level);
                for (class, stats) in self.stats.classes.iter().enumerate() {
                    let permille = (shedding.class_fraction(class) * 1000.0).round() as u64;
                    if let Some(id) = stats.shed_permille {
                        let _ = proxy_wasm::hostcalls::record_metric(id, permille);
                    }
                }
            }
            Err(err) => log::debug!("shed report for policy {index}: malformed answer: {err}"),
        }
    }

    /// A release call failed: the lease TTL will reclaim the slots.
    pub fn release_failed(&self, policies: &[usize], reason: &str, now_ms: u64) {
        for &index in policies {
            self.stats.count(index, |s| s.release_failed);
        }
        self.log_failure(now_ms, &format!("release failed ({reason}); the lease TTL will reclaim the slot"));
    }

    /// Logs a failure-mode decision, at most once per period per worker.
    pub fn log_failure(&self, now_ms: u64, line: &str) {
        if let Some(suppressed) = self.throttle.borrow_mut().admit(now_ms) {
            if suppressed > 0 {
                log::warn!("{line} ({suppressed} similar lines suppressed)");
            } else {
                log::warn!("{line}");
            }
        }
    }

    /// Logs and counts a breaker state change, once.
    pub fn breaker_changed(&self, change: Option<Change>) {
        let cooldown = self.doc.shim.cooldown_ms.get();
        match change {
            None => {}
            Some(Change::Opened) => {
                log::warn!("shim failing: deciding locally with failure_mode for {cooldown} ms");
                bump(self.stats.breaker_opened, 1);
                bump(self.stats.breaker_open_workers, 1);
            }
            Some(Change::Probing) => {
                log::info!("cooldown over: probing the shim");
                bump(self.stats.breaker_open_workers, -1);
            }
            Some(Change::Closed) => {
                log::warn!("shim answering again: breaker closed");
                bump(self.stats.breaker_closed, 1);
            }
        }
    }
}
