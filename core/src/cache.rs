//! The over-limit cache: once the shim denies a check on time-based limits
//! with a known wait, every worker denies the same check locally, without
//! asking the shim, until that moment.
//!
//! **Exact.** An entry is written only when every limit that denied is
//! time-based with a known `retry_after_ms` and cannot be refunded: never for
//! a `concurrency` limit (a release frees a slot early) nor for `points` that
//! settle, with an `actual_cost_header` or in `llm_tokens` (a settlement can
//! refund, any time before the wait ends: a month's budget refused from the
//! cache stayed refused after a refund made room). Its deadline is the
//! time the check was *sent* plus the longest of those waits, so it is never
//! later than the moment the shim would admit the check: other traffic can
//! only push that moment further out. The cache never admits anything.
//!
//! **Never for a policy with `wait`.** A waiting request is refused only
//! when its slot lies beyond its wait, and that slot can move *earlier*: a
//! held request whose client goes away gives its reservation back. An entry
//! could then refuse a request the shim would hold and admit, so the cache
//! neither records nor serves checks of such policies; their refusals cost a
//! shim call, which answers at once.
//!
//! **Keyed by the whole check**: the policy, the encoded key, a hierarchy's
//! levels (names, keys and where their limits start) and the limits as sent
//! (with their cost), in a compact binary form (no JSON: the lookup
//! runs on every request). A request denied on policy A is never denied
//! locally for a request that only matches policy B, nor one with another cost.
//!
//! **Bounded.** Envoy's shared data has no TTL and no delete, so the cache is
//! a fixed array of `over_limit_cache_slots` keys `sluice:olc:<n>`, `n` the
//! FNV-1a hash of the check modulo the slot count. A write overwrites its
//! slot whatever it holds (an expired entry, or another check's: that check
//! then simply asks the shim again). Each entry holds the whole identity, so
//! a hash collision is a miss, never a wrong denial. Writes use no cas: the
//! last writer wins, and either entry is a correct one.
//!
//! **A worker's copy of its hits.** Reading shared data is a host call and a
//! copy into the guest on every request. A [`Mirror`] keeps, per worker, the
//! live entries this worker found or wrote, and serves them until the
//! worker's next tick clears it: so a denied key is read from shared data at
//! most once per tick and worker. Only hits are kept, never misses, so a
//! denial any worker records is seen by every other at once, as without the
//! copy; and an entry is a correct denial until its deadline whatever
//! overwrote its slot since, so serving the copy never refuses a request the
//! shim would admit.

use std::cell::RefCell;
use std::collections::HashMap;

use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{Check, CheckOutcome, LimitOutcome, WireLimit};
use sluice_policies::{Applied, Limit, Policy, Request};

use crate::host::SharedData;
use crate::ratelimit_headers::Fields;

/// A live entry found for a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    /// Milliseconds until the shim could admit the check.
    pub wait_ms: u64,
    /// The index, in the check, of the limit that denied it longest.
    pub limit: usize,
}

impl Hit {
    /// The refusal as the shim's outcome for `limit` (the check's limit
    /// [`Hit::limit`], as sent) shows it, from the hit alone: its wait, and
    /// what [`Fields::refused`] reads from it. A refusal's fields are read
    /// from its wait alone ([`Fields::of`]), so this outcome gives the
    /// shim's `RateLimit` fields, and the RLS face's draft-03 ones
    /// ([`draft03`](crate::ratelimit_headers::draft03)), at the same moment.
    pub fn outcome(&self, limit: &WireLimit) -> LimitOutcome {
        let wait = Millis(self.wait_ms);
        LimitOutcome {
            allowed: false,
            remaining: Fields::refused(limit, wait).remaining,
            reset_ms: wait,
            retry_after_ms: Some(wait),
            reclaimed: 0,
            held_until_us: None,
            refunded_us: Micros(0),
        }
    }
}

/// A worker's copy of the entries it found live, by slot; cleared on each
/// tick (see the module's doc).
#[derive(Debug, Default)]
pub struct Mirror {
    entries: HashMap<u32, Kept>,
    /// The identity of the check being looked up, its buffer kept between
    /// lookups: a denial served from the copy allocates nothing for it.
    identity: Vec<u8>,
}

/// An entry of the [`Mirror`], and the limit that denied as the check
/// sent it, kept as the entry is: a denial served from the copy shows that
/// limit without building it again. The entry names the limit and holds
/// every limit as sent, so the two always agree.
#[derive(Debug)]
struct Kept {
    entry: Vec<u8>,
    limit: Option<WireLimit>,
}

impl Mirror {
    /// Forgets every copy: the next lookup of each slot reads shared data.
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

pub struct OverLimitCache<'m, S> {
    store: S,
    slots: u32,
    mirror: Option<&'m RefCell<Mirror>>,
}

impl<'m, S: SharedData> OverLimitCache<'m, S> {
    /// A cache of `slots` entries; 0 turns it off.
    pub fn new(store: S, slots: u32) -> Self {
        OverLimitCache { store, slots, mirror: None }
    }

    /// The same cache, keeping this worker's hits in `mirror`.
    pub fn with_mirror(self, mirror: &'m RefCell<Mirror>) -> Self {
        OverLimitCache { mirror: Some(mirror), ..self }
    }

    /// The live entry for `check` of `policy` at `now_ms`, if any: from a
    /// built check, as the RLS face has it (the filter looks up before it
    /// builds one, [`OverLimitCache::lookup_applied`]).
    pub fn lookup(&self, policy: &Policy, check: &Check, now_ms: u64) -> Option<Hit> {
        let limit = |i: usize| check.limits.get(i).copied();
        self.find(policy, |out| write_identity(out, Parts::of(check)), limit, now_ms).map(|(hit, _)| hit)
    }

