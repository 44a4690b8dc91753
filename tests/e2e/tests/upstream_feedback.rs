//! Upstream feedback end to end: the partner's own "slow down" pauses a
//! key on every gateway. Two Envoys, each with its own shim, share one
//! Redis in front of a strict mock partner (`sluice_harness::partner`) whose
//! hidden limit is stricter than the policy: the operator guessed wrong.
//!
//! What is asserted is exact: the partner's count of its own 429s. Workers
//! each send their next call only after their last answer, so at any moment
//! each has at most one call in flight; the filter holds the partner's
//! answer until the shim has recorded the pause, so every call checked
//! after a worker sees that answer is paused. The partner can therefore
//! refuse at most one call per worker: those in flight when its first
//! "slow down" came back. Without feedback it refuses every call beyond its
//! limit.

use std::time::Duration;

use sluice_harness::egress::{Caller, Run, Workers};
use sluice_harness::partner::{Limits, Log};
use sluice_harness::{Egress, Partner};

const PATH: &str = "/v42/orders";
const WORKERS: usize = 4;

/// The operator's guess: 20 per 3 s per account, refused (no wait) beyond;
/// with `upstream`, the partner's answers pause the account fleet-wide.
fn document(upstream: bool) -> String {
    let upstream = if upstream { r#""upstream": {"max_pause": "10s"},"# } else { "" };
    format!(
        r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "policies": [
            {{"name": "partner-api", "match": {{"path_prefix": "/v42/"}}, "key": ["header:x-account"], {upstream}
              "limits": [{{"type": "sliding_window", "limit": 20, "window": "3s"}}]}}]}}"#
    )
}

fn run(egress: &Egress, account: &str, calls: usize) -> Run {
    let workers = Workers {
        workers: WORKERS,
        calls,
        path: PATH.into(),
        account: account.into(),
        timeout: Duration::from_secs(10),
    };
    workers.run(&egress.ports()).expect("workers")
}

fn report(what: &str, run: &Run, log: &Log) {
    println!(
        "{what}: {} calls, {} served, {} refused by the gateway, {} refused by the partner (partner counted {}), {:?}",
        run.calls.len(),
        run.count(|c| c.served()),
        run.count(|c| c.refused_by_gateway()),
        run.count(|c| c.refused_by_partner()),
        log.refused(),
        run.elapsed
    );
}

/// The partner's hidden limit is 4 per 3 s and it answers 429 with
/// `Retry-After` beyond it. After its first 429 the gateways pause that
/// account until the pause ends: the partner refuses at most one call per
/// client, those in flight when its first 429 came back. A refused call's
/// response, body and all, waits until its pause is recorded. Another
/// account is not affected.
#[test]
fn a_partner_429_pauses_the_key_on_every_gateway() {
    let partner = Partner::start(Limits::default().window(4, Duration::from_secs(3))).expect("partner");
    let egress = Egress::start(&document(true), 2, partner).expect("egress");
    let run = run(&egress, "alice", 40);
    let log = egress.partner.log();
    report("with feedback", &run, &log);
    assert!(
        log.refused() <= WORKERS,
        "the partner refused {} calls, more than the {WORKERS} that can be in flight\n{}",
        log.refused(),
        egress.logs()
    );
    assert!(run.count(|c| c.refused_by_gateway()) > 0, "the gateways never paused the account");
    // bob has his own quota at the partner, and alice's pause is not his.
    let bob = Caller::new(PATH, "bob", Duration::from_secs(10)).expect("client");
    for (gateway, port) in egress.ports().into_iter().enumerate() {
        let call = bob.send(port, gateway, 1_000 + gateway as u64, &[]).expect("call");
        assert!(call.served(), "another account was paused: {call:?}");
    }
}

/// The control: the same traffic without `upstream` meets the partner's
/// 429s on every call beyond its limit.
#[test]
fn without_feedback_the_partner_refuses_every_call_beyond_its_limit() {
    let partner = Partner::start(Limits::default().window(4, Duration::from_secs(3))).expect("partner");
    let egress = Egress::start(&document(false), 2, partner).expect("egress");
    let run = run(&egress, "alice", 40);
    let log = egress.partner.log();
    report("without feedback", &run, &log);
    assert!(log.refused() > WORKERS, "the partner refused only {}", log.refused());
}

