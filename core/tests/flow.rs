//! The request flow, driven natively with a fake host and a fake clock:
//! every mode the filter has, event by event, with no Envoy, Redis or
//! wasmtime. A test plays the shim by answering the flow's calls.

mod support;

use sluice_core::effect::CallResult;
use sluice_core::stats::{ClassStat, PolicyStat};
use sluice_core::{Effect, Phase};
use sluice_policies::wire::{ADJUST_PATH, CHECK_PATH, FEEDBACK_PATH, LEASE_PATH, RELEASE_PATH};
use support::*;

/// A request two policies apply to is refused when either denies: the
/// denial names the denying policy, and nothing is resumed.
#[test]
fn deny_wins_across_policies() {
    let t = Test::new(
        r#"{"policies": [
            {"name": "a", "limits": [{"type": "fixed_window", "limit": 5, "window": "1s"}]},
            {"name": "b", "limits": [{"type": "fixed_window", "limit": 1, "window": "1s"}]}]}"#,
    );
    let mut s = t.stream();
    let fx = s.request(&get("/"));
    let check = sent(&fx, CHECK_PATH);
    assert_eq!(check.checks().len(), 2);
    assert!(s.hold_request());
    let fx = s.answer(&check, &Shim::deny_check(1, 2, 700));
    let reply = replied(&fx).expect("a local reply");
    assert_eq!(reply.status, 429);
    assert!(String::from_utf8_lossy(&reply.body).contains("\"policy\":\"b\""));
    assert!(reply.headers.iter().any(|(n, v)| n == "retry-after" && v == "1"));
    assert!(!fx.contains(&Effect::ResumeRequest));
    assert_eq!(s.phase(), Phase::Refused);
    assert_eq!(count(&fx, 1, PolicyStat::Denied), 1);
    assert_eq!(count(&fx, 0, PolicyStat::Denied), 0);
}

/// An admitted request is resumed, with the RateLimit headers of its most
/// restrictive limit on the response.
#[test]
fn an_admission_resumes_the_request_and_adds_headers() {
    let t = Test::new(
        r#"{"headers": "always", "policies": [
            {"name": "a", "limits": [{"type": "fixed_window", "limit": 5, "window": "1s"}]}]}"#,
    );
    let mut s = t.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    assert!(s.hold_request());
    let fx = s.answer(&check, &Shim::allow(&check));
    assert!(fx.contains(&Effect::ResumeRequest));
    assert_eq!(s.phase(), Phase::Admitted);
    assert_eq!(count(&fx, 0, PolicyStat::Allowed), 1);
    let fx = s.response(&[(":status", "200")], true);
    assert!(added(&fx, "ratelimit").is_some(), "{fx:?}");
    assert!(added(&fx, "ratelimit-policy").is_some());
    assert!(!s.hold_response());
    assert_eq!(s.phase(), Phase::Done);
}

/// A concurrency lease is released when the response ends, from the
/// stream, and the response's end is held until the shim answers; the
/// stream's end then sends nothing more.
#[test]
fn a_lease_is_released_once_at_the_response_end() {
    let t = Test::new(CONCURRENCY);
    let mut s = t.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    s.answer(&check, &Shim::allow_lease(&check, "L1"));
    let fx = s.response(&[(":status", "200")], true);
    let release = sent(&fx, RELEASE_PATH);
    assert_eq!(release.lease(), "L1");
    assert!(s.hold_response());
    assert_eq!(s.phase(), Phase::Settling);
    let fx = s.answer(&release, &Shim::released(1));
    assert!(fx.contains(&Effect::ResumeResponse));
    assert_eq!(count(&fx, 0, PolicyStat::Released), 1);
    assert_eq!(s.phase(), Phase::Done);
    s.end();
    assert!(t.worker_sends(RELEASE_PATH).is_empty(), "released twice");
}

/// A stream reset after its admission, before the response: the lease is
/// released once, by the worker, on its next tick.
#[test]
fn a_reset_releases_the_lease_through_the_worker() {
    let t = Test::new(CONCURRENCY);
    let mut s = t.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    s.answer(&check, &Shim::allow_lease(&check, "L1"));
    s.end();
    s.end();
    let releases = t.worker_sends(RELEASE_PATH);
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].lease(), "L1");
}

