//! One RLQS stream's buckets, step by step: what Sluice tells Envoy for a
//! bucket, when it takes tokens from the window and when it gives them back.
//! (`rlqs_exact.rs` holds the whole to its bounds over random runs.)

use sluice_core::rlqs::bucket::Held;
use sluice_core::rlqs::{
    Action, BucketId, LeaseCall, LeaseResult, Report, Strategy, Stream, BLANKET_TTL_S, DELIVERY_MS, IDLE_MS,
};
use sluice_policies::leased::Leased;
use sluice_policies::rlqs::{Governed, Window};
use sluice_policies::units::Millis;
use sluice_policies::wire::{LeaseResponse, WireLimit};

const T0: u64 = 1_000_000;

fn id() -> BucketId {
    vec![("name".into(), "api".into())]
}

fn window(limit: u32) -> Window {
    Window {
        policy: "quota".into(),
        key: String::new(),
        limit: WireLimit::FixedWindow { limit, window_ms: Millis(60_000), cost: 1 },
        lease: Leased::new(10, 5_000).expect("valid"),
    }
}

fn leased() -> Governed {
    Governed::Leased(window(100))
}

fn report(stream: &mut Stream, now: u64, allowed: u64, denied: u64, rule: Governed) {
    stream.handle_report(now, &Report { id: id(), allowed, denied }, rule);
}

fn grant(granted: u32, expires_in_ms: u64) -> LeaseResult {
    LeaseResult::Answered(LeaseResponse {
        granted,
        window: 7,
        expires_in_ms: Millis(expires_in_ms),
        remaining: 0,
    })
}

fn assign(strategy: Strategy, ttl_s: u64) -> Action {
    Action::Assign { id: id(), strategy, ttl_s }
}

fn one_call(stream: &mut Stream) -> LeaseCall {
    let mut calls = stream.poll_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    calls.remove(0)
}

/// A new bucket's first report asks for a lease; the grant goes to Envoy as
/// a fresh token bucket (a `deny_all` first, so it starts full) that lives
/// `ttl` at most.
#[test]
fn a_new_bucket_gets_a_fresh_token_bucket_of_its_grant() {
    let mut stream = Stream::new(1);
    report(&mut stream, T0, 0, 1, leased());
    assert_eq!(stream.poll_actions(), [], "nothing before the tokens are charged");
    let call = one_call(&mut stream);
    assert_eq!((call.request.want, call.request.give_back), (10, None));
    assert!(call.request.call.is_some(), "a call id, so a lost answer is charged once");
    stream.handle_lease(T0 + 5, &id(), call.seq, grant(10, 30_000));
    assert_eq!(
        stream.poll_actions(),
        [assign(Strategy::DenyAll, 1), assign(Strategy::TokenBucket { tokens: 10 }, 5)]
    );
}

/// Near the window's end the assignment lives only until the window ends,
/// less the delivery margin, in whole seconds.
#[test]
fn an_assignment_never_outlives_its_window() {
    let mut stream = Stream::new(1);
    report(&mut stream, T0, 0, 1, leased());
    let call = one_call(&mut stream);
    stream.handle_lease(T0 + 5, &id(), call.seq, grant(10, 3_100));
    let actions = stream.poll_actions();
    // 3,100 ms from the ask, less 5 ms gone and the 250 ms margin: 2 whole seconds.
    assert_eq!(actions[1], assign(Strategy::TokenBucket { tokens: 10 }, 2));
    match stream.bucket(&id()).expect("bucket").held() {
        Held::Tokens { spends_until, .. } => assert!(spends_until <= T0 + 3_100, "{spends_until}"),
        other => panic!("{other:?}"),
    }
}

/// Policies that take no tokens: no match and `unlimited` allow all,
/// a missing key denies all; all renewed while the bucket is reported.
#[test]
fn blanket_rules_for_what_takes_no_tokens() {
    for (rule, strategy) in [
        (Governed::Unmatched, Strategy::AllowAll),
        (Governed::Unlimited { policy: "internal".into() }, Strategy::AllowAll),
        (Governed::MissingKey { policy: "per-client".into() }, Strategy::DenyAll),
    ] {
        let mut stream = Stream::new(1);
        report(&mut stream, T0, 1, 0, rule.clone());
        assert_eq!(stream.poll_actions(), [assign(strategy, BLANKET_TTL_S)]);
        assert_eq!(stream.poll_calls(), []);
        report(&mut stream, T0 + 1_000, 1, 0, rule.clone());
        assert_eq!(stream.poll_actions(), [], "not due yet");
        report(&mut stream, T0 + BLANKET_TTL_S * 500, 1, 0, rule);
        assert_eq!(stream.poll_actions(), [assign(strategy, BLANKET_TTL_S)], "renewed at half its life");
    }
}

