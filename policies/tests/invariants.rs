//! The properties that make each algorithm a correct limiter, over the
//! reference model and random traffic. The differential tests in the shim tie
//! the Lua scripts to this model, so they hold for the scripts too.

use proptest::prelude::*;
use sluice_policies::algorithm::{self, Algorithm, Correction, RedisTwin, Refusals, State};
use sluice_policies::calendar::{Calendar, Period, Zone};
use sluice_policies::units::Micros;

/// Arrival gaps in µs, same-instant arrivals included.
fn gaps() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(prop_oneof![Just(0u64), 0u64..5_000, 0u64..500_000], 1..300)
}

fn check(store: &mut RedisTwin, now: u64, id: u64, limits: &[(String, Algorithm)]) -> bool {
    algorithm::check(store, now, &format!("r{id}"), limits).allowed
}

proptest! {
    /// The exact log never admits more than `limit` in any interval one
    /// window long, and denies only when `limit` are already in the window.
    #[test]
    fn sliding_window_admits_exactly_up_to_the_limit(limit in 1u64..20, window_ms in 1u64..2_000, gaps in gaps()) {
        let window = window_ms * 1000;
        let limits = [("k".to_string(), Algorithm::SlidingWindow { limit, window_us: Micros(window) })];
        let (mut store, mut now, mut admitted) = (RedisTwin::default(), 0u64, Vec::<u64>::new());
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
        let mut store = RedisTwin::default();
        let (mut now, mut admitted) = (0u64, Vec::<(u64, u64)>::new());
        for (i, (gap, cost)) in arrivals.into_iter().enumerate() {
            now += gap;
            let limits = [("k".to_string(), Algorithm::Gcra { interval_us: Micros(interval), burst, cost })];
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
        let limits = [("k".to_string(), Algorithm::Concurrency { limit, lease_us: Micros(lease) })];
        let (mut store, mut now, mut held) = (RedisTwin::default(), 0u64, Vec::<String>::new());
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
            ("a".to_string(), Algorithm::SlidingWindow { limit: 100, window_us: Micros(60_000_000) }),
            ("b".to_string(), Algorithm::Gcra { interval_us: Micros(1_000_000), burst: small, cost: 1 }),
            ("c".to_string(), Algorithm::FixedWindow { limit: 100, window_us: Micros(60_000_000), cost: 1 }),
            ("d".to_string(), Algorithm::SlidingApprox { limit: 100, window_us: Micros(60_000_000) }),
        ];
        let (mut store, mut now) = (RedisTwin::default(), 1_000_000_000u64);
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

/// One admitted request of `run_costed`: when its check ran and when its
/// adjustment landed, each as an event's (time, order) so that events of
/// the same instant compare exactly as the run applied them.
#[derive(Debug, Clone, Copy)]
struct Admitted {
    checked: (u64, usize),
    adjusted: (u64, usize),
    estimate: u64,
    actual: u64,
}

impl Admitted {
    /// The units this request's charge still owed the bucket at `event`:
    /// its under-estimate while its adjustment had not landed yet.
    fn owed_at(&self, event: (u64, usize)) -> u64 {
        if self.checked <= event && self.adjusted > event {
            self.actual.saturating_sub(self.estimate)
        } else {
            0
        }
    }
}

/// Runs `requests` through a points bucket in time order: each is checked
/// at its estimate and, if admitted, adjusted to its true cost `delay` later
/// (adjustments land in any order relative to later checks).
fn run_costed(interval: u64, burst: u64, requests: &[Costed]) -> Vec<Admitted> {
    enum Event {
        Check(usize),
        Adjust(Correction),
    }
    let key = "k".to_string();
    let mut store = RedisTwin::default();
    let mut arrivals = Vec::new();
    let mut now = 1_000_000_000u64;
    for r in requests {
        now += r.gap;
        arrivals.push(now);
    }
    // (time, order, event): at equal times, events run in `order`; request
    // n's check is 2n and its adjustment 2n + 1.
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
                let limits = [(
                    key.clone(),
                    Algorithm::Gcra { interval_us: Micros(interval), burst, cost: r.estimate },
                )];
                let reply = algorithm::check(&mut store, t, &format!("r{n}"), &limits);
                if reply.allowed {
                    let outcome = &reply.limits[0];
                    let correction = Correction {
                        key: key.clone(),
                        id: None,
                        interval_us: interval,
                        delta: r.actual as i64 - r.estimate as i64,
                        held_until_us: outcome
                            .held_until_us
                            .expect("an admitted bucket says until when")
                            .get(),
                        refunded_us: outcome.refunded_us.get(),
                    };
                    admitted.push(Admitted {
                        checked: (t, 2 * n),
                        adjusted: (t + r.delay, 2 * n + 1),
                        estimate: r.estimate,
                        actual: r.actual,
                    });
                    events.push((t + r.delay, 2 * n + 1, Event::Adjust(correction)));
                }
            }
            Event::Adjust(ref correction) => {
                if correction.delta != 0 {
                    algorithm::adjust(&mut store, t, std::slice::from_ref(correction));
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
    /// would admit (`burst + span / interval`), plus the under-estimates
    /// the bucket had not been charged yet: those owed when the span began
    /// (they left it room it should not have had), and those of the span's
    /// own requests still owed when it ended. Late refunds may only give
    /// back what a request's own charge still holds (the over-admission of a
    /// refund that returned what the cap had already thrown away).
    #[test]
    fn points_admitted_never_exceed_a_bucket_charged_the_true_costs(
        interval in 1_000u64..1_000_000, burst in 1u64..20, requests in costed(),
    ) {
        let admitted = run_costed(interval, burst, &requests);
        for i in 0..admitted.len() {
            let start = admitted[i].checked;
            let owed_before: u64 = admitted[..i].iter().map(|a| a.owed_at(start)).sum();
            let mut units = 0;
            for j in i..admitted.len() {
                let end = admitted[j].checked;
                units += admitted[j].actual;
                let owed_after: u64 = admitted[i..=j].iter().map(|a| a.owed_at(end)).sum();
                let span = end.0 - start.0;
                prop_assert!(
                    units <= burst + span / interval + owed_before + owed_after,
                    "{} true units in {} µs (burst {}, interval {}, {} owed at the start, {} at the end)",
                    units, span, burst, interval, owed_before, owed_after
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
    let limits =
        |cost| [("k".to_string(), Algorithm::Gcra { interval_us: Micros(interval), burst: 10, cost })];
    let t0 = 1_000 * second;
    let mut store = RedisTwin::default();
    let r1 = algorithm::check(&mut store, t0, "r1", &limits(10));
    assert!(r1.allowed);
    assert!(algorithm::check(&mut store, t0 + 10 * second, "r2", &limits(10)).allowed);
    let refund = Correction {
        key: "k".to_string(),
        id: None,
        interval_us: interval,
        delta: -10,
        held_until_us: r1.limits[0].held_until_us.expect("held until").get(),
        refunded_us: r1.limits[0].refunded_us.get(),
    };
    algorithm::adjust(&mut store, t0 + 10 * second + 1_000, &[refund]);
    let r3 = algorithm::check(&mut store, t0 + 10 * second + 2_000, "r3", &limits(10));
    assert!(!r3.allowed, "a late refund gave back points the cap had already thrown away");
}

/// An earlier refund moves the charges behind it: points with capacity 3,
/// one unit per 100 ms. R0 and R1 cost 1 each at 0; R0's refund (actual 0)
/// lands at once and moves R1's charge from [100, 200] ms to [0, 100] ms.
/// R2 costs 1 at 50 ms and turns out to cost 3. R1's refund (actual 0) at
/// 60 ms may return only the 40 ms its moved charge still holds. A bucket
/// charged the true costs holds R2's 3 units from 50 ms: at 110 ms, 2.4
/// units, so R3 (cost 1) does not fit. Refunding R1 from where its charge
/// first ended returned a whole unit and admitted R3.
#[test]
fn a_refund_behind_an_earlier_refund_returns_only_what_its_moved_charge_holds() {
    let interval = 100_000u64;
    let limits =
        |cost| [("k".to_string(), Algorithm::Gcra { interval_us: Micros(interval), burst: 3, cost })];
    let refund = |reply: &algorithm::CheckReply, delta| Correction {
        key: "k".to_string(),
        id: None,
        interval_us: interval,
        delta,
        held_until_us: reply.limits[0].held_until_us.expect("held until").get(),
        refunded_us: reply.limits[0].refunded_us.get(),
    };
    let t0 = 1_000_000_000u64;
    let mut store = RedisTwin::default();
    let r0 = algorithm::check(&mut store, t0, "r0", &limits(1));
    let r1 = algorithm::check(&mut store, t0, "r1", &limits(1));
    assert!(r0.allowed && r1.allowed);
    algorithm::adjust(&mut store, t0 + 1, &[refund(&r0, -1)]);
    let r2 = algorithm::check(&mut store, t0 + 50_000, "r2", &limits(1));
    assert!(r2.allowed);
    algorithm::adjust(&mut store, t0 + 50_000, &[refund(&r2, 2)]);
    algorithm::adjust(&mut store, t0 + 60_000, &[refund(&r1, -1)]);
    let r3 = algorithm::check(&mut store, t0 + 110_000, "r3", &limits(1));
    assert!(!r3.allowed, "a refund returned more than its moved charge still held");
}

/// A calendar window as the property below names it, from a date alone
/// (not from `Calendar::window`): the local date of the window's first day.
fn calendar_key(c: &sluice_policies::calendar::Calendar, at_us: u64) -> jiff::civil::Date {
    use sluice_policies::calendar::Period;
    let tz = jiff::tz::db().get(c.zone.name()).expect("a zone");
    let ts = jiff::Timestamp::from_microsecond(at_us as i64).expect("in range");
    let date = ts.to_zoned(tz).date();
    match c.period {
        Period::Day => date,
        Period::Week { starts } => {
            let mut d = date;
            while d.weekday() != starts {
                d = d.yesterday().expect("a date");
            }
            d
        }
        Period::Month { anchor } => {
            // The month's anchor day, or its last; before it, the previous month's.
            let first_day = |d: jiff::civil::Date| {
                let d = d.first_of_month();
                d.with().day((anchor as i8).min(d.days_in_month())).build().expect("a day")
            };
            if date >= first_day(date) {
                first_day(date)
            } else {
                first_day(date.first_of_month().yesterday().expect("a date"))
            }
        }
    }
}

proptest! {
    /// A calendar window never admits more than its limit (in points, net
    /// of the refunds corrections made) between two of its local midnights,
    /// and refuses a request only when the request would take it over:
    /// across DST changes, skipped midnights, months of every length and
    /// anchor 31 in February.
    #[test]
    fn calendar_windows_never_exceed_their_limit(
        zone in prop::sample::select(vec!["UTC", "Europe/Paris", "America/Santiago", "Australia/Lord_Howe", "Asia/Kathmandu"]),
        period in prop_oneof![
            Just(sluice_policies::calendar::Period::Day),
            Just(sluice_policies::calendar::Period::Week { starts: sluice_policies::calendar::Weekday::Sunday }),
            (1u8..=31).prop_map(|anchor| sluice_policies::calendar::Period::Month { anchor }),
        ],
        limit in 1u64..30,
        start in 1_767_225_600_000_000u64..1_830_297_600_000_000, // 2026 to 2027
        arrivals in prop::collection::vec(
            (prop_oneof![Just(0u64), 0u64..3_600_000_000, 0u64..2 * 86_400_000_000], 0u64..10, prop::option::of(0u64..10)),
            1..200,
        ),
    ) {
        use std::collections::HashMap;
        let c = sluice_policies::calendar::Calendar {
            period,
            zone: sluice_policies::calendar::Zone::new(zone).expect("a zone"),
        };
        let alg = Algorithm::Calendar { limit, cost: 0, calendar: c, points: true };
        let mut store = RedisTwin::default();
        let mut used: HashMap<jiff::civil::Date, u64> = HashMap::new();
        let mut now = start;
        for (i, (gap, cost, actual)) in arrivals.into_iter().enumerate() {
            now += gap;
            let Algorithm::Calendar { calendar, points, .. } = alg else { unreachable!() };
            let limits = [("k".to_string(), Algorithm::Calendar { limit, cost, calendar, points })];
            let key = calendar_key(&c, now);
            let before = used.get(&key).copied().unwrap_or(0);
            let reply = algorithm::check(&mut store, now, &format!("r{i}"), &limits);
            prop_assert_eq!(reply.allowed, before + cost <= limit, "at {} with {} used of {}", now, before, limit);
            if !reply.allowed {
                continue;
            }
            let mut charged = cost;
            // A refund only: the true cost at most the estimate.
            if let Some(actual) = actual.filter(|a| *a < cost) {
                let held = reply.limits[0].held_until_us.map_or(0, Micros::get);
                let c = Correction { key: "k".into(), id: None, interval_us: 0, delta: actual as i64 - cost as i64, held_until_us: held, refunded_us: 0 };
                algorithm::adjust(&mut store, now, &[c]);
                charged = actual;
            }
            let total = before + charged;
            prop_assert!(total <= limit, "{} in the window of {}", total, key);
            used.insert(key, total);
        }
    }
}

/// One step of the settlement property: a reservation of `reserve` units
/// (its true cost `actual`), or the settlement of the `n`th reservation so
/// far, sent `times` times (a settlement sent again).
#[derive(Debug, Clone)]
enum Step {
    Reserve { reserve: u64, actual: u64 },
    Settle { n: usize, times: usize },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let one = prop_oneof![
        (0u64..400, 0u64..400).prop_map(|(reserve, actual)| Step::Reserve { reserve, actual }),
        (any::<usize>(), 1usize..4).prop_map(|(n, times)| Step::Settle { n, times }),
    ];
    prop::collection::vec(one, 1..80)
}

/// The units a bucket holds at `now`, rounded up: within less than one
/// unit's refill of its charges, a bucket holds exactly them.
fn held(store: &RedisTwin, key: &str, now: u64, interval: u64) -> u64 {
    match store.keys.get(key) {
        Some(&State::Tat(tat)) => tat.saturating_sub(now).div_ceil(interval),
        _ => 0,
    }
}

proptest! {
    /// Exact refunds: after any interleaving of reservations and their
    /// settlements, in any order and each sent any number of times, a
    /// bucket that refills nothing meanwhile (a budget of 2,000 a day, all
    /// within a millisecond) holds exactly the true costs of the settled
    /// requests and the reservations of the others; a calendar window's
    /// counter too. Before, one refund counter stood for every charge: a
    /// charge whose later neighbours were refunded first was given back
    /// only part of its own unused reservation, or none, and a settlement
    /// sent twice was applied twice.
    #[test]
    fn settlements_leave_exactly_the_true_costs(steps in steps(), calendar in any::<bool>()) {
        let capacity = 2_000u64;
        let interval = 86_400_000_000 / capacity;
        let day = utc_day();
        let now0 = 1_700_000_000_000_000u64;
        let alg = |cost| if calendar {
            Algorithm::Calendar { limit: capacity, cost, calendar: day, points: true }
        } else {
            Algorithm::Gcra { interval_us: Micros(interval), burst: capacity, cost }
        };
        let key = "k".to_string();
        let mut store = RedisTwin::default();
        // Each admitted reservation: its correction, and whether it settled.
        let mut admitted: Vec<(Correction, u64, u64, bool)> = Vec::new();
        for (i, step) in steps.into_iter().enumerate() {
            let now = now0 + i as u64;
            match step {
                Step::Reserve { reserve, actual } => {
                    let reply = algorithm::check(&mut store, now, &format!("r{i}"), &[(key.clone(), alg(reserve))]);
                    if reply.allowed {
                        let outcome = &reply.limits[0];
                        let correction = Correction {
                            key: key.clone(),
                            id: Some(format!("r{i}")),
                            interval_us: if calendar { 0 } else { interval },
                            delta: actual as i64 - reserve as i64,
                            held_until_us: outcome.held_until_us.map_or(0, Micros::get),
                            refunded_us: outcome.refunded_us.get(),
                        };
                        admitted.push((correction, reserve, actual, false));
                    }
                }
                Step::Settle { n, times } => {
                    if admitted.is_empty() {
                        continue;
                    }
                    let n = n % admitted.len();
                    for _ in 0..times {
                        algorithm::adjust(&mut store, now, std::slice::from_ref(&admitted[n].0));
                    }
                    admitted[n].3 = true;
                }
            }
            let owed: u64 = admitted.iter().map(|&(_, reserve, actual, settled)| if settled { actual } else { reserve }).sum();
            let holds = if calendar {
                match store.keys.get(&key) {
                    Some(&State::Counter { count, .. }) => count,
                    _ => 0,
                }
            } else {
                held(&store, &key, now, interval)
            };
            prop_assert_eq!(holds, owed, "after step {}", i);
        }
    }
}

/// A day in UTC, for the calendar case of the settlement property.
fn utc_day() -> Calendar {
    Calendar { period: Period::Day, zone: Zone::new("UTC").expect("UTC") }
}

proptest! {
    /// A `start: first_hit` fixed_window, as Limitador counts: the first
    /// admitted request opens a window `window` long, the first admitted
    /// at or after its end opens the next. Each window admits at most
    /// `limit`, and a request is refused only inside a window that already
    /// holds `limit`; its wait is exactly the time to that window's end.
    #[test]
    fn first_hit_windows_open_at_a_hit_and_admit_exactly_up_to_the_limit(
        limit in 1u64..20, window_ms in 1u64..2_000, gaps in gaps(),
    ) {
        let window = window_ms * 1000;
        let limits = [("k".to_string(), Algorithm::FirstHit { limit, window_us: Micros(window), cost: 1 })];
        let mut store = RedisTwin::default();
        // The window the true outcomes imply: its start and what it admitted.
        let (mut now, mut open): (u64, Option<(u64, u64)>) = (0, None);
        for (i, gap) in gaps.into_iter().enumerate() {
            now += gap;
            let live = open.filter(|(start, _)| now < start + window);
            let decision = algorithm::check(&mut store, now, &format!("r{i}"), &limits);
            match live {
                Some((start, n)) if n >= limit => {
                    prop_assert!(!decision.allowed, "admitted past {} in the window from {}", limit, start);
                    prop_assert_eq!(decision.retry_after_ms, Some(sluice_policies::units::Millis((start + window - now).div_ceil(1000))));
                }
                Some((start, n)) => {
                    prop_assert!(decision.allowed, "refused with {} of {} in the window from {}", n, limit, start);
                    open = Some((start, n + 1));
                }
                None => {
                    prop_assert!(decision.allowed, "refused at {} with no window open", now);
                    open = Some((now, 1));
                }
            }
        }
    }
}

proptest! {
    /// A window that counts a cost (an RLS call's `hits_addend`), aligned to
    /// the epoch or opened at the first hit: over the true outcomes, the
    /// costs a window admits never sum past its limit, and a request is
    /// refused only when its cost does not fit in what its window has left
    /// (a cost above the limit never fits). With refusals counted (`charge:
    /// every_hit`), a refused cost is counted too and opens a window as an
    /// admitted one does: a request then fits only in what the window has
    /// left after every cost counted in it, and the costs admitted still
    /// never sum past the limit.
    #[test]
    fn a_window_admits_at_most_its_limit_in_cost(
        limit in 1u64..20, window_ms in 1u64..2_000, first_hit in any::<bool>(), every_hit in any::<bool>(),
        steps in prop::collection::vec((prop_oneof![Just(0u64), 0u64..5_000, 0u64..500_000], 1u64..25), 1..300),
    ) {
        let refusals = if every_hit { Refusals::Counted } else { Refusals::Uncharged };
        let window = window_ms * 1000;
        let alg = if first_hit {
            Algorithm::FirstHit { limit, window_us: Micros(window), cost: 1 }
        } else {
            Algorithm::FixedWindow { limit, window_us: Micros(window), cost: 1 }
        };
        let mut store = RedisTwin::default();
        // The window the true outcomes imply: its start, the cost counted in
        // it and the cost it admitted.
        let (mut now, mut open): (u64, Option<(u64, u64, u64)>) = (0, None);
        for (i, (gap, cost)) in steps.into_iter().enumerate() {
            now += gap;
            let limits = [("k".to_string(), match alg {
                Algorithm::FirstHit { .. } => Algorithm::FirstHit { limit, window_us: Micros(window), cost },
                _ => Algorithm::FixedWindow { limit, window_us: Micros(window), cost },
            })];
            let start = if first_hit { now } else { now / window * window };
            let (start, counted, admitted) = match open {
                Some((s, c, a)) if now < s + window => (s, c, a),
                _ => (start, 0, 0),
            };
            let allowed = algorithm::check_viewing(&mut store, now, &format!("r{i}"), &limits, true, refusals).allowed;
            prop_assert_eq!(allowed, counted + cost <= limit, "cost {} with {} of {} counted at {}", cost, counted, limit, now);
            if allowed {
                open = Some((start, counted + cost, admitted + cost));
            } else if every_hit {
                open = Some((start, counted + cost, admitted));
            }
            prop_assert!(open.map_or(0, |(_, _, a)| a) <= limit, "admitted past {} in the window from {}", limit, start);
        }
    }
}