    /// The live entry for the check `applied` would send for `req` (its
    /// token reservation `reserved`, [`Applied::reserved`]), at `now_ms`, if
    /// any; read before the check is built, so a denial from the cache
    /// builds none. With the hit, the limit that denied as the check would
    /// send it ([`Hit::limit`] of [`Applied::wire_limits`]).
    pub fn lookup_applied(
        &self,
        applied: &Applied<'_>,
        req: &impl Request,
        reserved: Option<u32>,
        now_ms: u64,
    ) -> Option<(Hit, Option<WireLimit>)> {
        let parts = Parts {
            policy: applied.policy.state_name(),
            key: &applied.key,
            levels: applied.level_keys(),
            limits: applied.wire_limits(req, reserved),
        };
        let limit = |i: usize| applied.wire_limit_at(i, req, reserved);
        self.find(applied.policy, |out| write_identity(out, parts), limit, now_ms)
    }

    /// The live entry for the identity `write` writes, if any, and its
    /// limit that denied (`limit` builds it from its index in the check
    /// when the worker's copy has not kept it).
    fn find(
        &self,
        policy: &Policy,
        write: impl FnOnce(&mut Vec<u8>),
        limit: impl FnOnce(usize) -> Option<WireLimit>,
        now_ms: u64,
    ) -> Option<(Hit, Option<WireLimit>)> {
        if !caches(policy) {
            return None;
        }
        let Some(mirror) = self.mirror else {
            let mut identity = Vec::new();
            write(&mut identity);
            let (found, _) = self.read(self.slot(&identity)?, &identity, now_ms)?;
            return Some((found, limit(found.limit)));
        };
        let mut mirror = mirror.borrow_mut();
        let Mirror { entries, identity } = &mut *mirror;
        write(identity);
        let slot = self.slot(identity)?;
        if let Some(kept) = entries.get(&slot) {
            if let Some(hit) = hit(&kept.entry, identity, now_ms) {
                return Some((hit, kept.limit));
            }
        }
        let (found, entry) = self.read(slot, identity, now_ms)?;
        let limit = limit(found.limit);
        entries.insert(slot, Kept { entry, limit });
        Some((found, limit))
    }

    /// The hit `identity` finds in shared data at `slot`, and the entry there.
    fn read(&self, slot: u32, identity: &[u8], now_ms: u64) -> Option<(Hit, Vec<u8>)> {
        let value = self.store.get(&slot_key(slot)).0?;
        Some((hit(&value, identity, now_ms)?, value))
    }

    /// Records the shim's denial of `check`, sent at `sent_ms`, if it is exact to.
    pub fn record(&self, policy: &Policy, check: &Check, outcome: &CheckOutcome, sent_ms: u64) {
        let Some((wait_ms, limit)) = cacheable(policy, check, outcome) else { return };
        let identity = identity(check);
        let Some(slot) = self.slot(&identity) else { return };
        let key = slot_key(slot);
        let value = encode(sent_ms.saturating_add(wait_ms), limit, &identity);
        // No cas: the last writer wins, and either entry is a correct one.
        if let Err(err) = self.store.set(&key, &value, None) {
            log::debug!("cannot write the over-limit cache's {key}: {err:?}");
        }
        if let Some(mirror) = self.mirror {
            let limit = check.limits.get(usize::from(limit)).copied();
            mirror.borrow_mut().entries.insert(slot, Kept { entry: value, limit });
        }
    }

    /// The slot of `identity`; `None` when the cache is off.
    fn slot(&self, identity: &[u8]) -> Option<u32> {
        // The remainder is below `slots`, a u32.
        (self.slots > 0).then(|| (fnv1a(identity) % u64::from(self.slots)) as u32)
    }
}

/// `sluice:olc:{slot}`, without `format!`: a miss reads it on every
/// admitted request, and the formatting machinery costs the filter about
/// 1,000 wasm operators where this costs a tenth.
fn slot_key(slot: u32) -> String {
    const PREFIX: &str = "sluice:olc:";
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(slot);
    let mut key = String::with_capacity(PREFIX.len() + digits.len());
    key.push_str(PREFIX);
    key.push_str(digits);
    key
}

/// The hit `value` (an entry) gives `identity` at `now_ms`, if it is its live entry.
fn hit(value: &[u8], identity: &[u8], now_ms: u64) -> Option<Hit> {
    let (deadline_ms, limit, stored) = decode(value)?;
    (same(stored, identity) && deadline_ms > now_ms)
        .then(|| Hit { wait_ms: deadline_ms - now_ms, limit: limit.into() })
}

/// The longest wait of the limits that denied `check`, and which one it is,
/// if every one of them allows caching. A key the partner paused (upstream
/// feedback) is refused until the pause's end whatever else denied it, and
/// a pause only ever extends, so that refusal is always exact to cache.
pub fn cacheable(policy: &Policy, check: &Check, outcome: &CheckOutcome) -> Option<(u64, u16)> {
    if !caches(policy) {
        return None;
    }
    let paused = outcome.paused_ms.map(Millis::get).filter(|ms| *ms > 0).map(|ms| (ms, 0));
    match (paused, limits_cacheable(policy, check, outcome)) {
        (Some(p), Some(l)) => Some(if l.0 > p.0 { l } else { p }),
        (p, l) => p.or(l),
    }
}

