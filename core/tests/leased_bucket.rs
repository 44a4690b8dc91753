//! A token bucket under a lease is exact (docs/leased-mode.md, "Token
//! buckets under a lease").
//!
//! The bucket is GCRA in whole microseconds: one token every `t`, a burst
//! of `b`, so a request at `x` conforms while the theoretical arrival time
//! `tat` is at most `x + (b - 1) t`, and moves `tat` to `max(tat, x) + t`.
//! A set of admission times is exact when, replayed in time order from a
//! full bucket, every one conforms ([`conforms`]).
//!
//! Several gateways, each with its own pool (`sluice_core::leased`, a
//! bucket's: `Source::Bucket`) and its own clock offset, lease tokens of one
//! bucket from the shim's model (`algorithm::lease_bucket_call`, the twin
//! of `lua/scripts/lease_bucket.lua`), spend them, put some back after a
//! refusal, give unused ones back at their period's end (late, when their
//! tick is late), and fall back to exact checks (`algorithm::check`) when
//! empty. Lease calls run at the shim at any later moment, their answers
//! arrive at any later moment or are lost (the call still runs, late or
//! twice, and is sent again), or the shim refuses them. Over any
//! interleaving, every admission conforms to the bucket.
//!
//! Charged at its grant instead, as a window's lease is, a lease bunches
//! beyond the burst: [`a_lease_charged_at_its_grant_bunches_beyond_the_burst`].

mod lease_ops;

use lease_ops::{at_gateways, op, Op};
use proptest::prelude::*;
use sluice_core::leased::{Ask, Pool};
use sluice_policies::algorithm::{self, Algorithm, BucketGiveBack, RedisTwin};
use sluice_policies::leased::{Leased, Source};
use sluice_policies::units::{Count, Duration, Micros};
use sluice_policies::wire::LeaseResponse;
use sluice_policies::Limit;

const KEY: &str = "sluice:{p:}:gcra";

/// Whether `times`, replayed in order from a full bucket, all conform.
fn conforms(times: &[u64], t: u64, b: u64) -> Result<(), String> {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    let mut tat = 0u64;
    for (i, &x) in sorted.iter().enumerate() {
        if tat > x + (b - 1) * t {
            let from = i.saturating_sub(b as usize + 1);
            return Err(format!("admission {i} at {x} does not conform; around it: {:?}", &sorted[from..=i]));
        }
        tat = tat.max(x) + t;
    }
    Ok(())
}

/// The counterexample for a lease charged at its grant: one token a
/// second, a burst of 1. A lease of the one token at 0, spent at 0.9 s; at
/// 1.0 s the bucket has refilled as far as the shim knows, and it admits an
/// exact request. Two requests 0.1 s apart, where the bucket allows one a
/// second. Charged at its period's end (the twin), the request at 1.0 s
/// waits.
#[test]
fn a_lease_charged_at_its_grant_bunches_beyond_the_burst() {
    let (t, b) = (1_000_000u64, 1u64);
    // Charged at the grant: tat = max(tat, g) + k t = 1.0 s; the exact
    // request at 1.0 s finds tat - x = 0 <= (b - 1) t and is admitted.
    let at_grant_tat = 1_000_000u64;
    assert!(at_grant_tat <= 1_000_000 + (b - 1) * t, "the shim admits at 1.0 s");
    assert!(conforms(&[900_000, 1_000_000], t, b).is_err(), "and the two bunch");

    // The twin: the lease's period (1 s, from 0) ends at 1.0 s; it is
    // charged as spent then, so tat = 2.0 s and the request at 1.0 s waits.
    let mut store = RedisTwin::default();
    let grant = algorithm::lease_bucket_call(&mut store, 0, KEY, (t, b), 1_000_000, 1, None, None);
    assert_eq!((grant.granted, grant.window, grant.expires_in_us), (1, 0, 1_000_000));
    let exact = [(KEY.to_string(), Algorithm::Gcra { interval_us: Micros(t), burst: b, cost: 1 })];
    assert!(!algorithm::check(&mut store, 1_000_000, "r", &exact).allowed);
    assert!(algorithm::check(&mut store, 2_000_000, "r", &exact).allowed);
    assert!(conforms(&[900_000, 2_000_000], t, b).is_ok());
}

