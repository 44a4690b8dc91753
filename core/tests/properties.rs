//! Rules of the flow stated over random event orders: whatever way a
//! stream goes (an answer of any kind, a response that ends early or late,
//! a release answered or not, a reset at any point), each lease the shim
//! may hold is released, and released again only when its first release
//! was cut off with the stream; and a request let through never carries a
//! refusal.

mod support;

use proptest::prelude::*;
use sluice_core::{Effect, Outgoing, Phase};
use sluice_policies::wire::{CHECK_PATH, RELEASE_PATH};
use support::*;

#[derive(Debug, Clone, Copy)]
enum Answer {
    Lease,
    Deny,
    TimedOut,
    NotSent,
    Reset,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Headers { end: bool },
    Body { end: bool },
    Trailers,
    ReleaseAnswer { ok: bool },
    End,
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        3 => Just(Answer::Lease),
        1 => Just(Answer::Deny),
        1 => Just(Answer::TimedOut),
        1 => Just(Answer::NotSent),
        1 => Just(Answer::Reset),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        any::<bool>().prop_map(|end| Op::Headers { end }),
        any::<bool>().prop_map(|end| Op::Body { end }),
        Just(Op::Trailers),
        any::<bool>().prop_map(|ok| Op::ReleaseAnswer { ok }),
        Just(Op::End),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn each_lease_is_released_and_never_twice_unless_cut_off(answer in answer(), ops in prop::collection::vec(op(), 0..8)) {
        let t = Test::new(CONCURRENCY);
        let mut s = t.stream();
        let mut all: Vec<Effect> = Vec::new();
        let fx = s.request(&get("/"));
        let check = sent(&fx, CHECK_PATH);
        all.extend(fx);
        let fx = match answer {
            Answer::Lease => s.answer(&check, &Shim::allow_lease(&check, "L")),
            Answer::Deny => s.answer(&check, &Shim::deny_check(0, 1, 500)),
            Answer::TimedOut => s.answer(&check, &Shim::timed_out()),
            Answer::NotSent => s.answer(&check, &Shim::not_sent()),
            Answer::Reset => Vec::new(),
        };
        all.extend(fx);
        let mut in_flight: Vec<Outgoing> = Vec::new();
        let mut cut_off = None;
        let mut ended = false;
        for op in ops {
            let fx = match op {
                Op::Headers { end } => s.response(&[(":status", "200")], end),
                Op::Body { end } => s.body(10, end),
                Op::Trailers => {
                    let fx = s.flow.handle_response_trailers(&t.host.now());
                    s.performed(fx)
                }
                Op::ReleaseAnswer { ok } => match in_flight.pop() {
                    Some(release) if !ended => {
                        let result = if ok { Shim::released(1) } else { Shim::status(503) };
                        s.answer(&release, &result)
                    }
                    _ => Vec::new(),
                },
                Op::End => {
                    ended = true;
                    cut_off.get_or_insert(!in_flight.is_empty());
                    s.end()
                }
            };
            in_flight.extend(sends(&fx).into_iter().filter(|c| c.path == RELEASE_PATH));
            all.extend(fx);
        }
        cut_off.get_or_insert(!in_flight.is_empty());
        all.extend(s.end());
        let mut releases: Vec<Outgoing> = sends(&all).into_iter().filter(|c| c.path == RELEASE_PATH).collect();
        releases.extend(t.worker_sends(RELEASE_PATH));
        let named = |lease: &str| releases.iter().filter(|r| r.lease() == lease).count();
        match answer {
            Answer::Lease => {
                let n = named("L");
                // Once, or twice when the stream's release was in flight
                // as the stream ended (the host cancels it with the stream).
                let expected = if cut_off == Some(true) { 2 } else { 1 };
                prop_assert_eq!(n, expected, "lease L released {} times: {:?}", n, all);
            }
            // A readable refusal: the shim holds nothing.
            Answer::Deny | Answer::NotSent => prop_assert_eq!(releases.len(), 0),
            // No answer said whether the shim took a lease: released by the check's id, once.
            Answer::TimedOut | Answer::Reset => prop_assert_eq!(named(&check.id()), 1, "{:?}", releases),
        }
    }

    #[test]
    fn a_request_let_through_never_carries_a_refusal(answer in answer(), ops in prop::collection::vec(op(), 0..6)) {
        let t = Test::new(
            r#"{"headers": "always", "policies": [{"name": "c", "limits": [{"type": "fixed_window", "limit": 3, "window": "1s"}, {"type": "concurrency", "limit": 2, "lease": "30s"}]}]}"#,
        );
        let mut s = t.stream();
        let mut all = s.request(&get("/"));
        let check = sent(&all, CHECK_PATH);
        let held = s.hold_request();
        all.extend(match answer {
            Answer::Lease => s.answer(&check, &Shim::allow_lease(&check, "L")),
            Answer::Deny => s.answer(&check, &Shim::deny_check(0, 1, 500)),
            Answer::TimedOut => s.answer(&check, &Shim::timed_out()),
            Answer::NotSent => s.answer(&check, &Shim::not_sent()),
            Answer::Reset => Vec::new(),
        });
        let through = matches!(s.phase(), Phase::Admitted | Phase::Failed);
        for op in ops {
            all.extend(match op {
                Op::Headers { end } => s.response(&[(":status", "200")], end),
                Op::Body { end } => s.body(10, end),
                Op::Trailers => {
                    let fx = s.flow.handle_response_trailers(&t.host.now());
                    s.performed(fx)
                }
                Op::ReleaseAnswer { .. } => Vec::new(),
                Op::End => s.end(),
            });
        }
        let replied = all.iter().any(|e| matches!(e, Effect::Reply(_)));
        let resumed = all.iter().any(|e| matches!(e, Effect::ResumeRequest));
        let refusal_header = all.iter().any(|e| matches!(e, Effect::AddResponseHeader { name: "retry-after", .. }));
        prop_assert!(!refusal_header);
        if through {
            prop_assert!(!replied, "a request let through was also answered locally");
            prop_assert_eq!(resumed, held, "let through: resumed exactly when it was held");
        } else {
            prop_assert!(!resumed, "a request not let through was resumed");
        }
    }
}