fn limits_cacheable(policy: &Policy, check: &Check, outcome: &CheckOutcome) -> Option<(u64, u16)> {
    let mut longest: Option<(u64, u16)> = None;
    for (i, (wire, out)) in check.limits.iter().zip(&outcome.limits).enumerate() {
        if out.allowed {
            continue;
        }
        let refundable = policy.limits.get(i).is_some_and(Limit::settles);
        if wire.lease_ms().is_some() || refundable {
            return None;
        }
        let wait = out.retry_after_ms.map(Millis::get).filter(|ms| *ms > 0)?;
        let i = u16::try_from(i).ok()?;
        if longest.is_none_or(|(w, _)| wait > w) {
            longest = Some((wait, i));
        }
    }
    longest
}

/// Whether the cache serves `policy` at all: not when it waits (above).
pub fn caches(policy: &Policy) -> bool {
    policy.wait.is_none()
}

/// What makes two checks the same, borrowed: from a built [`Check`], or
/// from a policy that applies to a request before its check is built
/// ([`OverLimitCache::lookup_applied`]).
struct Parts<'a, L, W> {
    policy: &'a str,
    key: &'a str,
    /// Each level's name, key and the index of its first limit.
    levels: L,
    /// The limits as sent.
    limits: W,
}

impl<'a> Parts<'a, (), ()> {
    #[allow(clippy::type_complexity)]
    fn of(
        check: &'a Check,
    ) -> Parts<'a, impl Iterator<Item = (&'a str, &'a str, usize)> + 'a, impl Iterator<Item = WireLimit> + 'a>
    {
        Parts {
            policy: &check.policy,
            key: &check.key,
            levels: check.levels.iter().map(|l| (l.level.name.as_str(), l.level.key.as_str(), l.from)),
            limits: check.limits.iter().copied(),
        }
    }
}

/// What makes two checks the same: policy and key, each ended by a NUL
/// (neither can hold one), then the limits as sent. Built on every request
/// a cached policy applies to, so without JSON: see [`limit_identity`].
fn identity(check: &Check) -> Vec<u8> {
    let mut out = Vec::new();
    write_identity(&mut out, Parts::of(check));
    out
}

/// [`identity`] of `parts`, into `out` (cleared first).
fn write_identity<'a, L, W>(out: &mut Vec<u8>, parts: Parts<'a, L, W>)
where
    L: Iterator<Item = (&'a str, &'a str, usize)>,
    W: Iterator<Item = WireLimit>,
{
    let (policy, key) = (parts.policy.as_bytes(), parts.key.as_bytes());
    out.clear();
    out.reserve(policy.len() + key.len() + 2 + LIMIT_IDENTITY_MAX * parts.limits.size_hint().0);
    out.extend_from_slice(policy);
    out.push(0);
    out.extend_from_slice(key);
    out.push(0);
    // A hierarchy's levels: each name (never empty, where a limit starts
    // with its kind, 1 to 9) and key ended by a NUL, its start at a fixed
    // width, and a NUL after the last. A check without levels adds nothing.
    let mut levels = false;
    for (name, key, from) in parts.levels {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(key.as_bytes());
        out.push(0);
        out.extend_from_slice(&(from as u64).to_le_bytes());
        levels = true;
    }
    if levels {
        out.push(0);
    }
    for limit in parts.limits {
        limit_identity(out, &limit);
    }
}

/// The most bytes [`limit_identity`] writes for one limit.
const LIMIT_IDENTITY_MAX: usize = 1 + 4 + 8 + 4;

/// One limit as sent: a byte naming its type, then each of its fields in
/// little endian at its full width. Each type's length is fixed, so two
/// lists of limits that differ in any field, type or order never encode alike.
fn limit_identity(out: &mut Vec<u8>, limit: &WireLimit) {
    let (kind, a, b, c) = limit.identity();
    out.push(kind);
    out.extend_from_slice(&a.to_le_bytes());
    out.extend_from_slice(&b.to_le_bytes());
    out.extend_from_slice(&c.to_le_bytes());
}

/// deadline (8 bytes, little endian), limit index (2 bytes), identity.
fn encode(deadline_ms: u64, limit: u16, identity: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + identity.len());
    out.extend_from_slice(&deadline_ms.to_le_bytes());
    out.extend_from_slice(&limit.to_le_bytes());
    out.extend_from_slice(identity);
    out
}

fn decode(value: &[u8]) -> Option<(u64, u16, &[u8])> {
    let (deadline, rest) = value.split_first_chunk::<8>()?;
    let (limit, identity) = rest.split_first_chunk::<2>()?;
    Some((u64::from_le_bytes(*deadline), u16::from_le_bytes(*limit), identity))
}

/// Whether `a` and `b` hold the same bytes, compared eight at a time:
/// `a == b` calls wasm32's `memcmp`, a loop over single bytes, and every
/// denial from the cache compares its identity.
fn same(a: &[u8], b: &[u8]) -> bool {
    let ((a, a_rest), (b, b_rest)) = (a.as_chunks::<8>(), b.as_chunks::<8>());
    a.len() == b.len()
        && a_rest.len() == b_rest.len()
        && a.iter().zip(b).all(|(x, y)| x == y)
        && a_rest.iter().zip(b_rest).all(|(x, y)| x == y)
}