/// A give-back reaches back exactly as far as the bucket's charges allow:
/// made at the period's end, the whole of it; late, less the refill since,
/// unless the gateway was charged for more than it gives back; after a
/// lease of the next period, whose end the bucket's charges start from,
/// nothing; for a period too old, or one not yet begun, nothing.
#[test]
fn a_give_back_takes_back_what_is_still_charged() {
    let (t, b, period) = (10_000u64, 100u64, 1_000_000u64);
    let bucket = (t, b);
    let tat = |store: &RedisTwin| match store.keys.get(KEY) {
        Some(&algorithm::State::Tat(tat)) => tat,
        _ => 0,
    };
    let back = |window, tokens, charged| Some(BucketGiveBack { window, tokens, charged });
    let lease = |store: &mut RedisTwin, now, want, give_back| {
        algorithm::lease_bucket_call(store, now, KEY, bucket, period, want, give_back, None)
    };
    // Period 5 is [5 s, 6 s).
    let (start, end) = (5_000_000u64, 6_000_000u64);
    let mut store = RedisTwin::default();
    assert_eq!(lease(&mut store, start, 20, None).granted, 20);
    assert_eq!(tat(&store), end + 20 * t, "charged as spent at the period's end");
    lease(&mut store, end, 0, back(5, 5, 20));
    assert_eq!(tat(&store), end + 15 * t, "at the end: all five");

    let mut store = RedisTwin::default();
    lease(&mut store, start, 5, None);
    lease(&mut store, end + 30_000, 0, back(5, 5, 5));
    assert_eq!(tat(&store), end + 5 * t - 20_000, "30 ms late: 50 ms charged, 20 ms reach back");

    let mut store = RedisTwin::default();
    lease(&mut store, start, 20, None);
    lease(&mut store, end + 30_000, 0, back(5, 5, 20));
    assert_eq!(tat(&store), end + 15 * t, "30 ms late, but charged 200 ms: all five");

    let mut store = RedisTwin::default();
    lease(&mut store, start, 20, None);
    assert_eq!(lease(&mut store, end + 10_000, 10, None).granted, 10);
    let next_end = end + period;
    assert_eq!(tat(&store), next_end + 10 * t, "the next period's lease, charged at its end");
    lease(&mut store, end + 20_000, 0, back(5, 5, 20));
    assert_eq!(tat(&store), next_end + 10 * t, "its end absorbs what period 5 charged");

    let mut store = RedisTwin::default();
    lease(&mut store, start, 20, None);
    lease(&mut store, end + period, 0, back(5, 5, 20));
    lease(&mut store, start, 0, back(6, 5, 20));
    assert_eq!(tat(&store), end + 20 * t, "too old, or not begun: nothing");
}

/// A lease call in flight with its id, as the worker sends it.
#[derive(Clone)]
struct Call {
    gateway: usize,
    ask: Ask,
    id: (String, u64),
    /// The gateway's clock when it asked.
    asked_ms: u64,
}

/// A lease of a bucket, of any size and period (a document refuses a
/// period as long as the bucket takes to refill beyond a lease: exactness
/// does not need that rule, under-admission does).
fn leased_bucket(tokens: u32, ttl_ms: u64) -> Leased {
    Leased::new(tokens, ttl_ms).expect("valid").taken_from(Source::Bucket)
}

