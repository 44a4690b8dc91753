//! The RLQS face is exact: several Envoys, each with its own stream to
//! Sluice (`sluice_core::rlqs::Stream`), spend one fixed window's tokens in
//! the shim's model of Redis (`algorithm::lease_call`, the twin of
//! `lua/scripts/lease.lua`), through a model of Envoy's `rate_limit_quota`
//! filter as its source reads: a bucket with no assignment denies
//! (`no_assignment_behavior: deny_all`); a token bucket starts full, or,
//! replacing another, at most full (either way, at random); the same token
//! bucket again keeps its tokens and restarts its time to live; an
//! assignment expires its time to live after it arrived; reports count each
//! interval's admitted and denied requests.
//!
//! Everything travels with a random delay: assignments and reports up to
//! `DELIVERY_MS` (in order on each stream), lease calls run late, their
//! answers come late or never (the call run or not). Over every such run,
//! what each window admits (by the true time of each admission) never
//! exceeds its limit, and what the window holds back beyond what was
//! admitted stays within the stated bound: per Envoy, its live assignment
//! plus half a lease (`1.5 × tokens`), plus the tokens on their way (granted
//! by a call whose answer has not reached Sluice yet, sent to an Envoy that
//! has not applied them yet, or on their way back to the window).

use proptest::prelude::*;
use sluice_core::rlqs::{self, Action, BucketId, LeaseResult, Report, Stream, DELIVERY_MS, TICK_MS};
use sluice_policies::algorithm::{self, RedisTwin};
use sluice_policies::leased::Leased;
use sluice_policies::rlqs::{Governed, Window};
use sluice_policies::units::Millis;
use sluice_policies::wire::{LeaseResponse, WireLimit};

const KEY: &str = "sluice:{quota:}:fw";

/// Envoy's state for one bucket.
#[derive(Debug, Clone, Copy)]
enum Assignment {
    None,
    Tokens { max: u32, level: u64, expires: u64 },
    Blanket { allow: bool, expires: u64 },
}

struct Envoy {
    stream: Stream,
    known: bool,
    assignment: Assignment,
    /// Assignments on their way, by arrival time (in order).
    inbox: Vec<(u64, Vec<Action>)>,
    /// Reports on their way to Sluice (in order).
    outbox: Vec<(u64, Report)>,
    allowed: u64,
    denied: u64,
    next_report: u64,
}

/// A lease call on its way.
struct Call {
    gateway: usize,
    seq: u64,
    run_at: u64,
    /// Lost: never run (`Some(false)`), run but its answer lost (`Some(true)`).
    lost: Option<bool>,
    request: sluice_policies::wire::LeaseRequest,
}

#[derive(Debug, Clone)]
struct Setup {
    gateways: usize,
    limit: u32,
    tokens: u32,
    window_ms: u64,
    /// Per Envoy, a request every this many ms on average.
    every_ms: Vec<u64>,
    report_ms: u64,
    lost_percent: u64,
    ratio: bool,
    /// The limit lowered to this, this long after the start.
    lower: Option<(u64, u32)>,
    seed: u64,
}

fn setup() -> impl Strategy<Value = Setup> {
    let lower = prop::option::weighted(0.3, (0u64..20_000, 0u32..200));
    // Envoy 1.40 reports every 5 s, whatever `reporting_interval` says.
    let report_ms = prop::sample::select(vec![250u64, 500, 1_000, 5_000]);
    (1usize..=3, 20u32..400, 1u32..60, 3u64..=8, report_ms, 0u64..=20, any::<bool>(), lower, any::<u64>())
        .prop_flat_map(|(gateways, limit, tokens, window_s, report_ms, lost_percent, ratio, lower, seed)| {
            prop::collection::vec(1u64..40, gateways).prop_map(move |every_ms| Setup {
                gateways,
                limit,
                tokens: tokens.min(limit),
                window_ms: window_s * 1000,
                every_ms,
                report_ms,
                lost_percent,
                ratio,
                lower: lower.map(|(at, percent)| (at, (limit * (percent % 100) / 100).max(1))),
                seed,
            })
        })
}

