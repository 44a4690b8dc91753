//! The RLQS face's decisions: one RLQS stream (one Envoy's
//! `rate_limit_quota` filter) as a sans-IO state machine. Events go in, each
//! with the time (milliseconds on a monotonic clock): the usage reports
//! Envoy sends for its buckets, the answers of the lease calls, a tick.
//! Effects come out as values: [`Action`]s (one `RateLimitQuotaResponse`:
//! assign a bucket a token bucket, `deny_all` or `allow_all`, or abandon
//! it) and [`LeaseCall`]s (take tokens from a window in Redis, or give some
//! back: `lua/scripts/lease.lua`, the leased-mode script, with its call ids
//! so a lost answer is charged once). The shim's gRPC service only drives it.
//!
//! - [`Stream::handle_report`]: a bucket's usage since its last report,
//!   with what governs it (`sluice_policies::rlqs::govern`).
//! - [`Stream::handle_lease`]: a lease call's answer, or why there is none.
//! - [`Stream::tick`]: time passes: assignments expire, are extended, a
//!   window ends, idle buckets are abandoned.
//! - [`Stream::poll_actions`], [`Stream::poll_calls`]: what to do now.
//!
//! How each bucket is enforced, and why Envoy never spends more than was
//! charged to the window, is in [`bucket`] and `docs/rlqs.md`.

pub mod bucket;

use std::collections::HashMap;

use sluice_policies::rlqs::Governed;
use sluice_policies::wire::{LeaseRequest, LeaseResponse};

pub use bucket::Bucket;

/// A bucket id: the map Envoy's `bucket_id_builder` built, sorted by key.
pub type BucketId = Vec<(String, String)>;

/// The longest an assignment may take to reach Envoy and be applied by
/// every worker (the stream's one-way delay, Envoy's main thread, the
/// workers' next look at their thread-local copy): the bounds rest on it.
pub const DELIVERY_MS: u64 = 250;
/// How often the driver should call [`Stream::tick`].
pub const TICK_MS: u64 = 50;
/// A bucket with no request for this long, and nothing live, is abandoned.
pub const IDLE_MS: u64 = 300_000;
/// The life of an `allow_all` or `deny_all` that stands for a policy
/// (unmatched, unlimited, a missing key), renewed while Envoy reports the bucket.
pub const BLANKET_TTL_S: u64 = 60;
/// A token bucket that lasts a year per token: Envoy's slowest refill
/// (`fill_interval`), so an assignment of `n` tokens spends at most `n`
/// within any window shorter than a year.
pub const FILL_INTERVAL_S: u64 = 365 * 24 * 3600;

/// One bucket's usage since its last report, as Envoy counted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub id: BucketId,
    pub allowed: u64,
    pub denied: u64,
}

/// What Envoy is told to enforce for a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// A token bucket of `tokens` that refills one token a year
    /// ([`FILL_INTERVAL_S`]).
    TokenBucket {
        tokens: u32,
    },
    AllowAll,
    DenyAll,
}

/// One bucket action of a `RateLimitQuotaResponse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A quota assignment, for `ttl_s` whole seconds (at least 1).
    Assign { id: BucketId, strategy: Strategy, ttl_s: u64 },
    /// Envoy forgets the bucket (and stops reporting it).
    Abandon { id: BucketId },
}

/// A lease call to make for bucket `id`: its `seq` comes back with the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseCall {
    pub id: BucketId,
    pub seq: u64,
    pub request: LeaseRequest,
}

/// What became of a lease call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseResult {
    Answered(LeaseResponse),
    /// No answer, and the shim may have run it (a timeout, Redis failing):
    /// it is sent again, unchanged, and charged once.
    Lost,
    /// Refused before anything ran (a bad request): dropped.
    Refused,
}

/// One RLQS stream's buckets, and the effects waiting to be performed.
#[derive(Debug, Default)]
pub struct Stream {
    buckets: HashMap<BucketId, Bucket>,
    actions: Vec<Action>,
    calls: Vec<LeaseCall>,
    /// Makes each bucket's id in the lease calls' record.
    random: u64,
}

impl Stream {
    /// A stream; `seed` should differ between streams (the buckets' ids in
    /// the lease calls' record are drawn from it).
    pub fn new(seed: u64) -> Stream {
        // splitmix64, so that nearby seeds give unrelated ids.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Stream { random: (z ^ (z >> 31)).max(1), ..Stream::default() }
    }

    /// Whether the stream has reported bucket `id`.
    pub fn knows(&self, id: &BucketId) -> bool {
        self.buckets.contains_key(id)
    }

    /// How many buckets the stream holds.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// A bucket, for tests and metrics.
    pub fn bucket(&self, id: &BucketId) -> Option<&Bucket> {
        self.buckets.get(id)
    }

    /// A usage report of one bucket, governed by `governed` now. A bucket
    /// reported for the first time is created; one whose governing policy
    /// changed (a reloaded document) follows its new policy at once.
    pub fn handle_report(&mut self, now: u64, report: &Report, governed: Governed) {
        if !self.buckets.contains_key(&report.id) {
            let gateway = self.next_random();
            self.buckets.insert(report.id.clone(), Bucket::new(governed.clone(), gateway));
        }
        let Some(bucket) = self.buckets.get_mut(&report.id) else { return };
        let mut out = bucket::Out { id: &report.id, actions: &mut self.actions, calls: &mut self.calls };
        bucket.handle_report(now, report.allowed, report.denied, governed, &mut out);
    }

    /// The answer to bucket `id`'s lease call `seq`, or why there is none.
    pub fn handle_lease(&mut self, now: u64, id: &BucketId, seq: u64, result: LeaseResult) {
        if let Some(bucket) = self.buckets.get_mut(id) {
            let mut out = bucket::Out { id, actions: &mut self.actions, calls: &mut self.calls };
            bucket.handle_lease(now, seq, result, &mut out);
        }
    }

    /// Time passes; every [`TICK_MS`] or so.
    pub fn tick(&mut self, now: u64) {
        let (actions, calls) = (&mut self.actions, &mut self.calls);
        self.buckets.retain(|id, bucket| {
            let mut out = bucket::Out { id, actions, calls };
            bucket.tick(now, &mut out)
        });
    }

    /// The bucket actions to send now, as one response (none: send nothing).
    pub fn poll_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// The lease calls to make now.
    pub fn poll_calls(&mut self) -> Vec<LeaseCall> {
        std::mem::take(&mut self.calls)
    }

    /// xorshift64: ids for the lease calls' record, distinct within a stream.
    fn next_random(&mut self) -> u64 {
        let mut x = self.random;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random = x;
        x
    }
}
