//! Leased mode is exact: several gateways, each with its own pool
//! (`sluice_core::leased`) and its own clock offset, lease tokens from one
//! fixed window in the shim's model (`algorithm::lease`, the twin of
//! `lua/scripts/lease.lua`), spend them, put some back after a refusal, give unused
//! ones back, and fall back to exact checks (`algorithm::check`) when empty.
//! Lease calls run at the shim at any later moment, their answers arrive at
//! any later moment, or never. Over any interleaving, what is admitted in
//! each window (judged by the true time of each admission) never exceeds the
//! limit, and a pool never holds more than `held_at_most`.

use std::collections::HashMap;

mod lease_ops;

use lease_ops::{at_gateways, op, Op};
use proptest::prelude::*;
use sluice_core::hot_keys::HotKeys;
use sluice_core::leased::{Ask, Pool};
use sluice_policies::algorithm::{self, Algorithm, RedisTwin};
use sluice_policies::leased::Leased;
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::LeaseResponse;

const KEY: &str = "sluice:{p:}:fw";

struct Call {
    gateway: usize,
    ask: Ask,
    /// The gateway's clock when it asked.
    asked_ms: u64,
}

fn run(
    limit: u64,
    window_ms: u64,
    lease: Leased,
    offsets: Vec<u64>,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let mut store = RedisTwin::default();
    let mut now = 1_700_000_000_000u64;
    let mut pools = vec![Pool::default(); offsets.len()];
    let mut sent: Vec<Call> = Vec::new();
    let mut answered: Vec<(Call, LeaseResponse)> = Vec::new();
    let mut admitted: HashMap<u64, u64> = HashMap::new();
    let exact =
        [(KEY.to_string(), Algorithm::FixedWindow { limit, window_us: Micros(window_ms * 1000), cost: 1 })];
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Advance { dt } => now += dt,
            Op::Request { g, refused } => {
                let local = now + offsets[g];
                match pools[g].spend(local) {
                    Some(token) if refused => pools[g].unspend(token, local),
                    Some(token) => {
                        prop_assert_eq!(token.window, now / window_ms, "a token spent outside its window");
                        *admitted.entry(now / window_ms).or_default() += 1;
                    }
                    None => {
                        let reply = algorithm::check(&mut store, now * 1000, &format!("r{i}"), &exact);
                        if reply.allowed {
                            *admitted.entry(now / window_ms).or_default() += 1;
                        }
                    }
                }
            }
            Op::Tick { g } => {
                let local = now + offsets[g];
                if let Some(ask) = pools[g].tick(lease, local) {
                    sent.push(Call { gateway: g, ask, asked_ms: local });
                }
            }
            Op::Run { n } if !sent.is_empty() => {
                let call = sent.remove(n % sent.len());
                let back = call.ask.give_back.map(|b| (b.window, u64::from(b.tokens)));
                let grant = algorithm::lease(
                    &mut store,
                    now * 1000,
                    KEY,
                    limit,
                    window_ms * 1000,
                    call.ask.want.into(),
                    back,
                );
                let answer = LeaseResponse {
                    granted: u32::try_from(grant.granted).expect("small"),
                    window: grant.window,
                    expires_in_ms: Millis(grant.expires_in_us / 1000),
                    remaining: grant.remaining,
                };
                answered.push((call, answer));
            }
            Op::Arrive { n } if !answered.is_empty() => {
                let (call, answer) = answered.remove(n % answered.len());
                let local = now + offsets[call.gateway];
                pools[call.gateway].granted(lease, call.asked_ms, local, answer);
            }
            Op::Fail { n } if !sent.is_empty() || !answered.is_empty() => {
                // A failure before the shim ran the call, or after (its answer lost).
                let call = if n % 2 == 0 && !sent.is_empty() {
                    sent.remove(n % sent.len())
                } else if !answered.is_empty() {
                    answered.remove(n % answered.len()).0
                } else {
                    sent.remove(n % sent.len())
                };
                pools[call.gateway].failed(now + offsets[call.gateway]);
            }
            _ => {}
        }
        for (window, n) in &admitted {
            prop_assert!(*n <= limit, "window {} admitted {} over the limit {}", window, n, limit);
        }
        for pool in &pools {
            prop_assert!(pool.tokens <= lease.held_at_most(), "a pool holds {} tokens", pool.tokens);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// Over any interleaving of grants, spends, refusals, give-backs, exact
    /// checks, lost answers and window ends, by up to four gateways with
    /// their own clocks, no window admits more than its limit.
    #[test]
    fn no_window_admits_more_than_its_limit(
        limit in 1u64..40,
        window_ms in prop::sample::select(vec![10u64, 100, 1_000]),
        tokens in 1u32..12,
        ttl_ms in prop::sample::select(vec![1u64, 50, 2_000]),
        offsets in prop::collection::vec(0u64..1_000_000, 1..=4),
        ops in prop::collection::vec(op(4), 1..200),
    ) {
        let lease = Leased::new(tokens.min(u32::try_from(limit).expect("small")), ttl_ms).expect("valid");
        let ops = at_gateways(ops, offsets.len());
        run(limit, window_ms, lease, offsets, ops)?;
    }
}