fn run(
    interval_us: u64,
    burst: u64,
    lease: Leased,
    offsets: Vec<u64>,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let mut store = RedisTwin::default();
    let mut now = 1_700_000_000_000u64;
    let mut pools = vec![Pool::default(); offsets.len()];
    for (g, pool) in pools.iter_mut().enumerate() {
        pool.adopt(g as u64 + 1);
    }
    let mut sent: Vec<Call> = Vec::new();
    let mut answered: Vec<(Call, LeaseResponse)> = Vec::new();
    let mut admitted: Vec<u64> = Vec::new();
    let exact = [(KEY.to_string(), Algorithm::Gcra { interval_us: Micros(interval_us), burst, cost: 1 })];
    let period_us = lease.ttl_ms() * 1000;
    let shim_runs = |store: &mut RedisTwin, call: &Call, now: u64| {
        let back = call.ask.give_back.map(|b| BucketGiveBack {
            window: b.window,
            tokens: b.tokens.into(),
            charged: b.charged.unwrap_or(b.tokens).into(),
        });
        let grant = algorithm::lease_bucket_call(
            store,
            now * 1000,
            KEY,
            (interval_us, burst),
            period_us,
            call.ask.want.into(),
            back,
            Some((call.id.0.as_str(), call.id.1)),
        );
        LeaseResponse::from(grant)
    };
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Advance { dt } => now += dt,
            Op::Request { g, refused } => {
                let local = now + offsets[g];
                match pools[g].spend(local) {
                    Some(token) if refused => pools[g].unspend(token, local),
                    Some(_) => admitted.push(now * 1000),
                    None => {
                        if algorithm::check(&mut store, now * 1000, &format!("r{i}"), &exact).allowed {
                            admitted.push(now * 1000);
                        }
                    }
                }
            }
            Op::Tick { g } => {
                let local = now + offsets[g];
                if let Some(ask) = pools[g].tick(lease, local) {
                    let id = pools[g].call_id();
                    sent.push(Call {
                        gateway: g,
                        ask,
                        id: (id.gateway.to_string(), id.seq),
                        asked_ms: local,
                    });
                }
            }
            Op::Run { n } if !sent.is_empty() => {
                let call = sent.remove(n % sent.len());
                let answer = shim_runs(&mut store, &call, now);
                // The same call may run again later: its answer was lost.
                if n % 7 == 3 {
                    sent.push(call.clone());
                }
                answered.push((call, answer));
            }
            Op::Arrive { n } if !answered.is_empty() => {
                let (call, answer) = answered.remove(n % answered.len());
                let local = now + offsets[call.gateway];
                pools[call.gateway].answered(call.id.1, lease, call.asked_ms, local, answer);
            }
            Op::Fail { n } if n % 5 == 0 && !sent.is_empty() => {
                // Refused before it ran: it ran nothing.
                let call = sent.remove(n % sent.len());
                let g = call.gateway;
                if pools[g].call_id().seq == call.id.1 {
                    pools[g].failed(now + offsets[g]);
                }
            }
            Op::Fail { n } if !sent.is_empty() || !answered.is_empty() => {
                // The gateway takes the answer as lost; the call may run or
                // arrive later all the same, or its answer is gone for good.
                let (g, seq) = if n % 2 == 0 && !sent.is_empty() {
                    let call = &sent[n % sent.len()];
                    (call.gateway, call.id.1)
                } else if !answered.is_empty() {
                    let k = n % answered.len();
                    let (g, seq) = (answered[k].0.gateway, answered[k].0.id.1);
                    if n % 3 == 0 {
                        answered.remove(k);
                    }
                    (g, seq)
                } else {
                    let call = &sent[n % sent.len()];
                    (call.gateway, call.id.1)
                };
                pools[g].lost(seq, now + offsets[g]);
            }
            _ => {}
        }
        if let Err(why) = conforms(&admitted, interval_us, burst) {
            return Err(TestCaseError::fail(why));
        }
        for pool in &pools {
            prop_assert!(pool.tokens <= lease.held_at_most(), "a pool holds {} tokens", pool.tokens);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, ..ProptestConfig::default() })]

    /// Over any interleaving of grants, spends, refusals, give-backs (late
    /// ones too), exact checks, lost answers, calls run late or twice and
    /// refused calls, by up to four gateways with their own clocks, every
    /// admission conforms to the bucket.
    #[test]
    fn no_admission_breaks_the_bucket(
        interval_ms in prop::sample::select(vec![1u64, 7, 40, 1_000]),
        burst in 1u64..12,
        tokens in 1u32..12,
        ttl_ms in prop::sample::select(vec![1u64, 50, 300, 2_000]),
        offsets in prop::collection::vec(0u64..1_000_000, 1..=4),
        ops in prop::collection::vec(op(4), 1..250),
    ) {
        let lease = leased_bucket(tokens.min(burst as u32), ttl_ms);
        let ops = at_gateways(ops, offsets.len());
        run(interval_ms * 1000, burst, lease, offsets, ops)?;
    }
}