/// A check that timed out may have taken a lease the filter never saw: it
/// is released by the check's id when the stream ends, once.
#[test]
fn a_timed_out_check_releases_by_its_id() {
    let t = Test::new(CONCURRENCY);
    let mut s = t.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    let fx = s.answer(&check, &Shim::timed_out());
    assert!(fx.contains(&Effect::ResumeRequest), "failure_mode allow");
    assert_eq!(s.phase(), Phase::Failed);
    assert_eq!(count(&fx, 0, PolicyStat::FailureAllowed), 1);
    s.response(&[(":status", "200")], true);
    s.end();
    let releases = t.worker_sends(RELEASE_PATH);
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].lease(), check.id());
}

/// Both failure modes: `allow` lets the request through without a
/// decision (`Failed`, counted as `failure_allowed`); `deny` refuses it
/// with the policy's status.
#[test]
fn both_failure_modes() {
    let allow =
        Test::new(r#"{"policies": [{"name": "a", "limits": [{"type": "interval", "every": "1s"}]}]}"#);
    let mut s = allow.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    let fx = s.answer(&check, &Shim::status(503));
    assert_eq!(s.phase(), Phase::Failed);
    assert!(fx.contains(&Effect::ResumeRequest));
    assert_eq!(count(&fx, 0, PolicyStat::FailureAllowed), 1);

    let deny = Test::new(
        r#"{"failure_mode": "deny", "policies": [{"name": "a", "limits": [{"type": "interval", "every": "1s"}]}]}"#,
    );
    let mut s = deny.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    let fx = s.answer(&check, &Shim::not_sent());
    assert_eq!(replied(&fx).map(|r| r.status), Some(503));
    assert_eq!(s.phase(), Phase::Refused);
    assert_eq!(count(&fx, 0, PolicyStat::FailureDenied), 1);
}

/// A call the host cannot send decides the request in the same callback:
/// it is not held, and nothing resumes it later.
#[test]
fn a_call_that_cannot_be_sent_decides_at_once() {
    let t = Test::new(r#"{"policies": [{"name": "a", "limits": [{"type": "interval", "every": "1s"}]}]}"#);
    let mut s = t.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    let fx = s.answer(&check, &Shim::not_sent());
    assert!(!fx.contains(&Effect::ResumeRequest));
    assert!(!s.hold_request());
    assert_eq!(s.phase(), Phase::Failed);
}

/// After enough failures the breaker opens: the next request is decided by
/// `failure_mode` without a call, until the cooldown ends.
#[test]
fn an_open_breaker_decides_without_a_call() {
    let t = Test::new(
        r#"{"shim": {"failure_threshold": 2, "cooldown_ms": 1000}, "policies": [{"name": "a", "limits": [{"type": "interval", "every": "1s"}]}]}"#,
    );
    for _ in 0..2 {
        let mut s = t.stream();
        let check = sent(&s.request(&get("/")), CHECK_PATH);
        s.answer(&check, &Shim::timed_out());
    }
    let mut s = t.stream();
    let fx = s.request(&get("/"));
    assert!(sends(&fx).is_empty(), "no call while open: {fx:?}");
    assert_eq!(s.phase(), Phase::Failed);
    t.host.advance(1001);
    let mut s = t.stream();
    assert_eq!(sends(&s.request(&get("/"))).len(), 1, "a probe after the cooldown");
}

/// A fixed window of 1 per `window`, its first request denied by the shim
/// with `wait_ms` to wait: the over-limit cache holds the denial.
fn denied_once(window: &str, wait_ms: u64) -> Test {
    let t = Test::new(&format!(
        r#"{{"policies": [{{"name": "a", "limits": [{{"type": "fixed_window", "limit": 1, "window": "{window}"}}]}}]}}"#
    ));
    let mut s = t.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.answer(&check, &Shim::deny_check(0, 1, wait_ms));
    t
}

/// The over-limit cache: a denial with a known wait is remembered in shared
/// data, and the same check is refused locally, with no call, until then.
#[test]
fn the_over_limit_cache_refuses_locally_until_the_wait_ends() {
    let t = denied_once("1s", 800);
    let mut s = t.stream();
    let fx = s.request(&get("/"));
    assert!(sends(&fx).is_empty());
    assert_eq!(replied(&fx).map(|r| r.status), Some(429));
    assert_eq!(count(&fx, 0, PolicyStat::CacheDenied), 1);
    t.host.advance(800);
    let mut s = t.stream();
    assert_eq!(sends(&s.request(&get("/"))).len(), 1, "asked again once the wait is over");
}

/// A denial from the over-limit cache is the worker's last one while what
/// it shows is the same, and a new one when the wait shown changes: the
/// headers never show a stale wait.
#[test]
fn a_cached_denial_shows_the_wait_left() {
    let t = denied_once("10s", 2500);
    let denial = |t: &Test| {
        let fx = t.stream().request(&get("/"));
        assert!(sends(&fx).is_empty(), "refused from the cache: {fx:?}");
        let reply = replied(&fx).expect("a denial");
        let header = |name: &str| reply.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        (header("retry-after"), header("ratelimit"))
    };
    let first = denial(&t);
    assert_eq!(first.0.as_deref(), Some("3"));
    t.host.advance(400);
    assert_eq!(denial(&t), first, "2.1 s left shows as 3 s, as before");
    t.host.advance(200);
    let later = denial(&t);
    assert_eq!(later.0.as_deref(), Some("2"), "1.9 s left");
    assert_ne!(later.1, first.1, "RateLimit's t follows");
}

/// Egress waiting: the check asks the shim to hold the request, its timeout
/// grows by the wait, and an admission after a hold says so in
/// `server-timing`.
#[test]
fn waiting_holds_and_reports_the_wait() {
    let t = Test::new(WAIT);
    let mut s = t.stream();
    let fx = s.request(&get("/"));
    let check = sent(&fx, CHECK_PATH);
    assert_eq!(check.wait_ms(), Some(5000));
    assert!(check.timeout_ms >= 5000);
    assert_eq!(s.phase(), Phase::Waiting);
    s.hold_request();
    let fx = s.answer(&check, &Shim::allow_after(&check, 250));
    assert_eq!(count(&fx, 0, PolicyStat::Waited), 1);
    let fx = s.response(&[(":status", "200"), ("server-timing", "db;dur=3")], true);
    assert!(fx.contains(&Effect::SetResponseHeader {
        name: "server-timing",
        value: "db;dur=3, sluice;dur=250".into()
    }));
}

/// A waiting request whose stream ends while it is held: counted as
/// cancelled, and its reservation is released by its id.
#[test]
fn a_cancelled_wait_releases_its_reservation() {
    let t = Test::new(WAIT);
    let mut s = t.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    let fx = s.end();
    assert_eq!(count(&fx, 0, PolicyStat::WaitCancelled), 1);
    let releases = t.worker_sends(RELEASE_PATH);
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].lease(), check.id());
}