/// A lease call in flight with its id, as the worker sends it.
struct IdCall {
    gateway: usize,
    ask: Ask,
    id: (String, u64),
    asked_ms: u64,
}

/// Lost answers cost nothing: as [`run`], but each call carries its id
/// (`Pool::call_id`) and the shim's model records it (`algorithm::lease_call`,
/// the twin of `lua/scripts/lease.lua` with `KEYS[2]`). A failure is a lost
/// answer (`Pool::lost`): the call may still run at the shim later, twice if
/// it was sent again, and its answer may reach the gateway after all. No
/// window admits more than its limit, and no pool holds more than
/// `held_at_most`. Then, once every call has run and every gateway has had
/// its answer, the window's count is exactly what was admitted plus what the
/// pools hold: no lost answer left tokens charged.
fn run_with_ids(limit: u64, lease: Leased, offsets: Vec<u64>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    // One window longer than the run, from its start: nothing dies of age.
    let window_ms = 1_000_000_000u64;
    let mut store = RedisTwin::default();
    let mut now = 1_700_000_000_000u64 / window_ms * window_ms;
    let mut pools = vec![Pool::default(); offsets.len()];
    for (g, pool) in pools.iter_mut().enumerate() {
        pool.adopt(g as u64 + 1);
    }
    let mut sent: Vec<IdCall> = Vec::new();
    let mut answered: Vec<(IdCall, LeaseResponse)> = Vec::new();
    let mut admitted = 0u64;
    let exact =
        [(KEY.to_string(), Algorithm::FixedWindow { limit, window_us: Micros(window_ms * 1000), cost: 1 })];
    let shim_runs = |store: &mut RedisTwin, call: &IdCall, now: u64| {
        let back = call.ask.give_back.map(|b| (b.window, u64::from(b.tokens)));
        let grant = algorithm::lease_call(
            store,
            now * 1000,
            KEY,
            limit,
            window_ms * 1000,
            call.ask.want.into(),
            back,
            Some((call.id.0.as_str(), call.id.1)),
        );
        LeaseResponse {
            granted: u32::try_from(grant.granted).expect("small"),
            window: grant.window,
            expires_in_ms: Millis(grant.expires_in_us / 1000),
            remaining: grant.remaining,
        }
    };
    let tick = |pools: &mut [Pool], g: usize, local: u64| {
        pools[g].tick(lease, local).map(|ask| {
            let id = pools[g].call_id();
            IdCall { gateway: g, ask, id: (id.gateway.to_string(), id.seq), asked_ms: local }
        })
    };
    let arrive = |pools: &mut [Pool], call: &IdCall, answer: LeaseResponse, local: u64| {
        pools[call.gateway].answered(call.id.1, lease, call.asked_ms, local, answer);
    };
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Advance { dt } => now += dt,
            Op::Request { g, refused } => {
                let local = now + offsets[g];
                match pools[g].spend(local) {
                    Some(token) if refused => pools[g].unspend(token, local),
                    Some(_) => admitted += 1,
                    None => {
                        let reply = algorithm::check(&mut store, now * 1000, &format!("r{i}"), &exact);
                        admitted += u64::from(reply.allowed);
                    }
                }
            }
            Op::Tick { g } => sent.extend(tick(&mut pools, g, now + offsets[g])),
            Op::Run { n } if !sent.is_empty() => {
                let call = sent.remove(n % sent.len());
                let answer = shim_runs(&mut store, &call, now);
                answered.push((call, answer));
            }
            Op::Arrive { n } if !answered.is_empty() => {
                let (call, answer) = answered.remove(n % answered.len());
                arrive(&mut pools, &call, answer, now + offsets[call.gateway]);
            }
            Op::Fail { n } if !sent.is_empty() || !answered.is_empty() => {
                // The gateway takes the answer as lost; the call may run or
                // arrive later all the same (`n` picks which it is).
                let call = if n % 2 == 0 && !sent.is_empty() {
                    &sent[n % sent.len()]
                } else if !answered.is_empty() {
                    &answered[n % answered.len()].0
                } else {
                    &sent[n % sent.len()]
                };
                let (g, seq) = (call.gateway, call.id.1);
                if n % 3 == 0 && n % 2 == 1 && !answered.is_empty() {
                    // Its answer is gone for good.
                    answered.remove(n % answered.len());
                }
                pools[g].lost(seq, now + offsets[g]);
            }
            _ => {}
        }
        prop_assert!(admitted <= limit, "admitted {} over the limit {}", admitted, limit);
        for pool in &pools {
            prop_assert!(pool.tokens <= lease.held_at_most(), "a pool holds {} tokens", pool.tokens);
        }
    }
    // Quiet: every call runs, every answer arrives, and each gateway sends
    // its lost call again until it is answered.
    for _ in 0..8 {
        for call in std::mem::take(&mut sent) {
            let answer = shim_runs(&mut store, &call, now);
            answered.push((call, answer));
        }
        for (call, answer) in std::mem::take(&mut answered) {
            arrive(&mut pools, &call, answer, now + offsets[call.gateway]);
        }
        now += sluice_core::leased::RETRY_MS;
        for g in 0..pools.len() {
            if pools[g].unanswered.is_some() {
                sent.extend(tick(&mut pools, g, now + offsets[g]));
            }
        }
    }
    prop_assert!(pools.iter().all(|p| p.unanswered.is_none()), "a call still unanswered");
    let charged = match store.keys.get(KEY) {
        Some(&algorithm::State::Counter { count, .. }) => count,
        _ => 0,
    };
    let held: u64 = pools.iter().map(|p| p.tokens).sum();
    prop_assert_eq!(charged, admitted + held, "charged = admitted {} + held {}", admitted, held);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// Over any interleaving with lost answers (calls that still run, late
    /// or twice, and answers that still arrive), no window admits more than
    /// its limit, and no lost answer leaves tokens charged.
    #[test]
    fn lost_answers_give_their_tokens_back(
        limit in 1u64..40,
        tokens in 1u32..12,
        ttl_ms in prop::sample::select(vec![1u64, 50, 2_000]),
        offsets in prop::collection::vec(0u64..1_000_000, 1..=4),
        ops in prop::collection::vec(op(4), 1..200),
    ) {
        let lease = Leased::new(tokens.min(u32::try_from(limit).expect("small")), ttl_ms).expect("valid");
        let ops = at_gateways(ops, offsets.len());
        run_with_ids(limit, lease, offsets, ops)?;
    }
}

