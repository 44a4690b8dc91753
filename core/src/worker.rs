//! What one worker (one proxy-wasm VM) shares between its requests, and
//! the work it does on its own: the parsed document, the outage breaker,
//! the log throttle, the calls that streams leave for it to send, the
//! leases of live streams it renews, load shedding's reports, leased
//! mode's lease calls and the reports of failure-mode passes.
//!
//! A call a stream makes is cancelled when the stream ends, which is
//! exactly when a lease is released. So a stream leaves such calls to the
//! worker as an effect ([`Effect::Defer`]), which the adapter hands over
//! ([`Worker::defer`]); the worker, which lives as long as the VM, sends
//! them on its next [`Worker::tick`] and receives their answers
//! ([`Worker::handle_answer`]).

use std::cell::{Cell, Ref, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use sluice_policies::leased::Source;
use sluice_policies::units::Millis;
use sluice_policies::wire::{
    Encoding, LeaseRequest, LeaseResponse, ReleaseResponse, ShedRequest, ShedResponse, WireLimit, LEASE_PATH,
    RENEW_PATH, REPORT_PATH, SHED_PATH,
};
use sluice_policies::Document;

use crate::breaker::{Breaker, Change, State as BreakerState};
use crate::cache::Mirror;
use crate::due::{Due, Timing, Watched};
use crate::effect::{CallId, CallResult, Deferred, Effect, Effects, Outgoing};
use crate::host::{SetError, SharedData};
use crate::hot_keys::{HotKeys, CAPACITY};
use crate::leased::{key_pool_key, pool_key, Pool};
use crate::local_reply::LocalReply;
use crate::log_throttle::LogThrottle;
use crate::now::Now;
use crate::passes::FailurePasses;
use crate::renewals::Live;
use crate::sharing::Sharing;
use crate::shedding::Shedding;
use crate::stats::{ClassStat, FilterStat, PolicyStat};

/// At most one failure-mode log line per this period, per worker.
const LOG_PERIOD_MS: u64 = 10_000;

/// How often a lease pool's compare-and-swap is tried again after another
/// worker wrote first, before the request is checked by the shim instead.
const CAS_TRIES: usize = 8;

/// The most hot keys' pools one worker ticks per keyed leased policy; a hot
/// key beyond them is checked exactly until one cools.
const MAX_TRACKED: usize = 2 * CAPACITY;

/// How often a worker with leased policies ticks their pools: a pool asks
/// for its next lease on the first tick after it runs low.
pub const LEASE_TICK_MS: u64 = 20;

/// The shortest timeout for a call nobody waits for.
const BACKGROUND_TIMEOUT_MS: u64 = 1_000;

/// A lease call sent: when (the gateway's clock), the tokens it gives back
/// and its sequence number.
#[derive(Clone, Copy)]
struct LeaseCallSent {
    asked_ms: u64,
    given_back: u64,
    seq: u64,
}

/// A background call in flight, by what its answer is for.
enum Pending {
    /// A release, with the policies whose slots it frees.
    Release(Vec<usize>),
    /// A shed report for this policy.
    Shed(usize),
    /// A lease call for a leased policy: when asked (the gateway's clock),
    /// and the tokens it gives back.
    Lease { policy: usize, key: Option<String>, asked_ms: u64, given_back: u64, seq: u64 },
    /// A report of failure-mode passes: dropped if it fails.
    Report,
    /// A token settlement a stream left: its answer's give-backs are
    /// counted for these policies ([`Deferred`]'s `settles`).
    Settle(Vec<Option<usize>>),
    /// Nothing to do with the answer (adjustments, feedback, renewals).
    Other(&'static str),
}

/// What a denial from the over-limit cache shows of its hit: the limit,
/// the wait in whole seconds, `r`.
type Shown = (usize, u64, u64);

/// A policy's last denial served from the over-limit cache, if any.
type KeptDenial = Option<(Shown, Rc<LocalReply>)>;

pub struct Worker {
    pub doc: Document,
    breaker: Watched<Breaker>,
    throttle: RefCell<LogThrottle>,
    queued: Watched<Vec<Deferred>>,
    pending: RefCell<HashMap<CallId, Pending>>,
    next_call: Cell<u32>,
    /// The leases live streams hold, renewed on the tick.
    live: Watched<Live>,
    /// Load shedding: the utilization seen and the fleet's level, per policy.
    shedding: Watched<Shedding>,
    /// Failure-mode passes not yet reported to the shim.
    passes: Watched<FailurePasses>,
    /// Each policy's lease pool key in shared data (document order), named
    /// once here rather than on every request.
    pool_keys: Vec<String>,
    /// Leased mode per key: for each keyed leased policy (document order),
    /// its hot keys as this worker sees them, and the keys whose pools this
    /// worker ticks (each at most [`MAX_TRACKED`]).
    hot: Vec<Option<RefCell<HotKeys>>>,
    tracked: RefCell<Vec<HashSet<String>>>,
    /// The draws that decide which requests of a partly shed class go.
    rng: RefCell<fastrand::Rng>,
    /// Random per worker: with `sequence`, request ids unique across workers and gateways.
    nonce: u64,
    /// The start of every request id: the nonce in hex and a dash.
    id_prefix: String,
    sequence: Cell<u64>,
    /// This worker's copy of the over-limit cache's hits, cleared each tick.
    pub(crate) over_limit: RefCell<Mirror>,
    /// Per policy, the last denial served from the over-limit cache, with
    /// what it shows of its hit (the limit, the wait in whole seconds, `r`).
    denials: RefCell<Vec<KeptDenial>>,
    /// An effect list the adapter gave back once performed, for the next event.
    spare: RefCell<Vec<Effect>>,
    /// When the last tick was, for leased mode's pools (set by the tick
    /// only, which makes `due` stale).
    ticked_ms: Cell<Option<u64>>,
    /// Whether a policy is leased: its pools are ticked every [`LEASE_TICK_MS`].
    leased: bool,
    /// Shared callouts: the check calls out, and the checks queued for the next.
    sharing: Watched<Sharing>,
    /// When the next tick is needed, kept as the parts above change.
    due: Due,
}

impl Worker {
    /// A worker for `doc`; `seed` should be random per VM (request ids and
    /// shedding's draws come from it).
    pub fn new(doc: Document, now_ms: u64, seed: u64) -> Worker {
        let breaker = Breaker::new(doc.shim.failure_threshold.get(), doc.shim.cooldown_ms.get().into());
        let shedding = Shedding::new(&doc, now_ms);
        let pool_keys = doc.policies.iter().map(|p| pool_key(p.name.as_str())).collect();
        let hot = doc
            .policies
            .iter()
            .map(|p| match p.leased {
                Some(lease) if !p.key.is_empty() => {
                    Some(RefCell::new(HotKeys::new(CAPACITY, lease.ttl_ms(), lease.tokens().into())))
                }
                _ => None,
            })
            .collect();
        let tracked = RefCell::new(vec![HashSet::new(); doc.policies.len()]);
        let policies = doc.policies.len();
        let passes = FailurePasses::new(&doc);
        let leased = doc.policies.iter().any(|p| p.leased.is_some());
        let doc_shared_calls = doc.shim.shared_calls.get();
        Worker {
            doc,
            breaker: Watched::new(breaker),
            throttle: RefCell::new(LogThrottle::new(LOG_PERIOD_MS)),
            queued: Watched::new(Vec::new()),
            pending: RefCell::new(HashMap::new()),
            next_call: Cell::new(0),
            live: Watched::new(Live::default()),
            shedding: Watched::new(shedding),
            passes: Watched::new(passes),
            pool_keys,
            hot,
            tracked,
            rng: RefCell::new(fastrand::Rng::with_seed(seed)),
            nonce: seed,
            id_prefix: format!("{seed:x}-"),
            sequence: Cell::new(0),
            over_limit: RefCell::new(Mirror::default()),
            denials: RefCell::new(vec![None; policies]),
            spare: RefCell::new(Vec::new()),
            ticked_ms: Cell::new(None),
            leased,
            sharing: Watched::new(Sharing::new(doc_shared_calls)),
            due: Due::default(),
        }
    }

    /// Shared callouts, to read.
    pub fn sharing(&self) -> Ref<'_, Sharing> {
        self.sharing.borrow()
    }

    /// Shared callouts, changed by `change`.
    pub fn change_sharing<R>(&self, change: impl FnOnce(&mut Sharing) -> R) -> R {
        self.sharing.change(&self.due, change)
    }

    /// Load shedding's state, to read.
    pub(crate) fn shedding(&self) -> Ref<'_, Shedding> {
        self.shedding.borrow()
    }

    /// Load shedding's state, changed by `change`.
    pub(crate) fn change_shedding<R>(&self, change: impl FnOnce(&mut Shedding) -> R) -> R {
        self.shedding.change(&self.due, change)
    }

    /// The leases of live streams, changed by `change`.
    pub(crate) fn change_live<R>(&self, change: impl FnOnce(&mut Live) -> R) -> R {
        self.live.change(&self.due, change)
    }

    /// An empty effect list for an event: the last one the adapter gave
    /// back ([`Worker::recycle`]), so an event allocates no list of its own.
    pub fn effects(&self) -> Effects {
        Effects(std::mem::take(&mut *self.spare.borrow_mut()))
    }

    /// An effect list the adapter has performed, kept (emptied) for the
    /// next event's effects.
    pub fn recycle(&self, mut effects: Vec<Effect>) {
        effects.clear();
        let mut spare = self.spare.borrow_mut();
        if effects.capacity() > spare.capacity() {
            *spare = effects;
        }
    }

    /// Policy `index`'s last denial from the over-limit cache, if it showed
    /// the same limit and wait (`shown`): every byte of it is the same.
    pub(crate) fn cached_denial(&self, index: usize, shown: (usize, u64, u64)) -> Option<Rc<LocalReply>> {
        match self.denials.borrow().get(index) {
            Some(Some((kept, reply))) if *kept == shown => Some(reply.clone()),
            _ => None,
        }
    }

    /// Keeps `reply` as policy `index`'s last denial from the over-limit cache.
    pub(crate) fn keep_denial(&self, index: usize, shown: (usize, u64, u64), reply: &Rc<LocalReply>) {
        if let Some(slot) = self.denials.borrow_mut().get_mut(index) {
            *slot = Some((shown, reply.clone()));
        }
    }

    /// The lease pool key of policy `index`.
    pub fn pool_key(&self, index: usize) -> Option<&str> {
        self.pool_keys.get(index).map(String::as_str)
    }

    /// Leased mode per key: counts a request for keyed leased policy
    /// `index`'s `key` (encoded) at `now`; the key's pool in shared data if
    /// the key is hot (and this worker ticks it), else `None`: the request
    /// is checked exactly. `None` for a policy without a key.
    pub fn hot_pool(&self, index: usize, key: &str, now: u64) -> Option<String> {
        let hot = self.hot.get(index)?.as_ref()?;
        if !hot.borrow_mut().observe(key, now) {
            return None;
        }
        let mut tracked = self.tracked.borrow_mut();
        let keys = tracked.get_mut(index)?;
        if !keys.contains(key) {
            if keys.len() >= MAX_TRACKED {
                return None;
            }
            keys.insert(key.to_string());
        }
        Some(key_pool_key(self.doc.policies.get(index)?.name.as_str(), key))
    }

    /// Whether policy `index` is leased per key.
    pub fn leased_per_key(&self, index: usize) -> bool {
        self.hot.get(index).is_some_and(Option::is_some)
    }

    /// A uniform draw from 0 to 1.
    pub fn draw(&self) -> f64 {
        self.rng.borrow_mut().f64()
    }

    /// A fresh request id, for the shim to name the request's lease with.
    pub fn next_id(&self) -> String {
        let n = self.sequence.get();
        self.sequence.set(n.wrapping_add(1));
        // As `format!("{nonce:x}-{n:x}")`, which costs the filter some
        // 1,800 wasm operators per request where this costs a third.
        let mut id = String::with_capacity(self.id_prefix.len() + 16);
        id.push_str(&self.id_prefix);
        push_hex(&mut id, n);
        id
    }

    /// The timeout of a call nobody waits for.
    pub fn background_timeout_ms(&self) -> u64 {
        u64::from(self.doc.shim.timeout_ms.get()).max(BACKGROUND_TIMEOUT_MS)
    }

    /// Takes a call a stream left ([`Effect::Defer`]), to send on the next tick.
    pub fn defer(&self, call: Deferred) {
        self.queued.change(&self.due, |queued| queued.push(call));
    }

    /// Whether the breaker lets a call to the shim go at `now_ms`.
    pub(crate) fn call_allowed(&self, now_ms: u64, fx: &mut Effects) -> bool {
        let (allowed, change) = self.breaker.change(&self.due, |b| b.call_allowed(now_ms));
        self.breaker_changed(change, fx);
        allowed
    }

    /// A check call sent at `sent_ms` answered readably (`ok`) or not, at `now_ms`.
    pub(crate) fn call_ended(&self, ok: bool, sent_ms: u64, now_ms: u64, fx: &mut Effects) {
        let change = self.breaker.change(&self.due, |breaker| {
            if ok {
                breaker.success(sent_ms)
            } else {
                breaker.failure(sent_ms, now_ms)
            }
        });
        self.breaker_changed(change, fx);
    }

    /// A request policy `index` applied to was let through by
    /// `failure_mode: allow`: counted for the next report to the shim.
    pub(crate) fn failure_passed(&self, index: usize) {
        self.passes.change(&self.due, |passes| passes.add(index));
    }

    /// Policy `index` denied a request from the over-limit cache: counted
    /// for the next report, so the shim's dashboard counts every denial.
    pub(crate) fn cache_denied(&self, index: usize) {
        self.passes.change(&self.due, |passes| passes.add_cache_denial(index));
    }

    /// The worker's own work, every tick: renew the leases of live streams,
    /// report shedding's utilization, ask for leases, report failure-mode
    /// passes, and send what streams queued.
    pub fn tick(&self, now: &Now, shared: &dyn SharedData) -> Vec<Effect> {
        let mut fx = self.effects();
        let now = now.ms();
        self.ticked_ms.set(Some(now));
        // The leased pools' next tick moved.
        self.due.stale();
        self.over_limit.borrow_mut().clear();
        let renewals = self.live.change(&self.due, |live| live.due(now));
        for renewal in renewals {
            match serde_json::to_vec(&renewal) {
                Ok(body) => self.send(RENEW_PATH, body, Pending::Other(RENEW_PATH), &mut fx),
                Err(err) => log::warn!("cannot encode {RENEW_PATH}: {err}"),
            }
        }
        let reports = self.shedding.change(&self.due, |shedding| shedding.due(now));
        for (index, utilization) in reports {
            let Some(policy) = self.doc.policies.get(index) else { continue };
            let Some(shed) = &policy.shed else { continue };
            let report = ShedRequest::new(policy, shed, self.doc.classes.count(), utilization);
            match serde_json::to_vec(&report) {
                Ok(body) => self.send(SHED_PATH, body, Pending::Shed(index), &mut fx),
                Err(err) => log::debug!("{SHED_PATH}: {err}"),
            }
        }
        self.ask_for_leases(shared, now, &mut fx);
        // A report waits until the shim answers again (its last call
        // succeeded): passes happen while it is failing, and a report then
        // would only add calls to a failing shim. The counts keep.
        let answering = self.breaker.borrow().seen();
        let report = if answering { self.passes.change(&self.due, |p| p.due(now, &self.doc)) } else { None };
        if let Some(report) = report {
            match serde_json::to_vec(&report) {
                Ok(body) => self.send(REPORT_PATH, body, Pending::Report, &mut fx),
                Err(err) => log::debug!("{REPORT_PATH}: {err}"),
            }
        }
        self.send_deferred_into(&mut fx);
        fx.0
    }

    /// The calls streams left ([`Worker::defer`]), sent now. The tick sends
    /// them too; an adapter that can be woken sooner (the filter's wake-up
    /// queue) sends them then, so that a freed lease goes back at once.
    pub fn send_deferred(&self) -> Vec<Effect> {
        let mut fx = self.effects();
        self.send_deferred_into(&mut fx);
        fx.0
    }

    fn send_deferred_into(&self, fx: &mut Effects) {
        let queued = self.queued.change(&self.due, std::mem::take);
        for call in queued {
            let pending = if !call.releases.is_empty() {
                Pending::Release(call.releases)
            } else if !call.settles.is_empty() {
                Pending::Settle(call.settles)
            } else {
                Pending::Other(call.path)
            };
            self.send(call.path, call.body, pending, fx);
        }
    }

    /// When the worker next needs a [`Worker::tick`], on the clock the
    /// events carry: at once (a time already past) for the calls streams
    /// left and a shared batch due, else the next renewal, shed report,
    /// report of failure-mode passes (only while the shim answers: the
    /// tick would send none), leased pools' tick or queued check's
    /// deadline. `None`: nothing is due, however long it waits. Kept as
    /// the worker's parts change (see `due`): O(1) on most events.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.due.get(|| self.next_due())
    }

    /// A count that changes whenever [`Worker::poll_timeout`] may have: an
    /// adapter that armed its timer for the poll's time need not poll
    /// again while this stays the same.
    pub fn due_moves(&self) -> u32 {
        self.due.moves()
    }

    /// [`Worker::poll_timeout`] computed from every part, from what each
    /// part's [`Timing::seen`] shows of it.
    pub(crate) fn next_due(&self) -> Option<u64> {
        let answering = self.breaker.borrow().seen();
        let pools = self.leased.then(|| self.ticked_ms.get().map_or(0, |at| at + LEASE_TICK_MS));
        let mut due = self.queued.borrow().seen();
        for part in [
            self.sharing.borrow().seen(),
            self.live.borrow().seen(),
            self.shedding.borrow().seen(),
            self.passes.borrow().seen().filter(|_| answering),
            pools,
        ] {
            due = match (due, part) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        due
    }

    fn send(&self, path: &'static str, body: Vec<u8>, pending: Pending, fx: &mut Effects) {
        let id = CallId(self.next_call.get());
        self.next_call.set(id.0.wrapping_add(1));
        self.pending.borrow_mut().insert(id, pending);
        let timeout_ms = self.background_timeout_ms();
        fx.push(Effect::Send(Outgoing {
            id,
            path,
            encoding: Encoding::Json,
            body,
            timeout_ms,
            shared: false,
        }));
    }

    /// What became of a background call the tick asked for.
    pub fn handle_answer(
        &self,
        now: &Now,
        id: CallId,
        result: CallResult,
        shared: &dyn SharedData,
    ) -> Vec<Effect> {
        let mut fx = self.effects();
        let Some(pending) = self.pending.borrow_mut().remove(&id) else { return fx.0 };
        let (status, body) = result.parts();
        match (pending, &result) {
            (Pending::Release(policies), CallResult::NotSent(reason)) => {
                self.release_failed(&policies, reason, now.ms(), &mut fx)
            }
            (Pending::Release(policies), _) => {
                self.release_answered(&policies, status, body, now.ms(), &mut fx)
            }
            (Pending::Shed(index), _) => self.shed_answered(index, status, body, &mut fx),
            (Pending::Lease { policy, key, asked_ms, given_back, seq }, _) => {
                let call = LeaseCallSent { asked_ms, given_back, seq };
                self.lease_answered(shared, now.ms(), policy, key.as_deref(), call, &result, &mut fx)
            }
            // The shim did not take it: its passes are dropped, still in Envoy's stats.
            (Pending::Report, _) if status != Some(b"200") => {
                log::debug!("{REPORT_PATH}: no 200, passes dropped")
            }
            (Pending::Report, _) => {}
            (Pending::Settle(settles), _) if status == Some(b"200") => {
                crate::llm::given_back(body.unwrap_or_default(), &settles, &mut fx)
            }
            (Pending::Settle(_), _) => log::warn!("the shim did not settle a response's tokens: {status:?}"),
            (Pending::Other(path), CallResult::NotSent(reason)) => log::warn!("{path}: {reason}"),
            (Pending::Other(_), _) => {}
        }
        fx.0
    }

    /// Counts a release call's answer for the policies whose slots it frees:
    /// `status` and `body` as the call returned them, `None` if it failed.
    pub(crate) fn release_answered(
        &self,
        policies: &[usize],
        status: Option<&[u8]>,
        body: Option<&[u8]>,
        now_ms: u64,
        fx: &mut Effects,
    ) {
        if status != Some(b"200") {
            let shown = status.map(|s| String::from_utf8_lossy(s).into_owned()).unwrap_or("no answer".into());
            return self.release_failed(policies, &shown, now_ms, fx);
        }
        match serde_json::from_slice::<ReleaseResponse>(body.unwrap_or_default()) {
            Ok(resp) if resp.released > 0 => {
                for &index in policies {
                    fx.count(index, PolicyStat::Released);
                }
            }
            // Already reclaimed: the check that reclaimed it counted it.
            Ok(_) => log::debug!("lease already gone when released"),
            Err(err) => self.release_failed(policies, &format!("malformed answer: {err}"), now_ms, fx),
        }
    }

    /// A release call failed: the lease TTL will reclaim the slots.
    fn release_failed(&self, policies: &[usize], reason: &str, now_ms: u64, fx: &mut Effects) {
        for &index in policies {
            fx.count(index, PolicyStat::ReleaseFailed);
        }
        self.log_failure(now_ms, &format!("release failed ({reason}); the lease TTL will reclaim the slot"));
    }

    /// The shim answered a shed report for policy `index`: keep the fleet's
    /// level, and show each class's fraction. A failed report keeps the
    /// level it had: shedding neither starts nor stops on a shim outage.
    fn shed_answered(&self, index: usize, status: Option<&[u8]>, body: Option<&[u8]>, fx: &mut Effects) {
        if status != Some(b"200") {
            return log::debug!("shed report for policy {index} failed");
        }
        match serde_json::from_slice::<ShedResponse>(body.unwrap_or_default()) {
            Ok(resp) => {
                self.shedding.change(&self.due, |shedding| shedding.set_level(index, resp.level));
                let shedding = self.shedding.borrow();
                for class in 0..self.doc.classes.0.len() {
                    let permille = (shedding.class_fraction(class) * 1000.0).round() as u64;
                    fx.push(Effect::Class { class, stat: ClassStat::ShedPermille, n: permille });
                }
            }
            Err(err) => log::debug!("shed report for policy {index}: malformed answer: {err}"),
        }
    }

    /// Leased mode: for each leased policy, the pool's rule says whether to
    /// ask for the next lease or give unused tokens back now; one worker
    /// claims the call in the pool, so one proxy has one call in flight.
    fn ask_for_leases(&self, shared: &dyn SharedData, now: u64, fx: &mut Effects) {
        for (index, policy) in self.doc.policies.iter().enumerate() {
            let Some(lease) = policy.leased else { continue };
            if !self.leased_per_key(index) {
                let Some(key) = self.pool_key(index) else { continue };
                self.ask_for_lease(shared, index, None, key, lease, now, fx);
                continue;
            }
            let keys: Vec<String> =
                self.tracked.borrow().get(index).map(|k| k.iter().cloned().collect()).unwrap_or_default();
            let name = policy.name.as_str();
            let mut cooled = Vec::new();
            let store = shared;
            for key in keys {
                let pool = key_pool_key(name, &key);
                let idle = self.ask_for_lease(store, index, Some(&key), &pool, lease, now, fx);
                let hot = self
                    .hot
                    .get(index)
                    .and_then(Option::as_ref)
                    .is_some_and(|h| h.borrow_mut().is_hot(&key, now));
                if idle && !hot {
                    cooled.push(key);
                }
            }
            // A key no longer hot whose pool is empty and quiet: no longer ticked here.
            if let Some(keys) = self.tracked.borrow_mut().get_mut(index) {
                for key in &cooled {
                    keys.remove(key);
                }
            }
        }
    }

    /// One pool's tick: the call to make, if any, sent. Whether the pool is
    /// idle after it (no tokens, no call unanswered).
    #[allow(clippy::too_many_arguments)]
    fn ask_for_lease(
        &self,
        store: &dyn SharedData,
        index: usize,
        key: Option<&str>,
        shared: &str,
        lease: sluice_policies::leased::Leased,
        now: u64,
        fx: &mut Effects,
    ) -> bool {
        let Some(policy) = self.doc.policies.get(index) else { return true };
        let tick = |pool: &mut Pool| {
            pool.adopt(self.nonce);
            let ask = pool.tick(lease, now).map(|ask| (ask, pool.call_id()));
            (ask, pool.tokens == 0 && pool.unanswered.is_none())
        };
        let Some((ask, idle)) = update_pool(store, shared, tick) else { return false };
        let Some((ask, call)) = ask else { return idle };
        let Some(limit) = policy.limits.first() else { return idle };
        let request = LeaseRequest {
            policy: policy.name.as_str().to_string(),
            key: key.unwrap_or_default().to_string(),
            limit: WireLimit::with_cost(limit, 1),
            want: ask.want,
            give_back: ask.give_back,
            ttl_ms: (lease.source() == Source::Bucket).then_some(Millis(lease.ttl_ms())),
            now_us: None,
            call: Some(call),
        };
        match serde_json::to_vec(&request) {
            Ok(body) => {
                let given_back = ask.give_back.map_or(0, |b| u64::from(b.tokens));
                let key = key.map(str::to_string);
                let pending = Pending::Lease { policy: index, key, asked_ms: now, given_back, seq: call.seq };
                self.send(LEASE_PATH, body, pending, fx);
            }
            Err(err) => log::debug!("{LEASE_PATH}: {err}"),
        }
        false
    }

    /// A lease call's answer: the grant goes into the pool; a failure quiets
    /// it for a while (its requests are checked exactly meanwhile). A call
    /// the shim may have run whose answer did not come is sent again; one
    /// it refused (4xx) ran nothing and is dropped.
    #[allow(clippy::too_many_arguments)]
    fn lease_answered(
        &self,
        shared: &dyn SharedData,
        now: u64,
        index: usize,
        hot_key: Option<&str>,
        sent: LeaseCallSent,
        result: &CallResult,
        fx: &mut Effects,
    ) {
        let LeaseCallSent { asked_ms, given_back, seq } = sent;
        let Some(policy) = self.doc.policies.get(index) else { return };
        let Some(lease) = policy.leased else { return };
        let per_key = hot_key.map(|k| key_pool_key(policy.name.as_str(), k));
        let Some(key) = per_key.as_deref().or(self.pool_key(index)) else { return };
        let answer = match result {
            CallResult::NotSent(reason) => Err(reason.clone()),
            CallResult::Answered { status: Some(status), body } if status.as_slice() == b"200" => {
                serde_json::from_slice::<LeaseResponse>(body.as_deref().unwrap_or_default())
                    .map_err(|e| e.to_string())
            }
            CallResult::Answered { status: Some(other), .. } => {
                Err(format!("status {}", String::from_utf8_lossy(other)))
            }
            CallResult::Answered { status: None, .. } => Err("no answer".to_string()),
        };
        match answer {
            Ok(answer) => {
                let taken = update_pool(shared, key, |pool| pool.answered(seq, lease, asked_ms, now, answer));
                if taken == Some(true) {
                    fx.add(index, PolicyStat::LeaseGranted, answer.granted.into());
                    fx.add(index, PolicyStat::LeaseGivenBack, given_back);
                }
            }
            Err(reason) => {
                fx.count(index, PolicyStat::LeaseFailed);
                if matches!(result, CallResult::NotSent(_)) {
                    log::debug!("{LEASE_PATH}: {reason}");
                } else {
                    self.log_failure(
                        now,
                        &format!(
                            "lease call for policy {} failed ({reason}); exact checks until it is retried",
                            policy.name
                        ),
                    );
                }
                let refused = matches!(result, CallResult::Answered { status: Some(s), .. } if s.first() == Some(&b'4'));
                if refused {
                    update_pool(shared, key, |pool| pool.failed(now));
                } else {
                    update_pool(shared, key, |pool| pool.lost(seq, now));
                }
            }
        }
    }

    /// Logs a failure-mode decision, at most once per period per worker.
    pub(crate) fn log_failure(&self, now_ms: u64, line: &str) {
        if let Some(suppressed) = self.throttle.borrow_mut().admit(now_ms) {
            if suppressed > 0 {
                log::warn!("{line} ({suppressed} similar lines suppressed)");
            } else {
                log::warn!("{line}");
            }
        }
    }

    /// Logs and counts a breaker state change, once.
    fn breaker_changed(&self, change: Option<Change>, fx: &mut Effects) {
        let cooldown = self.doc.shim.cooldown_ms.get();
        match change {
            None => {}
            Some(Change::Opened) => {
                log::warn!("shim failing: deciding locally with failure_mode for {cooldown} ms");
                fx.filter(FilterStat::BreakerOpened, 1);
                fx.filter(FilterStat::BreakerOpenWorkers, 1);
            }
            Some(Change::Probing) => {
                log::info!("cooldown over: probing the shim");
                fx.filter(FilterStat::BreakerOpenWorkers, -1);
            }
            Some(Change::Closed) => {
                log::warn!("shim answering again: breaker closed");
                fx.filter(FilterStat::BreakerClosed, 1);
            }
        }
    }
}

