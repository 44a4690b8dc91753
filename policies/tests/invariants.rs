//! The properties that make each algorithm a correct limiter, over the
//! reference model and random traffic. The differential tests in the shim tie
//! the Lua scripts to this model, so they hold for the scripts too.

use proptest::prelude::*;
use sluice_policies::algorithm::{self, Algorithm, State, Store};

/// Arrival gaps in µs, same-instant arrivals included.
fn gaps() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(prop_oneof![Just(0u64), 0u64..5_000, 0u64..500_000], 1..300)
}

fn check(store: &mut Store, now: u64, id: u64, limits: &[(String, Algorithm)]) -> bool {
    algorithm::check(store, now, &format!("r{id}"), limits).allowed
}

proptest! {
    /// The exact log never admits more than `limit` in any interval one
    /// window long, and denies only when `limit` are already in the window.
    #[test]
    fn sliding_window_admits_exactly_up_to_the_limit(limit in 1u64..20, window_ms in 1u64..2_000, gaps in gaps()) {
        let window = window_ms * 1000;
        let limits = [("k".to_string(), Algorithm::SlidingWindow { limit, window_us: window })];
        let (mut store, mut now, mut admitted) = (Store::default(), 0u64, Vec::<u64>::new());
        for (i, gap) in gaps.into_iter().enumerate() {
            now += gap;
            let live = admitted.iter().filter(|&&s| s + window > now).count() as u64;
            let allowed = check(&mut store, now, i as u64, &limits);
            prop_assert_eq!(allowed, live < limit, "at {} with {} live", now, live);
            if allowed {
                admitted.push(now);
            }
        }
        for (i, &start) in admitted.iter().enumerate() {
            let within = admitted[i..].iter().take_while(|&&t| t < start + window).count() as u64;
            prop_assert!(within <= limit, "{} admitted in the window from {}", within, start);
        }
    }

    /// GCRA never lets through more than `burst + t / interval` units over
    /// any span `t`, whatever the costs.
    #[test]
    fn gcra_never_exceeds_burst_plus_rate(
        interval in 1u64..100_000, burst in 1u64..20,
        arrivals in prop::collection::vec((prop_oneof![Just(0u64), 0u64..200_000], 0u64..25), 1..300),
    ) {
        let mut store = Store::default();
        let (mut now, mut admitted) = (0u64, Vec::<(u64, u64)>::new());
        for (i, (gap, cost)) in arrivals.into_iter().enumerate() {
            now += gap;
            let limits = [("k".to_string(), Algorithm::Gcra { interval_us: interval, burst, cost })];
            if check(&mut store, now, i as u64, &limits) {
                admitted.push((now, cost));
            }
        }
        for i in 0..admitted.len() {
            let mut units = 0;
            for &(t, cost) in &admitted[i..] {
                units += cost;
                let span = t - admitted[i].0;
                prop_assert!(units <= burst + span / interval, "{} units in {} µs", units, span);
            }
        }
    }

    /// Concurrency never has more than `limit` live leases, whatever the
    /// order of acquisitions, releases and expiries.
    #[test]
    fn concurrency_never_exceeds_its_limit(
        limit in 1u64..6, lease_ms in 1u64..50,
        ops in prop::collection::vec((0u64..20_000, any::<bool>(), any::<usize>()), 1..200),
    ) {
        let lease = lease_ms * 1000;
        let limits = [("k".to_string(), Algorithm::Concurrency { limit, lease_us: lease })];
        let (mut store, mut now, mut held) = (Store::default(), 0u64, Vec::<String>::new());
        for (i, (gap, release, pick)) in ops.into_iter().enumerate() {
            now += gap;
            if release && !held.is_empty() {
                let id = held.remove(pick % held.len());
                algorithm::release(&mut store, now, &[("k".to_string(), limit, lease)], &id);
            } else if check(&mut store, now, i as u64, &limits) {
                held.push(format!("r{i}"));
            }
            let live = match store.keys.get("k") {
                Some(State::Set(entries)) => entries.iter().filter(|(x, _)| *x > now).count() as u64,
                _ => 0,
            };
            prop_assert!(live <= limit, "{} live leases", live);
        }
    }

    /// A check that any limit denies charges none: every key keeps its state,
    /// but for expired entries it drops.
    #[test]
    fn a_denied_check_charges_no_limit(gaps in gaps(), small in 1u64..4) {
        let limits = [
            ("a".to_string(), Algorithm::SlidingWindow { limit: 100, window_us: 60_000_000 }),
            ("b".to_string(), Algorithm::Gcra { interval_us: 1_000_000, burst: small, cost: 1 }),
            ("c".to_string(), Algorithm::FixedWindow { limit: 100, window_us: 60_000_000 }),
            ("d".to_string(), Algorithm::SlidingApprox { limit: 100, window_us: 60_000_000 }),
        ];
        let (mut store, mut now) = (Store::default(), 1_000_000_000u64);
        for (i, gap) in gaps.into_iter().enumerate() {
            now += gap;
            let before = store.clone();
            if !check(&mut store, now, i as u64, &limits) {
                for (key, _) in &limits {
                    let kept = match (before.keys.get(key), store.keys.get(key)) {
                        (Some(State::Set(b)), Some(State::Set(a))) => a.iter().all(|e| b.contains(e)),
                        (b, a) => b == a,
                    };
                    prop_assert!(kept, "a denied check changed {}", key);
                }
            }
        }
    }
}