fn run(s: &Setup) -> Result<(), TestCaseError> {
    let mut rng = fastrand::Rng::with_seed(s.seed);
    let lease = Leased::new(s.tokens, 2_000).expect("valid lease");
    let window_of = |limit| Window {
        policy: "quota".into(),
        key: String::new(),
        limit: WireLimit::FixedWindow { limit, window_ms: Millis(s.window_ms), cost: 1 },
        lease,
    };
    let id: BucketId = vec![("name".into(), "api".into())];
    let mut store = RedisTwin::default();
    let start = 1_700_000_000_000u64 - 1_700_000_000_000u64 % s.window_ms + 137;
    let mut envoys: Vec<Envoy> = (0..s.gateways)
        .map(|g| Envoy {
            stream: Stream::new(s.seed ^ (g as u64 + 1)),
            known: false,
            assignment: Assignment::None,
            inbox: Vec::new(),
            outbox: Vec::new(),
            allowed: 0,
            denied: 0,
            next_report: start + rng.u64(0..s.report_ms),
        })
        .collect();
    let mut calls: Vec<Call> = Vec::new();
    let mut answers: Vec<(u64, usize, u64, LeaseResult)> = Vec::new();
    // Tokens granted by calls that ran, until their answer reaches the stream.
    let mut granted: std::collections::HashMap<(usize, u64), u64> = Default::default();
    let mut admitted = std::collections::HashMap::<u64, u64>::new();
    let mut worst_held = 0u64;
    // Once lowered, the new limit holds from the first window that starts
    // after the next report and its assignment can have arrived.
    let lowered_at = s.lower.map_or(u64::MAX, |(at, _)| start + at);
    let limit_of = |w: u64| match s.lower {
        Some((_, lower)) if w * s.window_ms >= lowered_at + s.report_ms + 2 * DELIVERY_MS => lower,
        _ => s.limit,
    };
    for now in start..start + 3 * s.window_ms {
        let w = now / s.window_ms;
        let window = window_of(match s.lower {
            Some((_, lower)) if now >= lowered_at => lower,
            _ => s.limit,
        });
        for (g, envoy) in envoys.iter_mut().enumerate() {
            // Assignments arrive.
            while envoy.inbox.first().is_some_and(|(at, _)| *at <= now) {
                let (_, actions) = envoy.inbox.remove(0);
                for action in actions {
                    apply(envoy, action, now, s.ratio && rng.bool());
                }
            }
            if let Assignment::Tokens { expires, .. } | Assignment::Blanket { expires, .. } = envoy.assignment
            {
                if now >= expires {
                    envoy.assignment = Assignment::None;
                }
            }
            // A request.
            if rng.u64(0..s.every_ms[g]) == 0 {
                let admit = match &mut envoy.assignment {
                    Assignment::Tokens { level, .. } if *level >= 1 => {
                        *level -= 1;
                        true
                    }
                    Assignment::Blanket { allow, .. } => *allow,
                    _ => false,
                };
                if admit {
                    envoy.allowed += 1;
                    let n = admitted.entry(w).or_default();
                    *n += 1;
                    prop_assert!(
                        *n <= u64::from(limit_of(w)),
                        "window {} admitted {} over {}",
                        w,
                        n,
                        limit_of(w)
                    );
                } else {
                    envoy.denied += 1;
                }
                if !envoy.known {
                    // A new bucket: reported at once.
                    envoy.known = true;
                    send_report(envoy, &id, now, &mut rng);
                }
            }
            if envoy.known && now >= envoy.next_report {
                send_report(envoy, &id, now, &mut rng);
            }
            if now >= envoy.next_report {
                envoy.next_report = now + s.report_ms;
            }
            // Sluice: reports arrive, ticks.
            while envoy.outbox.first().is_some_and(|(at, _)| *at <= now) {
                let (_, report) = envoy.outbox.remove(0);
                envoy.stream.handle_report(now, &report, Governed::Leased(window.clone()));
            }
            if now % TICK_MS == 0 {
                envoy.stream.tick(now);
            }
        }
        // Lease calls run; answers arrive.
        let mut i = 0;
        while i < calls.len() {
            if calls[i].run_at > now {
                i += 1;
                continue;
            }
            let call = calls.remove(i);
            let back = call.request.give_back.map(|b| (b.window, u64::from(b.tokens)));
            let gateway = call.request.call.map(|c| c.gateway.to_string());
            let seq = call.request.call.map_or(0, |c| c.seq);
            let ran = call.lost != Some(false);
            let WireLimit::FixedWindow { limit, .. } = call.request.limit else { unreachable!("a window") };
            let answer = ran.then(|| {
                algorithm::lease_call(
                    &mut store,
                    now * 1000,
                    KEY,
                    u64::from(limit),
                    s.window_ms * 1000,
                    u64::from(call.request.want),
                    back,
                    gateway.as_deref().map(|g| (g, seq)),
                )
            });
            let result = match (call.lost, answer) {
                (None, Some(grant)) => LeaseResult::Answered(LeaseResponse {
                    granted: u32::try_from(grant.granted).expect("small"),
                    window: grant.window,
                    expires_in_ms: Millis(grant.expires_in_us / 1000),
                    remaining: grant.remaining,
                }),
                _ => LeaseResult::Lost,
            };
            let delay = if result == LeaseResult::Lost { 100 } else { rng.u64(0..30) };
            if let Some(grant) = &answer {
                granted.insert((call.gateway, call.seq), grant.granted);
            }
            answers.push((now + delay, call.gateway, call.seq, result));
        }
        answers.sort_by_key(|a| a.0);
        while answers.first().is_some_and(|a| a.0 <= now) {
            let (_, g, seq, result) = answers.remove(0);
            if matches!(result, LeaseResult::Answered(_)) {
                granted.remove(&(g, seq));
            }
            envoys[g].stream.handle_lease(now, &id, seq, result);
        }
        for (g, envoy) in envoys.iter_mut().enumerate() {
            let actions = envoy.stream.poll_actions();
            if !actions.is_empty() {
                let at = envoy.inbox.last().map_or(0, |(at, _)| *at).max(now + delay(&mut rng));
                envoy.inbox.push((at, actions));
            }
            for call in envoy.stream.poll_calls() {
                let lost = (rng.u64(0..100) < s.lost_percent).then(|| rng.bool());
                calls.push(Call {
                    gateway: g,
                    seq: call.seq,
                    run_at: now + rng.u64(1..30),
                    lost,
                    request: call.request,
                });
            }
        }
        // What the window holds beyond what it admitted.
        if let Some(&algorithm::State::Counter { window: stored, count }) = store.keys.get(KEY) {
            if stored == w {
                let returning: u64 =
                    envoys.iter().filter_map(|e| e.stream.bucket(&id)).map(|b| b.returning()).sum();
                let on_the_way: u64 = granted.values().sum::<u64>()
                    + returning
                    + envoys
                        .iter()
                        .flat_map(|e| &e.inbox)
                        .flat_map(|(_, actions)| actions)
                        .map(|a| match a {
                            Action::Assign { strategy: rlqs::Strategy::TokenBucket { tokens }, .. } => {
                                u64::from(*tokens)
                            }
                            _ => 0,
                        })
                        .sum::<u64>();
                let held = count.saturating_sub(admitted.get(&w).copied().unwrap_or(0));
                if now < lowered_at {
                    worst_held = worst_held.max(held.saturating_sub(on_the_way));
                }
            }
        }
    }
    let bound = s.gateways as u64 * lease.held_at_most();
    prop_assert!(
        worst_held <= bound,
        "the window held back {} beyond what it admitted, over {}",
        worst_held,
        bound
    );
    Ok(())
}