/// Appends `n` in lower-case hex, without leading zeros (as `{n:x}`).
fn push_hex(out: &mut String, n: u64) {
    let digits = if n == 0 { 1 } else { 16 - n.leading_zeros() as usize / 4 };
    for shift in (0..digits).rev() {
        let digit = ((n >> (shift * 4)) & 0xf) as u32;
        out.extend(char::from_digit(digit, 16));
    }
}

/// Applies `rule` to the lease pool at `key` in shared data, read and
/// written with compare-and-swap: on a conflict the pool is read again and
/// the rule applied again. `None` when it could not be stored, so nothing
/// the rule did happened. A pool that is absent or unreadable starts empty
/// (its tokens, if any, are lost: under-admission, never over).
pub fn update_pool<R, S: SharedData + ?Sized>(
    shared: &S,
    key: &str,
    mut rule: impl FnMut(&mut Pool) -> R,
) -> Option<R> {
    for _ in 0..CAS_TRIES {
        let (bytes, cas) = shared.get(key);
        let mut pool = bytes.as_deref().and_then(Pool::decode).unwrap_or_default();
        let out = rule(&mut pool);
        match shared.set(key, &pool.encode(), cas) {
            Ok(()) => return Some(out),
            Err(SetError::Conflict) => continue,
            Err(SetError::Failed(reason)) => {
                log::debug!("cannot write the lease pool {key}: {reason}");
                return None;
            }
        }
    }
    None
}