/// Shadow policies go in their own call: a shadow denial neither refuses
/// the request nor keeps the enforced one from being charged; the client
/// sees `x-sluice-shadow`.
#[test]
fn a_shadow_denial_only_tells() {
    let t = Test::new(
        r#"{"shadow_header": true, "policies": [
            {"name": "real", "limits": [{"type": "interval", "every": "1s"}]},
            {"name": "trial", "shadow": true, "limits": [{"type": "interval", "every": "1s"}]}]}"#,
    );
    let mut s = t.stream();
    let fx = s.request(&get("/"));
    let calls = sends(&fx);
    assert_eq!(calls.len(), 2, "the enforced and the shadow call");
    s.hold_request();
    s.answer(&calls[1], &Shim::deny_check(0, 1, 900));
    let fx = s.answer(&calls[0], &Shim::allow(&calls[0]));
    assert!(fx.contains(&Effect::ResumeRequest));
    assert_eq!(count(&fx, 1, PolicyStat::ShadowDenied), 1);
    let fx = s.response(&[(":status", "200")], true);
    assert_eq!(added(&fx, "x-sluice-shadow").as_deref(), Some("would-deny; policy=\"trial\""));
}

/// Upstream feedback: a partner's 429 with `Retry-After` pauses the key;
/// the pause goes to the shim from the stream, and the response waits for
/// it, body and all: its first chunk may reach the filter before the shim
/// has recorded the pause, and a body let go would take the held headers
/// with it (a proxy's filter chain resumes a response whose body
/// continues), so the client could call again, and be checked, before the
/// pause exists.
#[test]
fn an_upstream_refusal_is_reported_and_holds_the_response_through_its_body() {
    let t = Test::new(
        r#"{"policies": [{"name": "partner", "upstream": {}, "limits": [{"type": "fixed_window", "limit": 10, "window": "1s"}]}]}"#,
    );
    let mut s = t.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    s.answer(&check, &Shim::allow(&check));
    let fx = s.response(&[(":status", "429"), ("retry-after", "2")], false);
    let report = sent(&fx, FEEDBACK_PATH);
    assert_eq!(count(&fx, 0, PolicyStat::UpstreamThrottled), 1);
    assert!(s.hold_response());
    s.body(120, false);
    assert!(s.hold_response(), "a body chunk let the 429 go before its pause was recorded");
    s.body(0, true);
    assert!(s.hold_response(), "the body's end let the 429 go before its pause was recorded");
    let fx = s.answer(&report, &Shim::status(200));
    assert!(fx.contains(&Effect::ResumeResponse));
    assert!(!s.hold_response());
}