/// The next lease comes once the reports show the token bucket at half or
/// below (what was sent, less what was reported admitted and given back,
/// bounds what it has left); the old one's leftover goes back once a report
/// settles it.
#[test]
fn top_ups_at_half_and_leftovers_go_back_once_settled() {
    let mut stream = Stream::new(1);
    report(&mut stream, T0, 0, 1, leased());
    let call = one_call(&mut stream);
    stream.handle_lease(T0 + 5, &id(), call.seq, grant(10, 50_000));
    stream.poll_actions();
    report(&mut stream, T0 + 5_000, 2, 30, leased());
    assert_eq!(stream.poll_calls(), [], "8 may be left of 10: above half");
    report(&mut stream, T0 + 10_000, 3, 0, leased());
    let top_up = one_call(&mut stream);
    assert_eq!(top_up.request.want, 10, "at most 5 left of 10: at half or below");
    let replaced_at = T0 + 10_010;
    stream.handle_lease(replaced_at, &id(), top_up.seq, grant(10, 40_000));
    assert_eq!(
        stream.poll_actions(),
        [assign(Strategy::DenyAll, 1), assign(Strategy::TokenBucket { tokens: 10 }, 5)]
    );
    // 5 admitted in all, of 20 sent, the new one's 10 live: the old one left
    // at least 5 unspent, known once a report settles it.
    report(&mut stream, replaced_at + 2 * DELIVERY_MS - 1, 0, 0, leased());
    assert_eq!(stream.poll_calls(), [], "not settled yet");
    report(&mut stream, replaced_at + 2 * DELIVERY_MS, 0, 0, leased());
    let back = one_call(&mut stream);
    assert_eq!(back.request.want, 0);
    assert_eq!(back.request.give_back.map(|b| (b.window, b.tokens)), Some((7, 20 - 10 - 5)));
}

/// The window spent: once the token bucket is empty (all it had reported
/// admitted), `deny_all` until the window's end, and another ask a second later.
#[test]
fn a_spent_window_denies_all_once_the_bucket_is_empty() {
    let mut stream = Stream::new(1);
    report(&mut stream, T0, 0, 1, leased());
    let call = one_call(&mut stream);
    stream.handle_lease(T0 + 5, &id(), call.seq, grant(10, 50_000));
    stream.poll_actions();
    report(&mut stream, T0 + 5_000, 10, 4, leased());
    let top_up = one_call(&mut stream);
    stream.handle_lease(T0 + 5_005, &id(), top_up.seq, grant(0, 45_000));
    assert_eq!(stream.poll_actions(), [assign(Strategy::DenyAll, 5)]);
    stream.tick(T0 + 5_900);
    assert_eq!(stream.poll_calls(), [], "quiet for a second");
    report(&mut stream, T0 + 6_010, 0, 4, leased());
    assert_eq!(one_call(&mut stream).request.want, 10);
}

/// A spent window's `deny_all` is kept until the window ends, with no
/// request and no lease call: expired, the bucket would fall back to
/// `no_assignment_behavior`, which may admit.
#[test]
fn a_spent_window_stays_denied_without_requests() {
    let mut stream = Stream::new(1);
    report(&mut stream, T0, 0, 1, leased());
    let call = one_call(&mut stream);
    stream.handle_lease(T0 + 5, &id(), call.seq, grant(10, 20_000));
    stream.poll_actions();
    report(&mut stream, T0 + 5_000, 10, 4, leased());
    let top_up = one_call(&mut stream);
    stream.handle_lease(T0 + 5_005, &id(), top_up.seq, grant(0, 15_000));
    assert_eq!(stream.poll_actions(), [assign(Strategy::DenyAll, 5)]);
    let (mut renewals, mut now) = (0, T0 + 5_005);
    while now < T0 + 19_950 {
        now += 50;
        stream.tick(now);
        assert_eq!(stream.poll_calls(), [], "no request, no ask");
        for action in stream.poll_actions() {
            assert!(matches!(action, Action::Assign { strategy: Strategy::DenyAll, .. }), "{action:?}");
            renewals += 1;
        }
    }
    assert!(renewals >= 5, "renewed at half its life until the window's end: {renewals}");
    stream.tick(T0 + 20_050);
    assert_eq!(one_call(&mut stream).request.want, 10, "the next window's lease");
}

