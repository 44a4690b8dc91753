//! Failure-mode passes reach the shim: a request `failure_mode: allow` let
//! through was never decided by the shim, so the worker reports it on its
//! tick (`POST /v1/report`) for the shim's dashboard. Driven natively with
//! a fake host and a fake clock; a test plays the shim.

mod support;

use serde_json::json;
use sluice_core::Phase;
use sluice_policies::wire::{CHECK_PATH, REPORT_PATH};
use support::*;

const TWO: &str = r#"{"policies": [
    {"name": "a", "limits": [{"type": "interval", "every": "1s"}]},
    {"name": "b", "match": {"path_prefix": "/b/"}, "limits": [{"type": "interval", "every": "1s"}]}]}"#;

/// One request through `t`, answered by `answer`; its phase.
fn request(t: &Test, path: &str, answer: fn(&sluice_core::Outgoing) -> sluice_core::CallResult) -> Phase {
    let mut s = t.stream();
    let check = sent(&s.request(&get(path)), CHECK_PATH);
    s.hold_request();
    s.answer(&check, &answer(&check));
    s.phase()
}

/// A failure pass is reported once, on the first tick after the shim
/// answers again, for every policy that applied to the request; later ticks
/// send nothing until there is more.
#[test]
fn a_failure_pass_is_reported_once_the_shim_answers_again() {
    let t = Test::new(TWO);
    assert!(t.worker_sends(REPORT_PATH).is_empty(), "nothing to report yet");
    assert_eq!(request(&t, "/b/x", |_| Shim::timed_out()), Phase::Failed);
    assert_eq!(request(&t, "/", |_| Shim::status(503)), Phase::Failed);
    assert!(t.worker_sends(REPORT_PATH).is_empty(), "no report to a shim that is failing");
    assert_eq!(request(&t, "/other", Shim::allow), Phase::Admitted);
    let reports = t.worker_sends(REPORT_PATH);
    assert_eq!(reports.len(), 1);
    assert_eq!(
        reports[0].json(),
        json!({"passes": [{"policy": "a", "count": 2}, {"policy": "b", "count": 1}]})
    );
    assert!(t.worker_sends(REPORT_PATH).is_empty(), "reported once");
    t.host.advance(5_000);
    assert!(t.worker_sends(REPORT_PATH).is_empty(), "nothing new");
}

/// At most one report a second per worker: passes within the second wait
/// for the next report, and none is lost.
#[test]
fn reports_go_at_most_once_a_second() {
    let t = Test::new(TWO);
    request(&t, "/", |_| Shim::timed_out());
    request(&t, "/", Shim::allow);
    assert_eq!(t.worker_sends(REPORT_PATH).len(), 1);
    request(&t, "/", |_| Shim::timed_out());
    request(&t, "/", Shim::allow);
    t.host.advance(400);
    assert!(t.worker_sends(REPORT_PATH).is_empty(), "within a second of the last report");
    t.host.advance(600);
    let reports = t.worker_sends(REPORT_PATH);
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].json(), json!({"passes": [{"policy": "a", "count": 1}]}));
}

/// A report the host cannot send is dropped: its passes are not sent again
/// (Envoy's `failure_allowed` stat still has them), and nothing else fails.
#[test]
fn a_report_that_cannot_be_sent_is_dropped() {
    let t = Test::new(TWO);
    request(&t, "/", |_| Shim::timed_out());
    request(&t, "/", Shim::allow);
    let reports = t.worker_sends(REPORT_PATH);
    assert_eq!(reports.len(), 1);
    let fx = t.worker.handle_answer(&t.host.now(), reports[0].id, Shim::not_sent(), &t.host);
    assert!(fx.is_empty(), "{fx:?}");
    t.host.advance(2_000);
    assert!(t.worker_sends(REPORT_PATH).is_empty(), "dropped, not retried");
}

/// Admissions, denials and `failure_mode: deny` refusals are never
/// reported: the shim saw the first two, and the last let nothing through.
#[test]
fn only_failure_passes_are_reported() {
    let t = Test::new(TWO);
    assert_eq!(request(&t, "/", Shim::allow), Phase::Admitted);
    assert_eq!(request(&t, "/", |_| Shim::deny_check(0, 1, 700)), Phase::Refused);
    let deny = Test::new(&TWO.replacen('{', r#"{"failure_mode": "deny", "#, 1));
    assert_eq!(request(&deny, "/", |_| Shim::timed_out()), Phase::Refused);
    t.host.advance(2_000);
    assert!(t.worker_sends(REPORT_PATH).is_empty());
    assert!(deny.worker_sends(REPORT_PATH).is_empty());
}

/// While the shim fails, and the outage breaker is open, no report goes to
/// it: reports would only add calls to a failing shim. The passes keep, and
/// the first report after a probe closes the breaker carries them all.
#[test]
fn no_report_while_the_shim_fails() {
    let t = Test::new(
        r#"{"shim": {"failure_threshold": 2, "cooldown_ms": 10000},
            "policies": [{"name": "a", "limits": [{"type": "interval", "every": "1s"}]}]}"#,
    );
    for _ in 0..2 {
        request(&t, "/", |_| Shim::timed_out());
    }
    // Open: this one is decided without a call.
    let mut s = t.stream();
    assert!(sends(&s.request(&get("/"))).is_empty(), "the breaker is open");
    assert_eq!(s.phase(), Phase::Failed);
    t.host.advance(2_000);
    assert!(t.worker_sends(REPORT_PATH).is_empty(), "no report to a shim the breaker holds off");
    t.host.advance(8_000);
    // The cooldown is over: a probe that the shim answers closes the breaker.
    assert_eq!(request(&t, "/", Shim::allow), Phase::Admitted);
    let reports = t.worker_sends(REPORT_PATH);
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].json(), json!({"passes": [{"policy": "a", "count": 3}]}));
}

/// A denial answered from the over-limit cache never reaches the shim, so
/// the worker reports it beside the passes (`cache_denied`): the shim's
/// dashboard counts every denial, and says where it was answered.
#[test]
fn denials_from_the_over_limit_cache_are_reported() {
    let t = Test::new(
        r#"{"policies": [{"name": "a", "limits": [{"type": "fixed_window", "limit": 1, "window": "1h"}]}]}"#,
    );
    let mut s = t.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.answer(&check, &Shim::deny_check(0, 1, 3_600_000));
    for _ in 0..3 {
        let mut s = t.stream();
        assert!(
            s.request(&get("/")).iter().all(|e| !matches!(e, sluice_core::Effect::Send(_))),
            "from the cache"
        );
    }
    let reports = t.worker_sends(REPORT_PATH);
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].json(), json!({"passes": [], "cache_denied": [{"policy": "a", "count": 3}]}));
    assert!(t.worker_sends(REPORT_PATH).is_empty(), "reported once");
}