/// Calls that streams left: due at once.
impl Timing for Vec<Deferred> {
    type Seen = Option<u64>;
    fn seen(&self) -> Option<u64> {
        (!self.is_empty()).then_some(0)
    }
}

/// A batch to send: due at once; else the next queued check's deadline.
impl Timing for Sharing {
    type Seen = Option<u64>;
    fn seen(&self) -> Option<u64> {
        if self.batch_due() {
            return Some(0);
        }
        self.poll_timeout()
    }
}

impl Timing for Live {
    type Seen = Option<u64>;
    fn seen(&self) -> Option<u64> {
        self.next_due()
    }
}

impl Timing for Shedding {
    type Seen = Option<u64>;
    fn seen(&self) -> Option<u64> {
        self.next_due()
    }
}

impl Timing for FailurePasses {
    type Seen = Option<u64>;
    fn seen(&self) -> Option<u64> {
        self.next_due()
    }
}

/// Whether the shim answers (its last call succeeded): failure-mode passes
/// are reported only then.
impl Timing for Breaker {
    type Seen = bool;
    fn seen(&self) -> bool {
        matches!(self.state(), BreakerState::Closed { failures: 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::push_hex;

    /// A request id's hex is exactly `{:x}`'s.
    #[test]
    fn push_hex_writes_what_format_writes() {
        for n in [0, 1, 9, 10, 15, 16, 255, 256, 0xabc_def, u64::from(u32::MAX), u64::MAX - 1, u64::MAX] {
            let mut out = String::from("x-");
            push_hex(&mut out, n);
            assert_eq!(out, format!("x-{n:x}"));
        }
    }
}