/// One points request for the cost-correction property: when it arrives
/// after the previous one, its estimate, its true cost, and how long its
/// adjustment takes to arrive.
#[derive(Debug, Clone)]
struct Costed {
    gap: u64,
    estimate: u64,
    actual: u64,
    delay: u64,
}

fn costed() -> impl Strategy<Value = Vec<Costed>> {
    let one = (prop_oneof![Just(0u64), 0u64..200_000, 0u64..3_000_000], 0u64..12, 0u64..24, 0u64..4_000_000)
        .prop_map(|(gap, estimate, actual, delay)| Costed { gap, estimate, actual, delay });
    prop::collection::vec(one, 1..120)
}

/// Runs `requests` through a points bucket in time order: each is checked
/// at its estimate and, if admitted, adjusted to its true cost `delay` later
/// (adjustments land in any order relative to later checks). Returns the
/// admissions as (time, true cost, when its adjustment landed).
fn run_costed(interval: u64, burst: u64, requests: &[Costed]) -> Vec<(u64, u64, u64, u64)> {
    enum Event {
        Check(usize),
        Adjust(usize, u64),
    }
    let key = "k".to_string();
    let mut store = Store::default();
    let mut arrivals = Vec::new();
    let mut now = 1_000_000_000u64;
    for r in requests {
        now += r.gap;
        arrivals.push(now);
    }
    // (time, order, event): at equal times, arrivals keep their order and
    // adjustments land after the check of the same instant.
    let mut events: Vec<(u64, usize, Event)> =
        arrivals.iter().enumerate().map(|(i, &t)| (t, 2 * i, Event::Check(i))).collect();
    let mut admitted = Vec::new();
    let mut i = 0;
    while i < events.len() {
        events.sort_by_key(|(t, order, _)| (*t, *order));
        let (t, _, event) = &events[i];
        let t = *t;
        match *event {
            Event::Check(n) => {
                let r = &requests[n];
                let limits =
                    [(key.clone(), Algorithm::Gcra { interval_us: interval, burst, cost: r.estimate })];
                let reply = algorithm::check(&mut store, t, &format!("r{n}"), &limits);
                if reply.allowed {
                    let held_until =
                        reply.limits[0].held_until_us.expect("an admitted bucket says until when");
                    admitted.push((t, r.estimate, r.actual, t + r.delay));
                    events.push((t + r.delay, 2 * n + 1, Event::Adjust(n, held_until)));
                }
            }
            Event::Adjust(n, held_until) => {
                let r = &requests[n];
                let delta = r.actual as i64 - r.estimate as i64;
                if delta != 0 {
                    algorithm::adjust(&mut store, t, &[(key.clone(), interval, delta, held_until)]);
                }
            }
        }
        i += 1;
    }
    admitted
}

proptest! {
    /// Cost correction is judged over true costs, not the model's own
    /// formula: over any span from one admission to a later one, the true
    /// units admitted never exceed what a bucket charged the true costs
    /// would admit (`burst + span / interval`), plus the under-estimates of
    /// requests whose adjustment had not landed yet. Late refunds may only
    /// give back what a request's own charge still holds (the over-admission
    /// of a refund that returned what the cap had already thrown away).
    #[test]
    fn points_admitted_never_exceed_a_bucket_charged_the_true_costs(
        interval in 1_000u64..1_000_000, burst in 1u64..20, requests in costed(),
    ) {
        let admitted = run_costed(interval, burst, &requests);
        for i in 0..admitted.len() {
            let (start, ..) = admitted[i];
            let mut units = 0;
            for j in i..admitted.len() {
                let (t, _, actual, _) = admitted[j];
                units += actual;
                let in_flight: u64 = admitted[i..=j]
                    .iter()
                    .filter(|(_, _, _, adjusted)| *adjusted > t)
                    .map(|(_, estimate, actual, _)| actual.saturating_sub(*estimate))
                    .sum();
                let span = t - start;
                prop_assert!(
                    units <= burst + span / interval + in_flight,
                    "{} true units in {} µs (burst {}, interval {}, {} under-estimated in flight)",
                    units, span, burst, interval, in_flight
                );
            }
        }
    }
}

/// The late-refund over-admission, step by step: points with capacity 10
/// refilling in 10 s. R1 (cost 10) at 0; R2 (cost 10) at 10 s; R1's refund
/// (actual 0) lands at 10.001 s. Its charge had already refilled, so it
/// returns nothing, and R3 (cost 10) at 10.002 s is refused. The old refund
/// gave back all 10 points and admitted R3: 20 points in 2 ms.
#[test]
fn a_late_refund_returns_nothing_the_bucket_already_refilled() {
    let second = 1_000_000u64;
    let interval = second; // 10 points per 10 s
    let limits = |cost| [("k".to_string(), Algorithm::Gcra { interval_us: interval, burst: 10, cost })];
    let t0 = 1_000 * second;
    let mut store = Store::default();
    let r1 = algorithm::check(&mut store, t0, "r1", &limits(10));
    assert!(r1.allowed);
    assert!(algorithm::check(&mut store, t0 + 10 * second, "r2", &limits(10)).allowed);
    let held_until = r1.limits[0].held_until_us.expect("held until");
    algorithm::adjust(&mut store, t0 + 10 * second + 1_000, &[("k".to_string(), interval, -10, held_until)]);
    let r3 = algorithm::check(&mut store, t0 + 10 * second + 2_000, "r3", &limits(10));
    assert!(!r3.allowed, "a late refund gave back points the cap had already thrown away");
}