/// `X-RateLimit-Remaining: 0` with `X-RateLimit-Reset` on a 200 pauses the
/// account until the reset, before the partner has to refuse: that 200
/// waits until its pause is recorded, so the partner refuses only the
/// calls the other clients had in flight then, at most one each.
#[test]
fn remaining_zero_on_a_200_pauses_until_the_reset() {
    let partner =
        Partner::start_announcing(Limits::default().window(4, Duration::from_secs(3))).expect("partner");
    let egress = Egress::start(&document(true), 2, partner).expect("egress");
    let run = run(&egress, "alice", 40);
    let log = egress.partner.log();
    report("remaining 0 on a 200", &run, &log);
    assert!(
        log.refused() < WORKERS,
        "the partner refused {}, more than the other clients' calls in flight\n{}",
        log.refused(),
        egress.logs()
    );
    assert_eq!(run.count(|c| c.served()), 4, "the partner's 4 per 3 s, and no more");
}

/// The operator's guess with `wait`: 8 per 2 s per account, and the
/// partner's answers pause the account; `adapt` says whether a refusal also
/// lowers the rate.
///
/// A window's held calls share one slot and reach the partner spread over
/// their way through Envoy; the next round is judged against that spread
/// at the partner. The margin must cover it (docs/egress-waiting.md, "the
/// margin"): on a loaded two-core CI host one round's calls arrived up to
/// tens of milliseconds apart, and with a 20 ms margin the next round then
/// met 429s that no rate could prevent. A 200 ms margin keeps these tests
/// about feedback, not about the host's scheduling.
fn waiting_document(adapt: bool) -> String {
    format!(
        r#"{{"shim": {{"timeout_ms": 2000}}, "failure_mode": "deny", "policies": [
            {{"name": "partner-api", "match": {{"path_prefix": "/v42/"}}, "key": ["header:x-account"],
              "upstream": {{"max_pause": "10s", "adapt": {adapt}}}, "wait": {{"timeout": "15s", "margin": "200ms"}},
              "limits": [{{"type": "sliding_window", "limit": 8, "window": "2s"}}]}}]}}"#
    )
}

fn run_waiting(adapt: bool) -> (Run, Log, String) {
    let partner = Partner::start(Limits::default().window(4, Duration::from_secs(2))).expect("partner");
    let egress = Egress::start(&waiting_document(adapt), 2, partner).expect("egress");
    let workers = Workers {
        workers: WORKERS,
        calls: 20,
        path: PATH.into(),
        account: "alice".into(),
        timeout: Duration::from_secs(30),
    };
    let run = workers.run(&egress.ports()).expect("workers");
    let log = egress.partner.log();
    (run, log, egress.logs())
}

/// A pause is not a rate: the partner's hidden limit is half the policy's,
/// and requests wait through several of its windows. The first refusal
/// halves the account's rate on both gateways, so after the calls in flight
/// then, the partner refuses nothing more: at most one per worker in all.
#[test]
fn a_refusal_lowers_the_rate_and_the_partner_refuses_no_more() {
    let (run, log, logs) = run_waiting(true);
    report("waiting, rate lowered", &run, &log);
    assert!(log.refused() <= WORKERS, "the partner refused {} calls\n{logs}", log.refused());
    assert!(log.refused() > 0, "the partner never refused: the test shows nothing");
    assert_eq!(run.count(|c| c.served()) + log.refused(), 20, "every call was sent once\n{logs}");
}

/// The control: with the pause alone, each window after a pause lets the
/// policy's own 8 through again, and the partner refuses beyond its 4.
#[test]
fn with_the_pause_alone_the_partner_refuses_again_after_each_pause() {
    let (run, log, _) = run_waiting(false);
    report("waiting, pause alone", &run, &log);
    assert!(log.refused() > WORKERS, "the partner refused only {}", log.refused());
}