/// Leased mode per key: as [`run`], with three keys, each its own window in
/// the shim's model and its own pool at each gateway; each gateway learns
/// which keys are hot from its own requests (`sluice_core::hot_keys`, as
/// the worker does) and spends a pool only for a hot key, checking every
/// other key exactly. Requests go to key 0 most, key 2 least. Each gateway
/// counts `capacity` keys (below three, keys take each other's counters).
fn run_per_key(
    capacity: usize,
    limit: u64,
    window_ms: u64,
    lease: Leased,
    offsets: Vec<u64>,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    const KEYS: usize = 3;
    let store_key = |k: usize| format!("sluice:{{p:k{k}}}:fw");
    let mut store = RedisTwin::default();
    let mut now = 1_700_000_000_000u64;
    let gateways = offsets.len();
    let mut pools = vec![[Pool::default(); KEYS]; gateways];
    let mut hot: Vec<HotKeys> =
        (0..gateways).map(|_| HotKeys::new(capacity, lease.ttl_ms(), lease.tokens().into())).collect();
    let mut sent: Vec<(Call, usize)> = Vec::new();
    let mut answered: Vec<(Call, usize, LeaseResponse)> = Vec::new();
    let mut admitted: HashMap<(usize, u64), u64> = HashMap::new();
    let exact = |k: usize| {
        [(store_key(k), Algorithm::FixedWindow { limit, window_us: Micros(window_ms * 1000), cost: 1 })]
    };
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Advance { dt } => now += dt,
            Op::Request { g, refused } => {
                let k = [0, 0, 0, 1, 1, 2][i % 6];
                let local = now + offsets[g];
                let spent =
                    if hot[g].observe(&k.to_string(), local) { pools[g][k].spend(local) } else { None };
                match spent {
                    Some(token) if refused => pools[g][k].unspend(token, local),
                    Some(token) => {
                        prop_assert_eq!(token.window, now / window_ms, "a token spent outside its window");
                        *admitted.entry((k, now / window_ms)).or_default() += 1;
                    }
                    None => {
                        let reply = algorithm::check(&mut store, now * 1000, &format!("r{i}"), &exact(k));
                        if reply.allowed {
                            *admitted.entry((k, now / window_ms)).or_default() += 1;
                        }
                    }
                }
            }
            Op::Tick { g } => {
                let local = now + offsets[g];
                for (k, pool) in pools[g].iter_mut().enumerate() {
                    if let Some(ask) = pool.tick(lease, local) {
                        sent.push((Call { gateway: g, ask, asked_ms: local }, k));
                    }
                }
            }
            Op::Run { n } if !sent.is_empty() => {
                let (call, k) = sent.remove(n % sent.len());
                let back = call.ask.give_back.map(|b| (b.window, u64::from(b.tokens)));
                let grant = algorithm::lease(
                    &mut store,
                    now * 1000,
                    &store_key(k),
                    limit,
                    window_ms * 1000,
                    call.ask.want.into(),
                    back,
                );
                let answer = LeaseResponse {
                    granted: u32::try_from(grant.granted).expect("small"),
                    window: grant.window,
                    expires_in_ms: Millis(grant.expires_in_us / 1000),
                    remaining: grant.remaining,
                };
                answered.push((call, k, answer));
            }
            Op::Arrive { n } if !answered.is_empty() => {
                let (call, k, answer) = answered.remove(n % answered.len());
                let local = now + offsets[call.gateway];
                pools[call.gateway][k].granted(lease, call.asked_ms, local, answer);
            }
            Op::Fail { n } if !sent.is_empty() => {
                let (call, k) = sent.remove(n % sent.len());
                pools[call.gateway][k].failed(now + offsets[call.gateway]);
            }
            _ => {}
        }
        for ((k, window), n) in &admitted {
            prop_assert!(*n <= limit, "key {} window {} admitted {} over the limit {}", k, window, n, limit);
        }
        for pool in pools.iter().flatten() {
            prop_assert!(pool.tokens <= lease.held_at_most(), "a pool holds {} tokens", pool.tokens);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_000, ..ProptestConfig::default() })]

    /// Per key: over any interleaving, with hot keys leased and cold ones
    /// checked exactly (the hot-key counter's stream summary with room for
    /// every key or fewer), no key's window admits more than its limit and
    /// no key's pool holds more than `held_at_most`.
    #[test]
    fn no_key_window_admits_more_than_its_limit(
        capacity in 1usize..=4,
        limit in 1u64..40,
        window_ms in prop::sample::select(vec![10u64, 100, 1_000]),
        tokens in 1u32..12,
        ttl_ms in prop::sample::select(vec![1u64, 50, 2_000]),
        offsets in prop::collection::vec(0u64..1_000_000, 1..=3),
        ops in prop::collection::vec(op(3), 1..200),
    ) {
        let lease = Leased::new(tokens.min(u32::try_from(limit).expect("small")), ttl_ms).expect("valid");
        let ops = at_gateways(ops, offsets.len());
        run_per_key(capacity, limit, window_ms, lease, offsets, ops)?;
    }
}
