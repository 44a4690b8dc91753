//! Egress waiting over the reference model: whatever the arrivals, waits,
//! margins and cancellations, the requests finally admitted (reserved, not
//! cancelled, and sent: confirmed at their slots, as the shim does) never
//! break any limit, and they are admitted in arrival order. The invariants are stated over the admitted times against the
//! limit, not over the model's own formulas. The shim's differential test
//! ties the scripts to this model, so they hold for the scripts too.

use proptest::prelude::*;
use sluice_policies::algorithm::cancel::{cancel, Reserved};
use sluice_policies::algorithm::confirm::{confirm, Confirmed};
use sluice_policies::algorithm::reserve::{reserve, Waiting};
use sluice_policies::algorithm::{Algorithm, RedisTwin, State};
use sluice_policies::units::Micros;

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
        (1u64..6, 1u64..500)
            .prop_map(|(limit, ms)| Algorithm::SlidingWindow { limit, window_us: Micros(ms * 1000) }),
        (1u64..6, 1u64..500).prop_map(|(limit, ms)| Algorithm::FixedWindow {
            limit,
            window_us: Micros(ms * 1000),
            cost: 1
        }),
        (1u64..100_000, 1u64..6).prop_map(|(interval_us, burst)| Algorithm::Gcra {
            interval_us: Micros(interval_us),
            burst,
            cost: 1
        }),
    ]
}

/// A held request: its index in arrival order, id, slot, what each
/// limit's charge set, its limits, and when it next confirms.
type Held = (usize, String, u64, Vec<Reserved>, Vec<Waiting>, u64);

/// Every held request whose turn comes by `until` confirms its send, on
/// time, in turn (the shim at its slots): sent, it is admitted at the send.
fn send_due(store: &mut RedisTwin, held: &mut Vec<Held>, reserved: &mut [Option<(u64, u64)>], until: u64) {
    while let Some(i) =
        (0..held.len()).filter(|&i| held[i].5 <= until).min_by_key(|&i| (held[i].5, held[i].0))
    {
        let (index, id, at, _, waiting, t) = held[i].clone();
        match confirm(store, t, &id, at, &waiting) {
            Confirmed::Wait(w) => held[i].5 = t + w,
            Confirmed::Sent { .. } => {
                reserved[index] = reserved[index].map(|(_, cost)| (t, cost));
                held.remove(i);
            }
            Confirmed::Gone => {
                reserved[index] = None;
                held.remove(i);
            }
        }
    }
}