/// FNV-1a, eight bytes to a loop step: the same hash as a fold over
/// single bytes, in about half the wasm operators (every lookup hashes the
/// identity).
fn fnv1a(bytes: &[u8]) -> u64 {
    let step = |h: u64, b: &u8| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    let (words, rest) = bytes.as_chunks::<8>();
    let h = words.iter().fold(0xcbf2_9ce4_8422_2325, |h, [a, b, c, d, e, f, g, i]| {
        step(step(step(step(step(step(step(step(h, a), b), c), d), e), f), g), i)
    });
    rest.iter().fold(h, step)
}

#[cfg(test)]
mod tests {

    #[test]
    fn slot_key_writes_what_format_writes() {
        for slot in [0, 7, 10, 99, 4_095, u32::MAX] {
            assert_eq!(slot_key(slot), format!("sluice:olc:{slot}"));
        }
    }
    use std::cell::RefCell;
    use std::collections::HashMap;

    use sluice_policies::units::Micros;
    use sluice_policies::wire::LimitOutcome;

    use super::*;

    #[derive(Default)]
    struct Map(RefCell<HashMap<String, Vec<u8>>>, std::cell::Cell<u32>);

    impl SharedData for Map {
        fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
            self.1.set(self.1.get() + 1);
            (self.0.borrow().get(key).cloned(), None)
        }
        fn set(&self, key: &str, value: &[u8], _cas: Option<u32>) -> Result<(), crate::host::SetError> {
            self.0.borrow_mut().insert(key.to_string(), value.to_vec());
            Ok(())
        }
    }

    fn policy(limits: &str) -> Policy {
        policy_with("", limits)
    }

    /// A policy `a` with `limits` (a JSON list).
    pub(super) fn policy_of(limits: &str) -> Policy {
        policy(limits)
    }

    fn policy_with(fields: &str, limits: &str) -> Policy {
        let doc = format!(r#"{{"policies":[{{"name":"a",{fields}"limits":{limits}}}]}}"#);
        sluice_policies::parse(&doc).expect("doc").policies[0].clone()
    }

    fn check(policy: &Policy, key: &str) -> Check {
        let limits = policy.limits.iter().map(|l| WireLimit::with_cost(l, 1)).collect();
        Check {
            policy: policy.name.as_str().into(),
            key: key.into(),
            limits,
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        }
    }

    fn denied(retries: &[Option<u64>]) -> CheckOutcome {
        let limit = |retry: &Option<u64>| LimitOutcome {
            allowed: *retry == Some(0),
            remaining: 0,
            reset_ms: Millis(0),
            retry_after_ms: retry.map(Millis),
            reclaimed: 0,
            held_until_us: None,
            refunded_us: Micros(0),
        };
        CheckOutcome { limits: retries.iter().map(limit).collect(), paused_ms: None }
    }

    const TWO_WINDOWS: &str = r#"[{"type":"sliding_window","limit":1,"window":"5s"},
                                  {"type":"fixed_window","limit":9,"window":"1m"}]"#;

    #[test]
    fn a_denial_is_served_locally_until_the_send_time_plus_the_longest_wait() {
        let map = Map::default();
        let cache = OverLimitCache::new(&map, 16);
        let p = policy(TWO_WINDOWS);
        let c = check(&p, "alice");
        cache.record(&p, &c, &denied(&[Some(4000), Some(6000)]), 1000);
        assert_eq!(cache.lookup(&p, &c, 1000), Some(Hit { wait_ms: 6000, limit: 1 }));
        assert_eq!(cache.lookup(&p, &c, 6999), Some(Hit { wait_ms: 1, limit: 1 }));
        assert_eq!(cache.lookup(&p, &c, 7000), None);
        assert_eq!(cache.lookup(&p, &check(&p, "bob"), 1000), None);
    }

    #[test]
    fn another_policy_or_cost_never_hits() {
        let map = Map::default();
        let cache = OverLimitCache::new(&map, 1);
        let p = policy(r#"[{"type":"points","capacity":10,"refill":"10s","cost":5}]"#);
        let c = check(&p, "k");
        cache.record(&p, &c, &denied(&[Some(3000)]), 0);
        assert!(cache.lookup(&p, &c, 1).is_some());
        let mut other_cost = c.clone();
        other_cost.limits = vec![WireLimit::with_cost(&p.limits[0], 2)];
        assert_eq!(cache.lookup(&p, &other_cost, 1), None, "the one slot holds another identity");
        let mut other_policy = c.clone();
        other_policy.policy = "b".into();
        assert_eq!(cache.lookup(&p, &other_policy, 1), None);
    }

    #[test]
    fn concurrency_unknown_waits_and_refundable_points_are_never_cached() {
        let map = Map::default();
        let cache = OverLimitCache::new(&map, 16);
        for limits in [
            r#"[{"type":"concurrency","limit":1,"lease":"30s"}]"#,
            r#"[{"type":"points","capacity":10,"refill":"10s","cost":5,"actual_cost_header":"x-cost"}]"#,
        ] {
            let p = policy(limits);
            cache.record(&p, &check(&p, "k"), &denied(&[Some(1000)]), 0);
        }
        let p = policy(TWO_WINDOWS);
        cache.record(&p, &check(&p, "k"), &denied(&[None, Some(1000)]), 0);
        let tokens = r#"[{"type":"points","capacity":10000,"refill":{"calendar":"month","zone":"UTC"},"cost":"llm_tokens"}]"#;
        let p = policy_with(r#""llm":{"api":"openai_chat"},"#, tokens);
        cache.record(&p, &check(&p, "k"), &denied(&[Some(86_400_000)]), 0);
        assert!(map.0.borrow().is_empty());
    }

    /// A waiting policy's refusal is neither recorded nor served: its slot
    /// can come earlier when a held request is cancelled.
    #[test]
    fn a_policy_that_waits_is_never_cached() {
        let map = Map::default();
        let cache = OverLimitCache::new(&map, 16);
        let waits = policy_with(r#""wait": {"timeout": "2s"},"#, TWO_WINDOWS);
        let c = check(&waits, "k");
        cache.record(&waits, &c, &denied(&[Some(4000), Some(0)]), 0);
        assert!(map.0.borrow().is_empty(), "nothing recorded");
        let plain = policy(TWO_WINDOWS);
        cache.record(&plain, &c, &denied(&[Some(4000), Some(0)]), 0);
        assert!(cache.lookup(&plain, &c, 1).is_some());
        assert_eq!(cache.lookup(&waits, &c, 1), None, "an entry is not served to a waiting policy");
    }

    /// Every field of every limit type is part of the identity: limits
    /// that differ in one field, or only in their type, never share one.
    #[test]
    fn limits_that_differ_in_any_field_have_distinct_identities() {
        use sluice_policies::calendar::{Calendar, Period, Zone};
        use WireLimit::*;
        let day = |zone| Calendar { period: Period::Day, zone: Zone::new(zone).expect("a zone") };
        let limits = [
            FixedWindow { limit: 1, window_ms: Millis(2), cost: 1 },
            FixedWindow { limit: 2, window_ms: Millis(2), cost: 1 },
            FixedWindow { limit: 1, window_ms: Millis(3), cost: 1 },
            SlidingWindow { limit: 1, window_ms: Millis(2), approximate: false },
            SlidingWindow { limit: 1, window_ms: Millis(2), approximate: true },
            TokenBucket { rate: 1, per_ms: Millis(2), burst: 3 },
            TokenBucket { rate: 1, per_ms: Millis(2), burst: 4 },
            LeakyBucket { capacity: 1, drain_ms: Millis(2) },
            Interval { every_ms: Millis(2) },
            Interval { every_ms: Millis(3) },
            Concurrency { limit: 1, lease_ms: Millis(2) },
            Points { capacity: 1, refill_ms: Millis(2), cost: 0 },
            Points { capacity: 1, refill_ms: Millis(2), cost: 1 },
            CalendarWindow { limit: 1, calendar: day("UTC"), cost: 1 },
            CalendarWindow { limit: 2, calendar: day("UTC"), cost: 1 },
            CalendarWindow { limit: 1, calendar: day("Europe/Paris"), cost: 1 },
            CalendarPoints { capacity: 1, cost: 1, calendar: day("UTC") },
            CalendarPoints { capacity: 1, cost: 0, calendar: day("UTC") },
            FirstHitWindow { limit: 1, window_ms: Millis(2), cost: 1 },
            FirstHitWindow { limit: 2, window_ms: Millis(2), cost: 1 },
            FirstHitWindow { limit: 1, window_ms: Millis(3), cost: 1 },
        ];
        let with = |limits: Vec<WireLimit>| {
            identity(&Check {
                policy: "p".into(),
                key: "k".into(),
                limits,
                margin_ms: None,
                upstream: false,
                levels: Vec::new(),
            })
        };
        let mut seen = std::collections::HashSet::new();
        for a in &limits {
            assert!(seen.insert(with(vec![*a])), "{a:?}");
            for b in &limits {
                assert!(seen.insert(with(vec![*a, *b])), "{a:?}, {b:?}");
            }
        }
        assert_eq!(with(vec![limits[0]]).len(), 4 + LIMIT_IDENTITY_MAX);
    }

    /// A hierarchy's levels are part of the identity: the same limits on
    /// another team's key, or split at another level, never share one.
    #[test]
    fn levels_are_part_of_the_identity() {
        use sluice_policies::wire::{CheckLevel, LevelKey};
        let limits = vec![WireLimit::Interval { every_ms: Millis(2) }; 2];
        let with = |levels: Vec<CheckLevel>| {
            identity(&Check {
                policy: "p".into(),
                key: "k".into(),
                limits: limits.clone(),
                margin_ms: None,
                upstream: false,
                levels,
            })
        };
        let level = |name: &str, key: &str| CheckLevel {
            level: LevelKey { name: name.into(), key: key.into() },
            from: 1,
        };
        let all = [
            with(vec![]),
            with(vec![level("team", "a")]),
            with(vec![level("team", "b")]),
            with(vec![level("t", "a")]),
        ];
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
    }

    #[test]
    fn memory_is_bounded_by_the_slot_count_and_zero_slots_is_off() {
        let map = Map::default();
        let cache = OverLimitCache::new(&map, 8);
        let p = policy(TWO_WINDOWS);
        for n in 0..1000 {
            cache.record(&p, &check(&p, &format!("k{n}")), &denied(&[Some(1000), Some(0)]), 0);
        }
        assert!(map.0.borrow().len() <= 8);
        let off = Map::default();
        OverLimitCache::new(&off, 0).record(&p, &check(&p, "k"), &denied(&[Some(1000), Some(0)]), 0);
        assert!(off.0.borrow().is_empty());
    }

    /// A worker's copy serves its hits without reading shared data until it
    /// is cleared (the tick), and only until the entry's deadline.
    #[test]
    fn the_mirror_serves_hits_until_cleared_and_never_past_the_deadline() {
        let map = Map::default();
        let mirror = RefCell::new(Mirror::default());
        let p = policy(TWO_WINDOWS);
        let c = check(&p, "alice");
        OverLimitCache::new(&map, 16).record(&p, &c, &denied(&[Some(4000), Some(0)]), 1000);
        let cache = OverLimitCache::new(&map, 16).with_mirror(&mirror);
        assert_eq!(cache.lookup(&p, &c, 1000), Some(Hit { wait_ms: 4000, limit: 0 }));
        assert_eq!(map.1.get(), 1, "the first lookup reads shared data");
        assert_eq!(cache.lookup(&p, &c, 1500), Some(Hit { wait_ms: 3500, limit: 0 }));
        assert_eq!(map.1.get(), 1, "the next is served from the copy");
        mirror.borrow_mut().clear();
        assert!(cache.lookup(&p, &c, 1500).is_some());
        assert_eq!(map.1.get(), 2, "after the tick, shared data again");
        assert_eq!(cache.lookup(&p, &c, 5000), None, "never past the deadline");
        assert_eq!(cache.lookup(&p, &check(&p, "bob"), 1500), None, "another check, same copy: a miss");
    }

    /// A hit found before the check is built gives the limit that denied
    /// as the check sent it, whether the worker's copy kept it (its own
    /// denial, or a read entry) or shared data alone holds it.
    #[test]
    fn a_hit_before_the_check_gives_the_limit_that_denied_as_sent() {
        let doc = format!(r#"{{"policies":[{{"name":"a","key":["header:k"],"limits":{TWO_WINDOWS}}}]}}"#);
        let doc = sluice_policies::parse(&doc).expect("doc");
        let req = sluice_policies::request::SimpleRequest::new("GET", "/").header("k", "alice");
        let evaluation = doc.evaluate(&req).expect("applies");
        let applied = &evaluation.applied[0];
        let c = applied.check(&req);
        let sent = c.limits[1];
        // The second limit denies longest.
        let denial = denied(&[Some(1000), Some(4000)]);
        let map = Map::default();
        let (mine, theirs) = (RefCell::new(Mirror::default()), RefCell::new(Mirror::default()));
        OverLimitCache::new(&map, 16).with_mirror(&mine).record(applied.policy, &c, &denial, 1000);
        let found = Some((Hit { wait_ms: 4000, limit: 1 }, Some(sent)));
        for cache in [
            OverLimitCache::new(&map, 16).with_mirror(&mine),
            OverLimitCache::new(&map, 16).with_mirror(&theirs),
            OverLimitCache::new(&map, 16),
        ] {
            assert_eq!(cache.lookup_applied(applied, &req, None, 1000), found);
            assert_eq!(cache.lookup_applied(applied, &req, None, 1000), found, "again, from the copy");
        }
    }

    /// Misses are never copied: a denial another worker records after this
    /// worker's miss is seen by this worker's next lookup, in the same tick.
    /// A denial this worker records is in its copy at once.
    #[test]
    fn the_mirror_keeps_no_misses_so_other_workers_denials_show_at_once() {
        let map = Map::default();
        let (mine, theirs) = (RefCell::new(Mirror::default()), RefCell::new(Mirror::default()));
        let p = policy(TWO_WINDOWS);
        let c = check(&p, "alice");
        let me = OverLimitCache::new(&map, 16).with_mirror(&mine);
        assert_eq!(me.lookup(&p, &c, 1000), None);
        OverLimitCache::new(&map, 16).with_mirror(&theirs).record(
            &p,
            &c,
            &denied(&[Some(4000), Some(0)]),
            1000,
        );
        assert_eq!(me.lookup(&p, &c, 1000), Some(Hit { wait_ms: 4000, limit: 0 }));

        let d = check(&p, "carol");
        me.record(&p, &d, &denied(&[Some(2000), Some(0)]), 1000);
        let reads = map.1.get();
        assert!(me.lookup(&p, &d, 1000).is_some());
        assert_eq!(map.1.get(), reads, "its own denial is in its copy");
    }

    /// One step of the cache's settlement property: a request reserving
    /// `reserve` tokens (true cost `actual`), or the settlement of the
    /// `n`th admitted one so far, `ms` later.
    #[derive(Debug, Clone)]
    enum Step {
        Request { reserve: u32, actual: u32, ms: u64 },
        Settle { n: usize, ms: u64 },
    }

    fn steps() -> impl proptest::strategy::Strategy<Value = Vec<Step>> {
        use proptest::prelude::*;
        let ms = prop_oneof![Just(0u64), 0u64..2_000, 0u64..120_000];
        let one = prop_oneof![
            // A few sizes, so a refused request comes again alike.
            (
                prop::sample::select(vec![300u32, 1_000, 4_000, 9_784]),
                prop::sample::select(vec![0u32, 308, 2_000, 9_000]),
                ms.clone(),
            )
                .prop_map(|(reserve, actual, ms)| Step::Request { reserve, actual, ms }),
            (any::<usize>(), ms).prop_map(|(n, ms)| Step::Settle { n, ms }),
        ];
        prop::collection::vec(one, 1..60)
    }

    proptest::proptest! {
        /// Denials that know their cause: after any interleaving of
        /// reservations, settlements and refusals of a token budget (10,000
        /// a day, as a bucket or a calendar day), a request whose
        /// reservation the budget holds room for is never refused from the
        /// cache. Before, a refusal of an `llm_tokens` limit was cached until
        /// the wait the shim named (to the day's end on a calendar), and a
        /// settlement that gave tokens back meanwhile did not end it.
        #[test]
        fn a_request_that_fits_is_never_refused_from_the_cache(steps in steps(), calendar in proptest::bool::ANY) {
            use sluice_policies::algorithm::{self, Algorithm, Correction, RedisTwin};
            let refill = if calendar { r#""refill":{"calendar":"day","zone":"UTC"}"# } else { r#""refill":"1d""# };
            let p = policy_with(
                r#""llm":{"api":"openai_chat"},"#,
                &format!(r#"[{{"type":"points","capacity":10000,{refill},"cost":"llm_tokens"}}]"#),
            );
            let map = Map::default();
            let cache = OverLimitCache::new(&map, 64);
            let mut store = RedisTwin::default();
            let mut now_ms = 1_700_000_000_000u64;
            let mut admitted: Vec<Correction> = Vec::new();
            for (i, step) in steps.into_iter().enumerate() {
                match step {
                    Step::Request { reserve, actual, ms } => {
                        now_ms += ms;
                        let mut c = check(&p, "k");
                        c.limits = vec![WireLimit::with_cost(&p.limits[0], reserve.min(10_000))];
                        let limits = [("k".to_string(), Algorithm::of(&c.limits[0]))];
                        let id = format!("r{i}");
                        if let Some(hit) = cache.lookup(&p, &c, now_ms) {
                            let fits = algorithm::check(&mut store.clone(), now_ms * 1000, &id, &limits).allowed;
                            proptest::prop_assert!(!fits, "refused from the cache ({hit:?}) with room for it");
                            continue;
                        }
                        let reply = algorithm::check(&mut store, now_ms * 1000, &id, &limits);
                        if reply.allowed {
                            let o = &reply.limits[0];
                            admitted.push(Correction {
                                key: "k".into(),
                                id: Some(id),
                                interval_us: match limits[0].1 {
                                    Algorithm::Gcra { interval_us, .. } => interval_us.get(),
                                    _ => 0,
                                },
                                delta: i64::from(actual) - i64::from(c.limits[0].points_cost().unwrap_or(0)),
                                held_until_us: o.held_until_us.map_or(0, Micros::get),
                                refunded_us: o.refunded_us.get(),
                            });
                        } else {
                            let outcome = CheckOutcome { limits: reply.limits, paused_ms: None };
                            cache.record(&p, &c, &outcome, now_ms);
                        }
                    }
                    Step::Settle { n, ms } => {
                        now_ms += ms;
                        if !admitted.is_empty() {
                            let c = admitted.remove(n % admitted.len());
                            algorithm::adjust(&mut store, now_ms * 1000, &[c]);
                        }
                    }
                }
            }
        }
    }
}

/// The RateLimit fields of a refusal agree whether the shim or the cache
/// answers: the cache keeps only the limit that waits longest and its
/// deadline, and [`Fields::refused`](crate::ratelimit_headers::Fields::refused)
/// gives, from that wait, what the shim's outcome gives at the same moment.
#[cfg(test)]
mod field_tests {
    use std::cell::RefCell;
    use std::collections::HashMap;

    use proptest::prelude::*;
    use sluice_policies::algorithm::{self, Algorithm, RedisTwin};

    use super::*;
    use crate::decision::retry_after_secs;
    use crate::ratelimit_headers::{Fields, RateLimitHeaders};

    #[derive(Default)]
    struct Map(RefCell<HashMap<String, Vec<u8>>>);

    impl SharedData for Map {
        fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
            (self.0.borrow().get(key).cloned(), None)
        }
        fn set(&self, key: &str, value: &[u8], _cas: Option<u32>) -> Result<(), crate::host::SetError> {
            self.0.borrow_mut().insert(key.to_string(), value.to_vec());
            Ok(())
        }
    }

    /// One limit of every kind the cache can hold, and its cost.
    const KINDS: [(&str, u32); 10] = [
        (r#"{"type":"fixed_window","limit":5,"window":"10s"}"#, 1),
        (r#"{"type":"fixed_window","limit":4,"window":"7s","start":"first_hit"}"#, 1),
        (r#"{"type":"sliding_window","limit":5,"window":"10s"}"#, 1),
        (r#"{"type":"sliding_window","limit":5,"window":"10s","approximate":true}"#, 1),
        (r#"{"type":"token_bucket","rate":3,"per":"1s","burst":4}"#, 1),
        (r#"{"type":"leaky_bucket","capacity":7,"drain":"9s"}"#, 1),
        (r#"{"type":"interval","every":"1500ms"}"#, 1),
        (r#"{"type":"points","capacity":1000,"refill":"77s","cost":300}"#, 300),
        (r#"{"type":"fixed_window","limit":5,"window":{"calendar":"day","zone":"UTC"}}"#, 1),
        (r#"{"type":"points","capacity":1000,"refill":{"calendar":"day","zone":"UTC"},"cost":300}"#, 300),
    ];

    /// The shim's answer at `now_us` (no charge when refused): the
    /// outcome, and the headers and retry-after the filter sends.
    fn shim(
        store: &mut RedisTwin,
        sent: &[WireLimit],
        now_us: u64,
    ) -> (algorithm::CheckReply, RateLimitHeaders, u64) {
        let limits: Vec<(String, Algorithm)> =
            sent.iter().enumerate().map(|(i, l)| (format!("k{i}"), Algorithm::of(l))).collect();
        let reply = algorithm::check(store, now_us, "probe", &limits);
        let headers =
            RateLimitHeaders::most_restrictive(sent.iter().zip(&reply.limits).map(|(l, o)| ("p", l, o)))
                .expect("headers");
        let retry = retry_after_secs(reply.retry_after_ms);
        (reply, headers, retry)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        /// For one or two limits of any kind after any traffic, a refusal's
        /// fields and retry-after are the same from the shim and from the
        /// cache, at the refusal and at every later moment the cache still
        /// answers; its `t` is its retry-after.
        #[test]
        fn the_shim_and_the_cache_give_the_same_fields(
            kinds in proptest::collection::vec(0..KINDS.len(), 1..=2),
            traffic in proptest::collection::vec(0u64..20_000_000, 0..40),
            start_ms in 86_000_000u64..86_400_000,
            later_ms in 0u64..200_000,
        ) {
            let mut kinds = kinds;
            kinds.dedup();
            let json: Vec<&str> = kinds.iter().map(|&k| KINDS[k].0).collect();
            let policy = super::tests::policy_of(&format!("[{}]", json.join(",")));
            let sent: Vec<WireLimit> =
                policy.limits.iter().zip(&kinds).map(|(l, &k)| WireLimit::with_cost(l, KINDS[k].1)).collect();
            let mut store = RedisTwin::default();
            let mut times: Vec<u64> = traffic.iter().map(|t| start_ms * 1000 + t).collect();
            times.sort_unstable();
            let limits: Vec<(String, Algorithm)> =
                sent.iter().enumerate().map(|(i, l)| (format!("k{i}"), Algorithm::of(l))).collect();
            for (n, t) in times.iter().enumerate() {
                algorithm::check(&mut store, *t, &format!("r{n}"), &limits);
            }
            let now_ms = times.last().map_or(start_ms, |t| t / 1000 + 1);
            let (reply, headers, retry) = shim(&mut store, &sent, now_ms * 1000);
            prop_assume!(!reply.allowed);
            let check = Check {
                policy: "a".into(),
                key: "k".into(),
                limits: sent.clone(),
                margin_ms: None,
                upstream: false,
                levels: Vec::new(),
            };
            let map = Map::default();
            let cache = OverLimitCache::new(&map, 16);
            let outcome = CheckOutcome { limits: reply.limits.clone(), paused_ms: None };
            cache.record(&policy, &check, &outcome, now_ms);
            let Some(hit) = cache.lookup(&policy, &check, now_ms) else {
                return Ok(()); // not cacheable: the shim answers every refusal
            };
            let from_cache = |hit: Hit| {
                let fields = Fields::refused(&sent[hit.limit], Millis(hit.wait_ms));
                (RateLimitHeaders::of("p", &sent[hit.limit], fields), retry_after_secs(Some(Millis(hit.wait_ms))))
            };
            prop_assert_eq!(from_cache(hit), (headers.clone(), retry));
            let t = headers.ratelimit.rsplit("t=").next().and_then(|t| t.parse::<u64>().ok());
            prop_assert_eq!(t, Some(retry), "t is the retry-after");

            // Later, while the entry lives and the shim still refuses.
            let at_ms = now_ms + later_ms % hit.wait_ms.max(1);
            if let Some(later) = cache.lookup(&policy, &check, at_ms) {
                let (reply, headers, retry) = shim(&mut store, &sent, at_ms * 1000);
                if !reply.allowed {
                    prop_assert_eq!(from_cache(later), (headers, retry), "at {} ms", at_ms - now_ms);
                }
            }
        }
    }
}

#[cfg(test)]
mod pause_tests {
    use sluice_policies::units::Micros;
    use sluice_policies::wire::{CheckOutcome, LimitOutcome};

    use super::*;

    /// A key the partner paused is refused until the pause's end, even when
    /// its own limits admit, or when only a concurrency limit denied.
    #[test]
    fn a_pause_is_cached_until_its_end() {
        let doc = sluice_policies::parse(
            r#"{"policies": [{"name": "p", "upstream": {},
                "limits": [{"type": "concurrency", "limit": 1, "lease": "1m"}]}]}"#,
        )
        .expect("valid");
        let policy = &doc.policies[0];
        let check = Check {
            policy: "p".into(),
            key: "k".into(),
            limits: vec![WireLimit::Concurrency { limit: 1, lease_ms: Millis(60_000) }],
            margin_ms: None,
            upstream: true,
            levels: Vec::new(),
        };
        let outcome = |allowed: bool, paused_ms: Option<u64>| CheckOutcome {
            limits: vec![LimitOutcome {
                allowed,
                remaining: 0,
                reset_ms: Millis(0),
                retry_after_ms: None,
                reclaimed: 0,
                held_until_us: None,
                refunded_us: Micros(0),
            }],
            paused_ms: paused_ms.map(Millis),
        };
        assert_eq!(cacheable(policy, &check, &outcome(true, Some(4_000))), Some((4_000, 0)));
        assert_eq!(cacheable(policy, &check, &outcome(false, Some(4_000))), Some((4_000, 0)));
        assert_eq!(
            cacheable(policy, &check, &outcome(false, None)),
            None,
            "a concurrency denial alone is never cached"
        );
    }

    /// The identity's compare and hash, eight bytes at a time, agree with
    /// their definitions over single bytes at every length and split.
    #[test]
    fn same_and_fnv1a_agree_with_their_bytewise_definitions() {
        let bytewise = |bytes: &[u8]| {
            bytes
                .iter()
                .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
        };
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c, "FNV-1a's published value");
        let bytes: Vec<u8> = (0..41u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        for len in 0..=bytes.len() {
            let a = &bytes[..len];
            assert_eq!(fnv1a(a), bytewise(a), "length {len}");
            assert!(same(a, a));
            assert!(!same(a, &bytes[..len.saturating_sub(1)]) || len == 0, "length {len}");
            for at in 0..len {
                let mut b = a.to_vec();
                b[at] ^= 1;
                assert!(!same(a, &b), "length {len}, byte {at} differs");
            }
        }
    }
}
