//! Calendar windows in the check script (`lua/lib/calendar.lua`), on a real
//! redis-server: the window Redis picks when its clock and the shim's
//! straddle a boundary, and the true time to the boundary in a denial.

use std::time::Duration;

use sluice_harness::Redis;
use sluice_policies::algorithm::Algorithm;
use sluice_policies::calendar::{Calendar, Period, Weekday, Zone};
use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{Check, CheckRequest, WireLimit};
use sluice_shim::limiter::Limiter;
use sluice_shim::scripts::Scripts;
use sluice_shim::store::Target;

const HOUR: u64 = 3_600_000_000;

fn us(text: &str) -> u64 {
    let ts: jiff::Timestamp = text.parse().expect("a timestamp");
    u64::try_from(ts.as_microsecond()).expect("after 1970")
}

fn calendar(period: Period, zone: &str) -> Calendar {
    Calendar { period, zone: Zone::new(zone).expect("a known zone") }
}

/// One check of a calendar window of `limit` at Redis time `redis_now`,
/// with the window ends a shim whose clock reads `shim_now` passes: the
/// script's reply (allowed, retry, now, then the limit's seven numbers).
fn check_at(
    conn: &mut redis::Connection,
    scripts: &Scripts,
    key: &str,
    c: Calendar,
    redis_now: u64,
    shim_now: u64,
) -> Vec<i64> {
    let alg = Algorithm::Calendar { limit: 1, cost: 1, calendar: c, points: false };
    let (kind, [a, b, e1, e2]) = alg.script_args(shim_now);
    let mut call = scripts.check.prepare_invoke();
    call.arg(redis_now).arg("id").key(key).arg(kind).arg(a).arg(b).arg(e1).arg(e2);
    call.fcall().query(conn).expect("the check script")
}

/// Whatever side of a boundary each clock is on, Redis's own time picks the
/// window, for clocks up to nearly half a window apart: a window of limit 1
/// admits one request before the boundary and one after, and a second in
/// either is refused, its wait the true time to that window's end.
#[test]
fn clocks_straddling_a_boundary_agree_on_the_window() {
    let redis = Redis::start().expect("redis");
    let mut conn = redis.connection().expect("redis connection");
    let scripts = Scripts::new();
    let _: String = scripts.check.prepare_invoke().load().query(&mut conn).expect("FUNCTION LOAD");
    let cases = [
        (calendar(Period::Day, "Europe/Paris"), "2026-10-24T22:00:00Z"),
        (calendar(Period::Day, "America/Santiago"), "2026-09-06T04:00:00Z"),
        (calendar(Period::Week { starts: Weekday::Sunday }, "America/New_York"), "2026-03-08T05:00:00Z"),
        (calendar(Period::Month { anchor: 31 }, "UTC"), "2026-02-28T00:00:00Z"),
    ];
    const H: i64 = 3_600_000_000;
    let skews: [i64; 7] = [-11 * H, -H, -1_000_000, 0, 1_000_000, H, 11 * H];
    for (n, (c, boundary)) in cases.into_iter().enumerate() {
        let boundary = us(boundary);
        assert_eq!(c.window(boundary).map(|w| w.0), Some(boundary), "{c}: a boundary");
        for (i, skew) in skews.into_iter().enumerate() {
            let key = format!("sluice:{{t:{n}:{i}}}:cw");
            for (redis_now, end) in [(boundary - 1, boundary), (boundary, c.window(boundary).expect("w").1)] {
                let shim_now = redis_now.saturating_add_signed(skew);
                let first = check_at(&mut conn, &scripts, &key, c, redis_now, shim_now);
                assert_eq!(first[0], 1, "{c}, skew {skew}: the first request of the window at {redis_now}");
                let second = check_at(&mut conn, &scripts, &key, c, redis_now, shim_now);
                assert_eq!(second[0], 0, "{c}, skew {skew}: a second request at {redis_now}");
                let to_end = (end - redis_now).div_ceil(1000);
                assert_eq!(
                    second[1], to_end as i64,
                    "{c}, skew {skew}: the wait is the time to the window's end"
                );
            }
        }
    }
}

/// Through the shim: a denial's `retry_after_ms` and `reset_ms` are the true
/// time to the local midnight that ends the window, on a 25-hour day.
#[tokio::test]
async fn a_denial_waits_until_the_windows_true_end() {
    let redis = Redis::start().expect("redis");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), true).expect("limiter");
    let limit =
        WireLimit::CalendarWindow { limit: 2, calendar: calendar(Period::Day, "Europe/Paris"), cost: 1 };
    let request = |now: u64| CheckRequest {
        checks: vec![Check {
            policy: "p".into(),
            key: "k".into(),
            limits: vec![limit],
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        }]
        .into(),
        now_us: Some(Micros(now)),
        id: None,
        wait_ms: None,
        views: Default::default(),
    };
    // 2026-10-25 in Paris lasts 25 hours: from 22:00 UTC on the 24th to 23:00 UTC on the 25th.
    let start = us("2026-10-24T22:00:00Z");
    let end = us("2026-10-25T23:00:00Z");
    for now in [start, start + HOUR] {
        assert!(limiter.check(&request(now)).await.expect("check").allowed);
    }
    let late = end - 90_000_000;
    let denied = limiter.check(&request(late)).await.expect("check");
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after_ms, Some(Millis(90_000)));
    assert_eq!(denied.checks[0].limits[0].reset_ms, Millis(90_000));
    let next = limiter.check(&request(end)).await.expect("check");
    assert!(next.allowed, "the next day starts at its local midnight");
    assert_eq!(next.checks[0].limits[0].reset_ms, Millis(24 * 3_600_000));
}