/// Points: the estimate is charged at the check, and the response's
/// actual-cost header corrects it through the worker.
#[test]
fn points_are_corrected_from_the_response() {
    let t = Test::new(
        r#"{"policies": [{"name": "p", "limits": [{"type": "points", "capacity": 100, "refill": "1s", "cost": 10, "actual_cost_header": "x-cost"}]}]}"#,
    );
    let mut s = t.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    s.answer(&check, &Shim::allow_points(5_000_000));
    s.response(&[(":status", "200"), ("x-cost", "3")], true);
    let adjust = t.worker_sends(ADJUST_PATH);
    assert_eq!(adjust.len(), 1);
    let body = adjust[0].json();
    assert_eq!(body["adjustments"][0]["actual"], 3);
    assert_eq!(body["adjustments"][0]["held_until_us"], 5_000_000);
}

/// Load shedding: once the fleet's level sheds a class, its requests are
/// refused with 503 and no shim call.
#[test]
fn shedding_refuses_without_a_call() {
    let t = Test::new(SHED);
    t.shed_level(0, 1.0);
    let mut s = t.stream();
    let fx = s.request(&get("/").header("x-class", "batch"));
    assert!(sends(&fx).is_empty());
    assert_eq!(replied(&fx).map(|r| r.status), Some(503));
    assert_eq!(count(&fx, 0, PolicyStat::Shed), 1);
    assert!(fx.contains(&Effect::Class { class: 1, stat: ClassStat::Shed, n: 1 }));
}

/// Leased mode: with tokens in the pool a request is admitted without a
/// call; an empty pool falls back to the exact check; a refusal puts the
/// token back.
#[test]
fn leased_spending() {
    let t = Test::new(
        r#"{"policies": [{"name": "l", "leased": {"tokens": 10, "ttl": "2s"}, "limits": [{"type": "fixed_window", "limit": 100, "window": "1m"}]}]}"#,
    );
    let mut s = t.stream();
    let fx = s.request(&get("/"));
    assert_eq!(sends(&fx).len(), 1, "no lease yet: the exact check");
    assert_eq!(count(&fx, 0, PolicyStat::LeaseEmpty), 1);
    t.grant_lease(0, 2);
    for _ in 0..2 {
        let mut s = t.stream();
        let fx = s.request(&get("/"));
        assert!(sends(&fx).is_empty(), "admitted from the lease: {fx:?}");
        assert_eq!(count(&fx, 0, PolicyStat::Leased), 1);
        assert!(!s.hold_request());
    }
    let mut s = t.stream();
    assert_eq!(sends(&s.request(&get("/"))).len(), 1, "spent: the exact check again");
}

/// A request no policy matches costs nothing and needs nothing later.
#[test]
fn a_request_no_policy_matches_passes() {
    let t = Test::new(
        r#"{"policies": [{"name": "a", "match": {"path_prefix": "/api"}, "limits": [{"type": "interval", "every": "1s"}]}]}"#,
    );
    let mut s = t.stream();
    assert!(s.request(&get("/other")).is_empty());
    assert!(!s.hold_request());
    assert_eq!(s.phase(), Phase::Done);
}

/// A key a policy needs but the request lacks: 400, never a pass.
#[test]
fn a_missing_key_is_refused() {
    let t = Test::new(
        r#"{"policies": [{"name": "a", "key": ["header:x-api-key"], "on_missing_key": "deny", "limits": [{"type": "interval", "every": "1s"}]}]}"#,
    );
    let mut s = t.stream();
    let fx = s.request(&get("/"));
    assert_eq!(replied(&fx).map(|r| r.status), Some(400));
    assert!(s.hold_request());
}

