//! The check script as a Redis Function library, on a real redis-server:
//! loaded on first use, loaded again after Redis lost it, and run as a
//! script where Redis refuses functions.

use std::time::Duration;

use sluice_harness::Redis;
use sluice_policies::units::Millis;
use sluice_policies::wire::{Check, CheckRequest, WireLimit};
use sluice_shim::limiter::Limiter;
use sluice_shim::store::Target;

fn request(id: &str) -> CheckRequest<'static> {
    CheckRequest {
        checks: vec![Check {
            policy: "p".into(),
            key: "k".into(),
            limits: vec![WireLimit::FixedWindow { limit: 2, window_ms: Millis(60_000), cost: 1 }],
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        }]
        .into(),
        now_us: None,
        id: Some(id.to_string().into()),
        wait_ms: None,
        views: Default::default(),
    }
}

fn libraries(redis: &Redis) -> usize {
    let mut conn = redis.connection().expect("redis");
    let list: Vec<redis::Value> = redis::cmd("FUNCTION").arg("LIST").query(&mut conn).expect("FUNCTION LIST");
    list.len()
}

fn calls(redis: &Redis, command: &str) -> u64 {
    let mut conn = redis.connection().expect("redis");
    let info: String = redis::cmd("INFO").arg("commandstats").query(&mut conn).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The first check loads the library and runs by FCALL; after Redis lost
/// it (`FUNCTION FLUSH`, as a restart without persistence does), the next
/// check loads it again and is answered; the limit's count carried on.
#[tokio::test]
async fn the_check_runs_as_a_function_loaded_again_when_redis_lost_it() {
    let redis = Redis::start().expect("redis");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter");
    assert_eq!(libraries(&redis), 0);
    assert!(limiter.check(&request("a")).await.expect("a").allowed);
    assert_eq!(libraries(&redis), 1, "the library was not loaded");
    assert!(calls(&redis, "fcall") >= 1, "the check did not run by FCALL");
    let mut conn = redis.connection().expect("redis");
    let _: () = redis::cmd("FUNCTION").arg("FLUSH").query(&mut conn).expect("FUNCTION FLUSH");
    assert!(limiter.check(&request("b")).await.expect("b").allowed);
    assert_eq!(libraries(&redis), 1, "the library was not loaded again");
    assert!(!limiter.check(&request("c")).await.expect("c").allowed, "the window's count was lost");
    assert_eq!(calls(&redis, "evalsha"), 0, "a check fell back to EVALSHA");
}

/// Where Redis refuses functions (here an ACL; Redis before 7 has none),
/// the checks run by EVALSHA and decide the same.
#[tokio::test]
async fn without_functions_the_check_runs_as_a_script() {
    let redis = Redis::start().expect("redis");
    let mut conn = redis.connection().expect("redis");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-fcall")
        .arg("-function")
        .query(&mut conn)
        .expect("ACL SETUSER");
    let limiter = Limiter::new(&Target::Single(redis.url()), Duration::from_secs(5), false).expect("limiter");
    let decisions: Vec<bool> = [
        limiter.check(&request("a")).await.expect("a").allowed,
        limiter.check(&request("b")).await.expect("b").allowed,
        limiter.check(&request("c")).await.expect("c").allowed,
    ]
    .to_vec();
    assert_eq!(decisions, [true, true, false]);
    assert!(calls(&redis, "evalsha") >= 3, "the checks did not run by EVALSHA");
}