/// (send, cost) of every request admitted in the end, in arrival order.
fn run(limits: &[Algorithm], margin: u64, events: &[Event]) -> Vec<(u64, u64)> {
    let mut store = RedisTwin::default();
    let mut now = 1_000_000_000u64;
    // Arrival order: the slot (then send) and cost of each reserved request, None once cancelled.
    let mut reserved: Vec<Option<(u64, u64)>> = Vec::new();
    let mut held: Vec<Held> = Vec::new();
    for (n, event) in events.iter().enumerate() {
        match *event {
            Event::Arrive { gap, cost, wait } => {
                now += gap;
                send_due(&mut store, &mut held, &mut reserved, now);
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
                        .map(|((key, alg, _), l)| (key.clone(), *alg, l.held_until_us.map(Micros::get)))
                        .collect();
                    if at > now {
                        held.push((reserved.len() - 1, id, at, charges, waiting, at));
                    }
                }
            }
            Event::Leave { gap, n } => {
                now += gap;
                send_due(&mut store, &mut held, &mut reserved, now);
                if held.is_empty() {
                    continue;
                }
                let (index, id, at, charges, _, _) = held.remove(n % held.len());
                cancel(&mut store, now, &id, at, &charges);
                reserved[index] = None;
            }
        }
    }
    send_due(&mut store, &mut held, &mut reserved, u64::MAX);
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
                    let window_us = window_us.get();
                    for (i, &(start, _)) in admitted.iter().enumerate() {
                        let within = admitted[i..].iter().take_while(|(t, _)| *t < start + window_us + margin).count();
                        prop_assert!(within as u64 <= limit, "{} in the window from {}", within, start);
                    }
                }
                Algorithm::FixedWindow { limit, window_us, .. } => {
                    let window_us = window_us.get();
                    for (i, &(start, _)) in admitted.iter().enumerate() {
                        let same = admitted[i..].iter().take_while(|(t, _)| t / window_us == start / window_us).count();
                        prop_assert!(same as u64 <= limit, "{} in the window of {}", same, start);
                    }
                }
                Algorithm::Gcra { interval_us, burst, .. } => {
                    let interval_us = interval_us.get();
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

#[derive(Debug, Clone)]
enum QueueEvent {
    /// After `gap` µs, a request that may wait `wait` µs for a slot.
    Arrive { gap: u64, wait: u64 },
    /// The `n`th request seen so far is released (held or queued).
    Release { n: usize },
    /// The `n`th request seen so far leaves the queue (timeout or client gone).
    Leave { n: usize },
    /// After `gap` µs, a waiting shim's reclaim timer fires.
    Reclaim { gap: u64 },
}

fn queue_events() -> impl Strategy<Value = Vec<QueueEvent>> {
    let gap = prop_oneof![Just(0u64), 0u64..5_000, 0u64..300_000];
    let event = prop_oneof![
        4 => (gap.clone(), prop_oneof![Just(1u64), 0u64..1_000_000]).prop_map(|(gap, wait)| QueueEvent::Arrive { gap, wait }),
        3 => any::<usize>().prop_map(|n| QueueEvent::Release { n }),
        1 => any::<usize>().prop_map(|n| QueueEvent::Leave { n }),
        1 => gap.prop_map(|gap| QueueEvent::Reclaim { gap }),
    ];
    prop::collection::vec(event, 1..200)
}

proptest! {
    /// Whatever the arrivals, releases, departures and lease expiries: never
    /// more than `limit` live leases, and queued requests are served (given
    /// a lease from the queue) in their order of arrival.
    #[test]
    fn the_queue_serves_in_arrival_order_within_the_limit(
        limit in 1u64..4, lease in prop_oneof![Just(50_000u64), Just(10_000_000u64)], events in queue_events(),
    ) {
        use sluice_policies::algorithm::queue::{self, AcquireReply};
        use sluice_policies::algorithm::State;
        let mut store = RedisTwin::default();
        let mut now = 1_000_000_000u64;
        let mut ids: Vec<String> = Vec::new();
        let mut waiting: Vec<usize> = Vec::new();
        let mut served: Vec<usize> = Vec::new();
        for event in events {
            match event {
                QueueEvent::Arrive { gap, wait } => {
                    now += gap;
                    let id = format!("r{}", ids.len());
                    ids.push(id.clone());
                    if let (AcquireReply::Queued { .. }, _) = queue::acquire(&mut store, "k", now, &id, limit, lease, wait, "c") {
                        waiting.push(ids.len() - 1);
                    }
                }
                QueueEvent::Release { n } if !ids.is_empty() => {
                    let i = n % ids.len();
                    queue::release(&mut store, "k", now, &ids[i], limit, lease);
                }
                QueueEvent::Leave { n } if !ids.is_empty() => {
                    let i = n % ids.len();
                    queue::leave(&mut store, "k", now, &ids[i], limit, lease);
                }
                QueueEvent::Reclaim { gap } => {
                    now += gap;
                    queue::reclaim_timer(&mut store, "k", now, limit, lease);
                }
                _ => {}
            }
            let leases: Vec<(u64, String)> = match store.keys.get("k") {
                Some(State::Set(entries)) => entries.clone(),
                _ => Vec::new(),
            };
            let live = leases.iter().filter(|(x, _)| *x > now).count() as u64;
            prop_assert!(live <= limit, "{} live leases over {}", live, limit);
            let queued: Vec<String> = match store.keys.get("k:q") {
                Some(State::Queue(w)) => w.iter().map(|w| w.id.clone()).collect(),
                _ => Vec::new(),
            };
            // A waiter that left the queue holding a lease was served.
            waiting.retain(|&i| {
                if queued.contains(&ids[i]) {
                    return true;
                }
                if leases.iter().any(|(_, m)| *m == ids[i]) {
                    served.push(i);
                }
                false
            });
        }
        prop_assert!(served.windows(2).all(|w| w[0] < w[1]), "served out of arrival order: {:?}", served);
    }
}

proptest! {
    /// Regression: a refund on a bucket with held reservations moved only
    /// its `tat`, and the next walk of the chain, from the real sends' `tat`,
    /// undid it: while anything was held a refund was lost. A refund is now
    /// taken into the real sends. Whatever is held when it lands, once that
    /// is all given back the bucket is exactly what the refund alone makes it.
    #[test]
    fn a_refund_while_requests_are_held_is_kept(
        interval in 1_000u64..100_000,
        burst in 1u64..5,
        held in 1usize..5,
        refund in 1u64..5,
        dt in 0u64..200_000,
    ) {
        use sluice_policies::algorithm::{adjust, Correction};
        let now = 1_000_000_000u64;
        let bucket = |cost| vec![("k".to_string(), Algorithm::Gcra { interval_us: Micros(interval), burst, cost }, 0)];
        // The same send on two buckets: a full bucket's worth at once.
        let (mut with_held, mut alone) = (RedisTwin::default(), RedisTwin::default());
        let sent = reserve(&mut with_held, now, "r0", 0, &bucket(burst)).expect("waits");
        reserve(&mut alone, now, "r0", 0, &bucket(burst)).expect("waits");
        prop_assert_eq!(sent.at, Some(now));
        let mut slots = Vec::new();
        for i in 0..held {
            let id = format!("r{}", i + 1);
            let got = reserve(&mut with_held, now, &id, u64::MAX / 4, &bucket(1)).expect("waits");
            let at = got.at.expect("a slot");
            prop_assert!(at > now, "r{} was sent at once", i + 1);
            slots.push((id, at));
        }
        let limit = &sent.reply.limits[0];
        let correction = Correction {
            key: "k".into(),
            id: None,
            interval_us: interval,
            delta: -i64::try_from(refund.min(burst)).expect("small"),
            held_until_us: limit.held_until_us.map_or(0, Micros::get),
            refunded_us: limit.refunded_us.get(),
        };
        let later = now + dt;
        let moved = adjust(&mut with_held, later, std::slice::from_ref(&correction));
        prop_assert_eq!(moved, adjust(&mut alone, later, &[correction]));
        for (id, at) in slots {
            let reserved: Vec<Reserved> = bucket(1).into_iter().map(|(k, a, _)| (k, a, None)).collect();
            cancel(&mut with_held, later, &id, at, &reserved);
        }
        // (A `tat` at or before now is a full bucket, however it is stored.)
        let tat = |store: &RedisTwin| match store.keys.get("k") {
            Some(&State::Tat(t)) => t.max(later),
            _ => later,
        };
        prop_assert_eq!(tat(&with_held), tat(&alone));
    }
}
/// A case the property once found when held reservations counted as sent
/// at their slot without confirming: one dropped past its deadline (never
/// confirmed, so never sent) let the bucket take 22 units where 21 fit.
/// Confirmed as the shim confirms them, the bucket holds.
#[test]
fn a_cost_weighted_bucket_holds_over_held_sends_confirmed_at_their_slot() {
    let (interval_us, burst) = (83_461, 4);
    let limits = [Algorithm::Gcra { interval_us: Micros(interval_us), burst, cost: 1 }];
    let events = [
        Event::Arrive { gap: 0, cost: 1, wait: 1 },
        Event::Arrive { gap: 0, cost: 2, wait: 1 },
        Event::Arrive { gap: 0, cost: 2, wait: 133835 },
        Event::Arrive { gap: 0, cost: 1, wait: 1 },
        Event::Arrive { gap: 0, cost: 2, wait: 250383 },
        Event::Arrive { gap: 0, cost: 1, wait: 1 },
        Event::Arrive { gap: 0, cost: 1, wait: 333844 },
        Event::Arrive { gap: 0, cost: 1, wait: 417305 },
        Event::Leave { gap: 0, n: 0 },
        Event::Arrive { gap: 81344, cost: 1, wait: 1 },
        Event::Arrive { gap: 3179, cost: 3, wait: 416243 },
        Event::Arrive { gap: 289419, cost: 1, wait: 1 },
        Event::Arrive { gap: 4233, cost: 1, wait: 1 },
        Event::Arrive { gap: 4593, cost: 1, wait: 1 },
        Event::Leave { gap: 196615, n: 0 },
        Event::Leave { gap: 4232, n: 0 },
        Event::Arrive { gap: 612, cost: 1, wait: 1 },
        Event::Arrive { gap: 52401, cost: 1, wait: 364904 },
        Event::Arrive { gap: 214423, cost: 1, wait: 1 },
        Event::Arrive { gap: 0, cost: 1, wait: 233945 },
        Event::Leave { gap: 4474, n: 4097025867526868790 },
        Event::Arrive { gap: 0, cost: 3, wait: 1572476 },
        Event::Leave { gap: 4984, n: 9342941243681100778 },
        Event::Arrive { gap: 4015, cost: 1, wait: 1368911 },
        Event::Arrive { gap: 245991, cost: 1, wait: 1 },
        Event::Arrive { gap: 161345, cost: 2, wait: 1 },
        Event::Arrive { gap: 63516, cost: 1, wait: 1 },
        Event::Leave { gap: 143116, n: 19755396645130695 },
        Event::Arrive { gap: 218711, cost: 2, wait: 1935505 },
        Event::Arrive { gap: 296613, cost: 2, wait: 1066013 },
        Event::Leave { gap: 116326, n: 11431791042814140385 },
        Event::Arrive { gap: 171172, cost: 2, wait: 756554 },
        Event::Leave { gap: 223908, n: 5159958674290874700 },
        Event::Arrive { gap: 191354, cost: 3, wait: 917885 },
        Event::Arrive { gap: 287367, cost: 3, wait: 33223 },
        Event::Leave { gap: 551, n: 9207346028175963314 },
        Event::Arrive { gap: 4368, cost: 2, wait: 1 },
        Event::Leave { gap: 260373, n: 5716577550260840027 },
        Event::Arrive { gap: 0, cost: 1, wait: 980230 },
        Event::Arrive { gap: 203174, cost: 1, wait: 1 },
        Event::Arrive { gap: 0, cost: 1, wait: 691455 },
        Event::Arrive { gap: 184032, cost: 1, wait: 1251751 },
        Event::Leave { gap: 0, n: 17644187163377125903 },
        Event::Arrive { gap: 102302, cost: 2, wait: 3970 },
        Event::Arrive { gap: 295500, cost: 3, wait: 1778769 },
        Event::Arrive { gap: 3766, cost: 2, wait: 916895 },
        Event::Leave { gap: 0, n: 4901410109839968794 },
        Event::Arrive { gap: 989, cost: 3, wait: 1492228 },
        Event::Arrive { gap: 1466, cost: 3, wait: 862998 },
        Event::Arrive { gap: 773, cost: 1, wait: 888030 },
        Event::Arrive { gap: 0, cost: 1, wait: 1635605 },
        Event::Arrive { gap: 297236, cost: 2, wait: 40357 },
        Event::Leave { gap: 279504, n: 1396199735249304460 },
        Event::Arrive { gap: 109589, cost: 3, wait: 1683158 },
        Event::Arrive { gap: 0, cost: 2, wait: 893887 },
        Event::Arrive { gap: 193772, cost: 2, wait: 1 },
        Event::Arrive { gap: 281079, cost: 1, wait: 834794 },
        Event::Arrive { gap: 0, cost: 2, wait: 1151417 },
        Event::Arrive { gap: 134779, cost: 2, wait: 1504543 },
        Event::Arrive { gap: 3636, cost: 3, wait: 1753074 },
        Event::Arrive { gap: 0, cost: 3, wait: 1763152 },
        Event::Arrive { gap: 110850, cost: 1, wait: 1 },
        Event::Arrive { gap: 2554, cost: 3, wait: 1598131 },
        Event::Leave { gap: 0, n: 959155844201627212 },
        Event::Arrive { gap: 278077, cost: 3, wait: 11680 },
        Event::Arrive { gap: 163542, cost: 3, wait: 37915 },
        Event::Leave { gap: 3181, n: 12225794413596564631 },
        Event::Leave { gap: 0, n: 14874992474928374279 },
        Event::Arrive { gap: 3855, cost: 2, wait: 25744 },
        Event::Arrive { gap: 0, cost: 1, wait: 1866787 },
        Event::Leave { gap: 666, n: 6904781521893519303 },
        Event::Arrive { gap: 2154, cost: 1, wait: 35405 },
        Event::Arrive { gap: 3667, cost: 3, wait: 418189 },
    ];
    let sent = run(&limits, 0, &events);
    for i in 0..sent.len() {
        let mut units = 0;
        for &(t, cost) in &sent[i..] {
            units += cost;
            let span = t - sent[i].0;
            assert!(units * interval_us <= burst * interval_us + span, "{units} units in {span} µs");
        }
    }
}