/// With `verdict_header`, a request `failure_mode` let through says so in
/// `x-sluice-verdict: failure_allowed`, never `allowed`: a 200 the limiter
/// did not decide can be told from an admission (the first demo's bug was
/// a table that counted such passes as allowed). Refusals say which kind.
#[test]
fn the_verdict_header_tells_a_failure_pass_from_an_admission() {
    let doc = |mode: &str| {
        format!(
            r#"{{"verdict_header": true, "failure_mode": "{mode}", "policies": [
                {{"name": "a", "limits": [{{"type": "fixed_window", "limit": 1, "window": "1s"}}]}}]}}"#
        )
    };
    let allow = Test::new(&doc("allow"));
    let verdict = |fx: &[Effect]| added(fx, "x-sluice-verdict");

    let mut s = allow.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    s.answer(&check, &Shim::allow(&check));
    assert_eq!(verdict(&s.response(&[(":status", "200")], true)).as_deref(), Some("allowed"));

    let mut s = allow.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    s.answer(&check, &Shim::timed_out());
    assert_eq!(s.phase(), Phase::Failed);
    assert_eq!(verdict(&s.response(&[(":status", "200")], true)).as_deref(), Some("failure_allowed"));

    let mut s = allow.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    let fx = s.answer(&check, &Shim::deny_check(0, 1, 700));
    let header = |fx: &[Effect]| {
        replied(fx).and_then(|r| r.headers.into_iter().find(|(n, _)| n == "x-sluice-verdict")).map(|(_, v)| v)
    };
    assert_eq!(header(&fx).as_deref(), Some("denied"));

    let deny = Test::new(&doc("deny"));
    let mut s = deny.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    assert_eq!(header(&s.answer(&check, &Shim::not_sent())).as_deref(), Some("failure_denied"));

    // Off by default: no header at all.
    let plain =
        Test::new(r#"{"policies": [{"name": "a", "limits": [{"type": "interval", "every": "1s"}]}]}"#);
    let mut s = plain.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.hold_request();
    s.answer(&check, &Shim::timed_out());
    assert_eq!(verdict(&s.response(&[(":status", "200")], true)), None);
}