/// What a leased bucket under-admits against the exact one, in the model,
/// on the same requests: a bucket of 1,000 a second with a burst of 1,000,
/// two gateways (one worker each) ticking every 20 ms, lease calls answered
/// 1 ms after their tick asks, 10 s of traffic (`pattern`: the offered
/// rate in each 100 ms), leases of `tokens` for `ttl_ms`. Prints one
/// `LEASED_BUCKET` line per run (docs/leased-mode.md quotes them) and
/// holds each to the bound: the tokens the gateways hold, and a period's
/// refill for each time the bucket's charges had to move to a period's end.
fn under_admission(name: &str, (pattern, episodes): (&dyn Fn(u64) -> u64, u64), tokens: u32, ttl_ms: u64) {
    const GATEWAYS: usize = 2;
    const TICK_MS: u64 = 20;
    const SECONDS: u64 = 10;
    let (interval_us, burst) = (1_000u64, 1_000u64);
    let limit = Limit::TokenBucket {
        rate: Count::new(1_000).expect("valid"),
        per: Duration::from_millis(1_000).expect("valid"),
        burst: Count::new(burst).expect("valid"),
    };
    // A document's lease, or (a period too long for the bucket) the model's.
    let document = Leased::new(tokens, ttl_ms).expect("valid").fits(std::slice::from_ref(&limit));
    let lease = document.clone().unwrap_or_else(|_| leased_bucket(tokens, ttl_ms));
    let mut rng = fastrand::Rng::with_seed(11);
    // Requests: in each 100 ms, `pattern(slot)` a second, at random moments.
    let mut requests: Vec<(u64, usize)> = (0..SECONDS * 10)
        .flat_map(|slot| {
            let n = pattern(slot) / 10;
            (0..n).map(move |_| slot * 100_000).collect::<Vec<_>>()
        })
        .map(|at| (at + rng.u64(0..100_000), rng.usize(0..GATEWAYS)))
        .collect();
    requests.sort_unstable();
    let t0 = 1_700_000_000_000_000u64;
    let exact = [(KEY.to_string(), Algorithm::Gcra { interval_us: Micros(interval_us), burst, cost: 1 })];

    let mut store = RedisTwin::default();
    let exact_admitted: Vec<u64> = requests
        .iter()
        .enumerate()
        .filter(|&(i, &(at, _))| algorithm::check(&mut store, t0 + at, &format!("e{i}"), &exact).allowed)
        .map(|(_, &(at, _))| t0 + at)
        .collect();

    let mut store = RedisTwin::default();
    let mut pools = vec![Pool::default(); GATEWAYS];
    for (g, pool) in pools.iter_mut().enumerate() {
        pool.adopt(g as u64 + 1);
    }
    let mut in_flight: Vec<(u64, usize, Ask, u64)> = Vec::new();
    let (mut admitted, mut local, mut calls, mut next_tick) = (Vec::new(), 0u64, 0u64, 0u64);
    let period_us = ttl_ms * 1000;
    let mut step =
        |store: &mut RedisTwin, pools: &mut [Pool], in_flight: &mut Vec<(u64, usize, Ask, u64)>, ms| {
            let due: Vec<_> = in_flight.iter().filter(|c| c.0 < ms).copied().collect();
            in_flight.retain(|c| c.0 >= ms);
            for (asked, g, ask, seq) in due {
                let back = ask.give_back.map(|b| BucketGiveBack {
                    window: b.window,
                    tokens: b.tokens.into(),
                    charged: b.charged.unwrap_or(b.tokens).into(),
                });
                let id = (g + 1).to_string();
                let grant = algorithm::lease_bucket_call(
                    store,
                    (asked + 1) * 1000,
                    KEY,
                    (interval_us, burst),
                    period_us,
                    ask.want.into(),
                    back,
                    Some((id.as_str(), seq)),
                );
                let answer = LeaseResponse::from(grant);
                pools[g].answered(seq, lease, asked, asked + 2, answer);
            }
            if ms >= next_tick {
                next_tick = ms - ms % TICK_MS + TICK_MS;
                for (g, pool) in pools.iter_mut().enumerate() {
                    if let Some(ask) = pool.tick(lease, ms) {
                        calls += 1;
                        in_flight.push((ms, g, ask, pool.call_id().seq));
                    }
                }
            }
        };
    for (i, &(at, g)) in requests.iter().enumerate() {
        let now = t0 + at;
        step(&mut store, &mut pools, &mut in_flight, now / 1000);
        if pools[g].spend(now / 1000).is_some() {
            local += 1;
            admitted.push(now);
        } else if algorithm::check(&mut store, now, &format!("l{i}"), &exact).allowed {
            admitted.push(now);
        }
    }
    if let Err(why) = conforms(&admitted, interval_us, burst) {
        panic!("{name}: {why}");
    }
    let (all, e, l) = (requests.len() as u64, exact_admitted.len() as u64, admitted.len() as u64);
    let under = e.saturating_sub(l);
    // The tokens gateways hold, and a period's refill each time traffic
    // beyond the rate starts while the bucket's charges lie before the
    // period's end.
    let bound = GATEWAYS as u64 * lease.held_at_most() + episodes * (ttl_ms * 1000 / interval_us + 1);
    let refused = document.err().map_or(String::new(), |_| " (a period a document refuses)".to_string());
    println!(
        "LEASED_BUCKET {name}: tokens {tokens} ttl {ttl_ms} ms{refused}: {all} requests, admitted exact {e}, \
         leased {l} (under-admitted {under}, {:.2}%, bound {bound}); served locally {local} ({:.1}% of \
         admitted); lease calls {calls} ({:.2} per 100 requests)",
        under as f64 * 100.0 / e.max(1) as f64,
        local as f64 * 100.0 / l.max(1) as f64,
        calls as f64 * 100.0 / all.max(1) as f64,
    );
    if refused.is_empty() {
        assert!(under <= bound, "{name}: {under} under-admitted, over the bound {bound}");
    }
}

/// Steady overload, steady traffic under the rate, and bursts with idle
/// gaps (the bucket refills between them, so each burst's first lease
/// moves the bucket's charges to its period's end), at two lease periods
/// a document gives, and one it refuses (as long as the bucket takes to
/// refill beyond a lease: one lease holds the bucket back).
#[test]
fn under_admission_against_exact() {
    let overload: (&dyn Fn(u64) -> u64, u64) = (&|_| 2_000, 1);
    let steady: (&dyn Fn(u64) -> u64, u64) = (&|_| 800, 1);
    let bursts: (&dyn Fn(u64) -> u64, u64) = (&|slot| if slot / 10 % 2 == 0 { 3_000 } else { 0 }, 5);
    for (tokens, ttl_ms) in [(50, 20), (50, 100), (100, 1_000)] {
        under_admission("overload 2x", overload, tokens, ttl_ms);
        under_admission("steady 0.8x", steady, tokens, ttl_ms);
        under_admission("bursts 3x, 1 s on, 1 s off", bursts, tokens, ttl_ms);
    }
}