/// A delivery's delay: often the longest allowed, else anything up to it.
fn delay(rng: &mut fastrand::Rng) -> u64 {
    if rng.bool() {
        DELIVERY_MS
    } else {
        rng.u64(0..=DELIVERY_MS)
    }
}

fn send_report(envoy: &mut Envoy, id: &BucketId, now: u64, rng: &mut fastrand::Rng) {
    let report = Report { id: id.clone(), allowed: envoy.allowed, denied: envoy.denied };
    envoy.allowed = 0;
    envoy.denied = 0;
    let at = envoy.outbox.last().map_or(0, |(at, _)| *at).max(now + delay(rng));
    envoy.outbox.push((at, report));
}

/// Envoy applies one action at `now`; `scale`: a replacing token bucket
/// keeps the old one's share of its tokens instead of starting full.
fn apply(envoy: &mut Envoy, action: Action, now: u64, scale: bool) {
    match action {
        Action::Abandon { .. } => {
            envoy.known = false;
            envoy.assignment = Assignment::None;
        }
        Action::Assign { strategy, ttl_s, .. } => {
            let expires = now + ttl_s * 1000;
            envoy.assignment = match (strategy, envoy.assignment) {
                (rlqs::Strategy::TokenBucket { tokens }, Assignment::Tokens { max, level, .. })
                    if max == tokens =>
                {
                    Assignment::Tokens { max, level, expires }
                }
                (rlqs::Strategy::TokenBucket { tokens }, Assignment::Tokens { max, level, .. }) if scale => {
                    let level = u64::from(tokens) * level / u64::from(max);
                    Assignment::Tokens { max: tokens, level, expires }
                }
                (rlqs::Strategy::TokenBucket { tokens }, _) => {
                    Assignment::Tokens { max: tokens, level: u64::from(tokens), expires }
                }
                (rlqs::Strategy::AllowAll, _) => Assignment::Blanket { allow: true, expires },
                (rlqs::Strategy::DenyAll, _) => Assignment::Blanket { allow: false, expires },
            };
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// No window admits more than its limit, whatever the delays, losses
    /// and Envoy's choices.
    #[test]
    fn no_window_admits_more_than_its_limit(s in setup()) {
        run(&s)?;
    }
}