/// Leased mode with `headers: always`: a request admitted from the lease
/// carries `RateLimit` headers computed from it, with no shim call: the
/// tokens the gateway still holds plus what the window had left at the last
/// grant, and the time to the window's end.
#[test]
fn leased_admissions_carry_ratelimit_headers() {
    let t = Test::new(
        r#"{"headers": "always", "policies": [{"name": "l", "leased": {"tokens": 10, "ttl": "2s"}, "limits": [{"type": "fixed_window", "limit": 100, "window": "1m"}]}]}"#,
    );
    let mut s = t.stream();
    s.request(&get("/"));
    t.grant_lease(0, 2);
    for remaining in [91, 90] {
        let mut s = t.stream();
        let fx = s.request(&get("/"));
        assert!(sends(&fx).is_empty(), "admitted from the lease: {fx:?}");
        let fx = s.response(&[(":status", "200")], true);
        assert_eq!(added(&fx, "ratelimit-policy").as_deref(), Some(r#""l";q=100;w=60"#));
        assert_eq!(added(&fx, "ratelimit"), Some(format!(r#""l";r={remaining};t=60"#)));
    }
}

/// Leased mode per key: a key is checked exactly until this worker has seen
/// a lease's worth of its requests (hot), then its own pool is leased (the
/// lease call names the key) and spent with no call; a cold key stays on
/// exact checks.
#[test]
fn hot_keys_are_leased_and_the_tail_is_checked_exactly() {
    let t = Test::new(
        r#"{"policies": [{"name": "k", "key": ["header:x-api-key"], "leased": {"tokens": 4, "ttl": "1m"}, "limits": [{"type": "fixed_window", "limit": 100, "window": "1h"}]}]}"#,
    );
    let req = |key: &str| get("/").header("x-api-key", key);
    for n in 0..4 {
        let mut s = t.stream();
        let fx = s.request(&req("hot"));
        assert_eq!(sends(&fx).len(), 1, "request {n}: exact until hot");
    }
    let asks = t.worker_sends(LEASE_PATH);
    assert_eq!(asks.len(), 1, "one lease, for the hot key");
    let ask: serde_json::Value = serde_json::from_slice(&asks[0].body).expect("json");
    assert_ne!(ask["key"], "", "the lease names the key: {ask}");
    let body = br#"{"granted": 4, "window": 1, "expires_in_ms": 60000, "remaining": 90}"#.to_vec();
    t.worker.handle_answer(
        &t.host.now(),
        asks[0].id,
        CallResult::Answered { status: Some(b"200".to_vec()), body: Some(body) },
        &t.host,
    );
    let mut s = t.stream();
    let fx = s.request(&req("hot"));
    assert!(sends(&fx).is_empty(), "the hot key spends its lease: {fx:?}");
    assert_eq!(count(&fx, 0, PolicyStat::Leased), 1);
    let mut s = t.stream();
    assert_eq!(sends(&s.request(&req("cold"))).len(), 1, "a cold key: the exact check");
}

/// The flow has no clock: each event carries its time, and the test picks
/// them (the host below is shared data and headers only, its own clock never
/// moves). A lease is held from the admission's event to the release's, and
/// the breaker, opened by a failure, stays open exactly `cooldown_ms` after it.
#[test]
fn each_event_carries_its_time() {
    use std::rc::Rc;

    use sluice_core::testing::FakeHost;
    use sluice_core::{Flow, Now, Worker};

    let doc = r#"{"shim": {"failure_threshold": 1, "cooldown_ms": 1000},
        "policies": [{"name": "c", "limits": [{"type": "concurrency", "limit": 2, "lease": "30s"}]}]}"#;
    let worker = Rc::new(Worker::new(sluice_policies::parse(doc).expect("doc"), 0, 7));
    let host = FakeHost::default();
    let at = Now::at;

    let mut flow = Flow::new(worker.clone());
    let check = sent(&flow.handle_request_headers(&at(5_000), &get("/"), &host), CHECK_PATH);
    flow.handle_answer(&at(5_010), check.id, Shim::allow_lease(&check, "l1"), &host);
    flow.handle_response_headers(&at(5_100), false, &host);
    let fx = flow.handle_response_body(&at(5_260), 0, true, &host);
    assert_eq!(count(&fx, 0, PolicyStat::HeldMs), 250, "admitted at 5 010, released at 5 260");

    let mut flow = Flow::new(worker.clone());
    let check = sent(&flow.handle_request_headers(&at(8_990), &get("/"), &host), CHECK_PATH);
    flow.handle_answer(&at(9_000), check.id, Shim::timed_out(), &host);
    let mut flow = Flow::new(worker.clone());
    assert!(sends(&flow.handle_request_headers(&at(9_999), &get("/"), &host)).is_empty(), "open");
    assert_eq!(flow.phase(), Phase::Failed);
    let mut flow = Flow::new(worker);
    let probe = flow.handle_request_headers(&at(10_000), &get("/"), &host);
    assert_eq!(sends(&probe).len(), 1, "the cooldown ends at 10 000: a probe");
}

/// The worker says when it next needs a tick: a lease held makes it due at
/// the lease's first renewal (a third of 30 s after the admission); a stream
/// reset hands its release over, due at once; once the tick has sent it, the
/// renewal is next again. Before, the worker ticked every 20 ms whatever was
/// due, and the release waited for that tick.
#[test]
fn the_worker_says_when_its_next_tick_is_due() {
    let t = Test::new(CONCURRENCY);
    assert_eq!(t.worker.poll_timeout(), None, "nothing to do");
    let mut s = t.stream();
    let check = sent(&s.request(&get("/")), CHECK_PATH);
    s.answer(&check, &Shim::allow_lease(&check, "L1"));
    let renewal = 1_000_000 + 10_000;
    assert_eq!(t.worker.poll_timeout(), Some(renewal), "the lease's renewal");
    t.host.advance(5);
    s.end();
    let due = t.worker.poll_timeout().expect("the release");
    assert!(due <= 1_000_005, "due at once: {due}");
    assert_eq!(t.worker_sends(RELEASE_PATH).len(), 1);
    assert!(t.worker.poll_timeout().is_none_or(|at| at > 1_000_005), "nothing left due now");
}
