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
                algorithm::release(&mut store, &["k".to_string()], &id);
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