/// A call whose answer was lost goes again, unchanged, a second later, and
/// an answer to it that still arrives after it was given up is dropped.
#[test]
fn a_lost_answer_sends_the_same_call_again() {
    let mut stream = Stream::new(1);
    report(&mut stream, T0, 0, 1, leased());
    let first = one_call(&mut stream);
    stream.handle_lease(T0 + 100, &id(), first.seq, LeaseResult::Lost);
    stream.tick(T0 + 1_000);
    assert_eq!(stream.poll_calls(), []);
    stream.tick(T0 + 1_100);
    let again = one_call(&mut stream);
    assert_eq!((again.seq, &again.request), (first.seq, &first.request));
    stream.handle_lease(T0 + 1_120, &id(), again.seq, grant(10, 50_000));
    assert_eq!(stream.poll_actions().len(), 2);
    stream.handle_lease(T0 + 1_130, &id(), again.seq, grant(10, 50_000));
    assert_eq!(stream.poll_actions(), [], "answered once");
}

/// A busy bucket's token bucket is sent again, unchanged (Envoy keeps its
/// tokens), before it can expire; an idle one is let expire, then abandoned.
#[test]
fn busy_buckets_live_on_and_idle_ones_are_abandoned() {
    let mut stream = Stream::new(1);
    report(&mut stream, T0, 0, 1, leased());
    let call = one_call(&mut stream);
    stream.handle_lease(T0 + 5, &id(), call.seq, grant(10, 3_600_000));
    stream.poll_actions();
    let mut now = T0 + 5;
    while now < T0 + 5 + 5_000 {
        now += 50;
        stream.tick(now);
        let actions = stream.poll_actions();
        if !actions.is_empty() {
            assert_eq!(actions, [assign(Strategy::TokenBucket { tokens: 10 }, 5)]);
            assert!(now + DELIVERY_MS < T0 + 5 + 5_000, "extended before it can expire");
            break;
        }
    }
    assert!(now < T0 + 5_000, "extended");
    // No request after: it expires, then the bucket is abandoned.
    let mut abandoned = false;
    while now < T0 + IDLE_MS + 60_000 {
        now += 1_000;
        report(&mut stream, now, 0, 0, leased());
        stream.tick(now);
        stream
            .poll_calls()
            .into_iter()
            .for_each(|c| stream.handle_lease(now, &id(), c.seq, grant(0, 1_000_000)));
        if stream.poll_actions().contains(&Action::Abandon { id: id() }) {
            abandoned = true;
            break;
        }
    }
    assert!(abandoned && !stream.knows(&id()));
}

/// A reloaded document that lowers the limit: the live token bucket is
/// replaced at once by `deny_all`, then the bucket asks under the new limit.
#[test]
fn a_changed_policy_replaces_the_live_assignment_at_once() {
    let mut stream = Stream::new(1);
    report(&mut stream, T0, 0, 1, leased());
    let call = one_call(&mut stream);
    stream.handle_lease(T0 + 5, &id(), call.seq, grant(10, 50_000));
    stream.poll_actions();
    let lowered = Governed::Leased(window(5));
    report(&mut stream, T0 + 1_000, 3, 0, lowered);
    assert_eq!(stream.poll_actions(), [assign(Strategy::DenyAll, 1)]);
    let call = one_call(&mut stream);
    assert_eq!(call.request.limit, window(5).limit);
}

/// Regression: after a lowered limit (a reload that keeps the window's
/// counter), the tokens Envoy still held were given back only when the
/// window ended: the new policy's first answer started a new ledger and
/// forgot the old one's tokens, and a give-back beyond the new limit was
/// refused. They go back at the first report that settles the replaced
/// token bucket.
#[test]
fn a_lowered_limit_gives_back_what_envoy_held_at_the_next_report() {
    let mut stream = Stream::new(1);
    report(&mut stream, T0, 0, 1, leased());
    let call = one_call(&mut stream);
    stream.handle_lease(T0 + 5, &id(), call.seq, grant(10, 50_000));
    stream.poll_actions();
    let lowered = Governed::Leased(window(5));
    let reload = T0 + 1_000;
    report(&mut stream, reload, 3, 0, lowered.clone());
    assert_eq!(stream.poll_actions(), [assign(Strategy::DenyAll, 1)]);
    let call = one_call(&mut stream);
    // The window already counts 10, over the new limit of 5: nothing more.
    stream.handle_lease(reload + 5, &id(), call.seq, grant(0, 49_000));
    let settled = reload + 2 * DELIVERY_MS;
    report(&mut stream, settled, 0, 0, lowered);
    let back = one_call(&mut stream);
    assert_eq!(back.request.limit, window(5).limit);
    assert_eq!(back.request.give_back.map(|b| (b.window, b.tokens)), Some((7, 7)), "10 sent, 3 admitted");
    assert_eq!(back.request.want, 0);
    assert_eq!(back.request.validate(), Ok(()), "the shim takes a give-back beyond the lowered limit");
}
