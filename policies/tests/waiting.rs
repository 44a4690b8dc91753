//! Egress waiting over the reference model: whatever the arrivals, waits,
//! margins and cancellations, the requests finally admitted (reserved and
//! not cancelled) never break any limit, and they are admitted in arrival
//! order. The invariants are stated over the admitted times against the
//! limit, not over the model's own formulas. The shim's differential test
//! ties the scripts to this model, so they hold for the scripts too.

use proptest::prelude::*;
use sluice_policies::algorithm::cancel::{cancel, Reserved};
use sluice_policies::algorithm::reserve::{reserve, Waiting};
use sluice_policies::algorithm::{Algorithm, Store};

#[derive(Debug, Clone)]
enum Event {
    /// After `gap` µs, a request of `cost` units that may wait `wait` µs.
    Arrive { gap: u64, cost: u64, wait: u64 },
    /// After `gap` µs, the client of the `n`th request still held goes away.
    Leave { gap: u64, n: usize },
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    let gap = prop_oneof![Just(0u64), 0u64..5_000, 0u64..300_000];
    let event = prop_oneof![
        4 => (gap.clone(), 1u64..4, prop_oneof![Just(1u64), 0u64..50_000, 0u64..2_000_000])
            .prop_map(|(gap, cost, wait)| Event::Arrive { gap, cost, wait }),
        1 => (gap, any::<usize>()).prop_map(|(gap, n)| Event::Leave { gap, n }),
    ];
    prop::collection::vec(event, 1..200)
}

/// One limit of each time-based kind.
fn limit() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        (1u64..6, 1u64..500).prop_map(|(limit, ms)| Algorithm::SlidingWindow { limit, window_us: ms * 1000 }),
        (1u64..6, 1u64..500).prop_map(|(limit, ms)| Algorithm::FixedWindow { limit, window_us: ms * 1000 }),
        (1u64..100_000, 1u64..6).prop_map(|(interval_us, burst)| Algorithm::Gcra {
            interval_us,
            burst,
            cost: 1
        }),
    ]
}

/// (slot, cost) of every request admitted in the end, in arrival order.
fn run(limits: &[Algorithm], margin: u64, events: &[Event]) -> Vec<(u64, u64)> {
    let mut store = Store::default();
    let mut now = 1_000_000_000u64;
    // Arrival order: the slot and cost of each reserved request, None once cancelled.
    let mut reserved: Vec<Option<(u64, u64)>> = Vec::new();
    // Held: (index in reserved, id, slot, what each limit's charge set).
    let mut held: Vec<(usize, String, u64, Vec<Reserved>)> = Vec::new();
    for (n, event) in events.iter().enumerate() {
        match *event {
            Event::Arrive { gap, cost, wait } => {
                now += gap;
                held.retain(|h| h.2 > now);
                let waiting: Vec<Waiting> = limits
                    .iter()
                    .enumerate()
                    .map(|(i, alg)| {
                        let alg = match *alg {
                            Algorithm::Gcra { interval_us, burst, .. } => {
                                Algorithm::Gcra { interval_us, burst, cost }
                            }
                            other => other,
                        };
                        (format!("k{i}"), alg, margin)
                    })
                    .collect();
                let id = format!("r{n}");
                let got = reserve(&mut store, now, &id, wait, &waiting).expect("time-based limits wait");
                if let Some(at) = got.at {
                    reserved.push(Some((at, cost)));
                    let charges = waiting
                        .iter()
                        .zip(&got.reply.limits)
                        .map(|((key, alg, _), l)| (key.clone(), *alg, l.held_until_us))
                        .collect();
                    held.push((reserved.len() - 1, id, at, charges));
                }
            }
            Event::Leave { gap, n } => {
                now += gap;
                held.retain(|h| h.2 > now);
                if held.is_empty() {
                    continue;
                }
                let (index, id, at, charges) = held.remove(n % held.len());
                cancel(&mut store, now, &id, at, &charges);
                reserved[index] = None;
            }
        }
    }
    reserved.into_iter().flatten().collect()
}

proptest! {
    /// Every limit holds over the admitted slots, margin included: an exact
    /// window of `window + margin` never holds more than `limit`, an aligned
    /// window never more than `limit`, a bucket never more than
    /// `burst + span / interval` units, and `interval` limits space requests
    /// at least `interval + margin` apart. Slots never go back in arrival order.
    #[test]
    fn admitted_slots_keep_every_limit_in_arrival_order(
        limits in prop::collection::vec(limit(), 1..=2),
        margin in prop_oneof![Just(0u64), 0u64..20_000],
        events in events(),
    ) {
        let admitted = run(&limits, margin, &events);
        for pair in admitted.windows(2) {
            prop_assert!(pair[0].0 <= pair[1].0, "out of arrival order: {:?}", pair);
        }
        for alg in &limits {
            match *alg {
                Algorithm::SlidingWindow { limit, window_us } => {
                    for (i, &(start, _)) in admitted.iter().enumerate() {
                        let within = admitted[i..].iter().take_while(|(t, _)| *t < start + window_us + margin).count();
                        prop_assert!(within as u64 <= limit, "{} in the window from {}", within, start);
                    }
                }
                Algorithm::FixedWindow { limit, window_us } => {
                    for (i, &(start, _)) in admitted.iter().enumerate() {
                        let same = admitted[i..].iter().take_while(|(t, _)| t / window_us == start / window_us).count();
                        prop_assert!(same as u64 <= limit, "{} in the window of {}", same, start);
                    }
                }
                Algorithm::Gcra { interval_us, burst, .. } => {
                    for i in 0..admitted.len() {
                        let mut units = 0;
                        for &(t, cost) in &admitted[i..] {
                            units += cost;
                            let span = t - admitted[i].0;
                            prop_assert!(units * interval_us <= burst * interval_us + span,
                                "{} units in {} µs", units, span);
                        }
                    }
                    if burst == 1 {
                        for pair in admitted.windows(2) {
                            prop_assert!(pair[1].0 - pair[0].0 >= pair[1].1 * interval_us + margin,
                                "spacing {:?} under interval {} + margin {}", pair, interval_us, margin);
                        }
                    }
                }
                _ => {}
            }
        }
    }
}
