//! Upstream feedback judged by its true outcome: the partner's own refusals.
//!
//! A fleet sends calls through the reference model to a partner whose
//! hidden limit is stricter than the policy's. Each refusal comes back,
//! `latency` after the call reached the partner, with the partner's
//! `Retry-After` and is recorded as the shim records it
//! (`algorithm::upstream`). The partner then refuses, per lowering of the
//! rate, at most the call that lowered it and the calls already in flight
//! then; and the rate is lowered only until the policy's window fits the
//! partner's, so refusals stop.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use proptest::prelude::*;
use sluice_policies::algorithm::rate::PPM;
use sluice_policies::algorithm::{self, Algorithm, RedisTwin};
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::Slowdown;

const TAG: &str = "sluice:{partner:acme}:";

/// Halves the rate; the climb back is far slower than any run, so the
/// bound on lowerings is exact.
const SLOW: Slowdown =
    Slowdown { decrease_ppm: 500_000, recover_ms: Millis(1_000_000_000_000), min_ppm: 1_000 };

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A call reaches the gateway.
    Sent,
    /// An admitted call reaches the partner.
    AtPartner,
    /// The partner's refusal reaches the gateway, retry after this many µs.
    Refused(u64),
    /// The partner's acceptance reaches the gateway.
    Served,
}

#[derive(Debug, Default)]
struct Outcome {
    refused: usize,
    lowered: usize,
    /// Per lowering: the refusal that lowered it and the calls in flight then.
    bound: usize,
}

fn run(
    limit: u64,
    hidden: usize,
    window_us: u64,
    latency_us: u64,
    gaps: &[u64],
    slow: Option<&Slowdown>,
) -> Outcome {
    let limits = vec![
        (
            format!("{TAG}sw:{}", window_us / 1000),
            Algorithm::SlidingWindow { limit, window_us: Micros(window_us) },
        ),
        (format!("{TAG}pause"), Algorithm::Pause),
        (format!("{TAG}rate"), Algorithm::Rate),
    ];
    let keys = (limits[1].0.as_str(), limits[2].0.as_str());
    let mut store = RedisTwin::default();
    let mut events = BinaryHeap::new();
    let mut now = 1_700_000_000_000_000u64;
    for (n, gap) in gaps.iter().enumerate() {
        now += gap;
        events.push(Reverse((now, n, Event::Sent)));
    }
    let mut accepted: Vec<u64> = Vec::new();
    let mut in_flight = 0usize;
    let mut out = Outcome::default();
    while let Some(Reverse((t, n, event))) = events.pop() {
        match event {
            Event::Sent => {
                if algorithm::check(&mut store, t, &format!("r{n}"), &limits).allowed {
                    in_flight += 1;
                    events.push(Reverse((t + latency_us, n, Event::AtPartner)));
                }
            }
            Event::AtPartner => {
                // The partner's exact sliding window of `hidden` calls.
                let inside: Vec<u64> = accepted.iter().copied().filter(|&a| a + window_us > t).collect();
                let answer = if inside.len() < hidden {
                    accepted.push(t);
                    Event::Served
                } else {
                    // Retry-After in whole seconds, rounded up, as partners send it.
                    let wait = inside[inside.len() - hidden] + window_us - t;
                    Event::Refused(wait.div_ceil(1_000_000).max(1) * 1_000_000)
                };
                events.push(Reverse((t + latency_us, n, answer)));
            }
            Event::Served => in_flight -= 1,
            Event::Refused(retry_us) => {
                in_flight -= 1;
                out.refused += 1;
                let (_, slowed) = algorithm::upstream(&mut store, t, keys, retry_us, slow);
                if slowed {
                    out.lowered += 1;
                    out.bound += 1 + in_flight;
                }
            }
        }
    }
    out
}

/// How many halvings bring `limit` within `hidden` (windows keep at least 1).
fn halvings_needed(limit: u64, hidden: u64) -> usize {
    let (mut f, mut k) = (PPM, 0);
    while (limit * f / PPM).max(1) > hidden {
        f = f * SLOW.decrease_ppm / PPM;
        k += 1;
    }
    k
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// The partner refuses, per lowering, at most the call that lowered the
    /// rate and the calls in flight then; the rate is lowered only as often
    /// as halving the policy's limit takes to fit the partner's.
    #[test]
    fn refusals_stop_once_the_rate_fits_the_partner(
        limit in 2u64..40,
        share in 0.05f64..1.0,
        window_ms in 200u64..2_000,
        latency_us in 0u64..100_000,
        gaps in prop::collection::vec(prop_oneof![Just(0u64), 0u64..20_000, 0u64..300_000], 1..300),
    ) {
        let hidden = ((limit as f64 * share) as u64).max(1);
        let got = run(limit, hidden as usize, window_ms * 1000, latency_us, &gaps, Some(&SLOW));
        prop_assert!(
            got.refused <= got.bound,
            "the partner refused {} calls; per lowering, the calls in flight then make {}", got.refused, got.bound
        );
        let needed = halvings_needed(limit, hidden);
        prop_assert!(got.lowered <= needed, "lowered {} times; {} halvings fit {} into {}", got.lowered, needed, limit, hidden);
    }
}

/// The scenario of the bench: the policy says 24 per 5 s, the partner 12.
/// A burst of 20 calls finds 8 refused; the rate is halved once, and from
/// then on a call every 100 ms for a minute meets no refusal. Without the
/// lowering (the pause alone), every window after a pause refuses again.
#[test]
fn a_policy_twice_the_partners_limit_is_refused_in_one_burst_only() {
    let mut gaps = vec![0u64; 20];
    gaps.extend(std::iter::repeat_n(100_000, 600));
    let got = run(24, 12, 5_000_000, 20_000, &gaps, Some(&SLOW));
    assert_eq!((got.refused, got.lowered), (8, 1), "{got:?}");
    let paused_only = run(24, 12, 5_000_000, 20_000, &gaps, None);
    assert!(paused_only.refused >= 8 + 6, "the pause alone refuses again in most windows: {paused_only:?}");
}
