//! The Lua scripts, assembled from `lua/`: the helpers, the algorithms, then
//! each script's main part. Built once; `redis::Script` runs them by EVALSHA
//! and loads them again after a Redis restart or failover (NOSCRIPT).

use redis::Script;

pub struct Scripts {
    pub check: Script,
    pub release: Script,
    pub renew: Script,
    pub adjust: Script,
    pub refund: Script,
    pub cancel: Script,
    pub acquire: Script,
    pub leave: Script,
    pub reclaim: Script,
    pub take: Script,
    pub upstream: Script,
    pub paused: Script,
    pub lease: Script,
}

/// The helpers, the time-based algorithms and the queue, which every script
/// touching leases needs: a hand-over re-checks a mixed waiter's time limits.
macro_rules! with_queue {
    ($($file:literal),*) => {
        concat!(
            include_str!("../../lua/common.lua"),
            include_str!("../../lua/fixed_window.lua"),
            include_str!("../../lua/sliding_window.lua"),
            include_str!("../../lua/gcra.lua"),
            include_str!("../../lua/pause.lua"),
            include_str!("../../lua/slots.lua"),
            include_str!("../../lua/queue.lua"),
            $(include_str!($file)),*
        )
    };
}

/// The check script's source: every decision runs it.
pub const CHECK: &str = concat!(
    include_str!("../../lua/common.lua"),
    include_str!("../../lua/fixed_window.lua"),
    include_str!("../../lua/sliding_window.lua"),
    include_str!("../../lua/sliding_approx.lua"),
    include_str!("../../lua/gcra.lua"),
    include_str!("../../lua/pause.lua"),
    include_str!("../../lua/slots.lua"),
    include_str!("../../lua/queue.lua"),
    include_str!("../../lua/concurrency.lua"),
    include_str!("../../lua/reserve.lua"),
    include_str!("../../lua/check.lua"),
);

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            check: Script::new(CHECK),
            release: Script::new(with_queue!("../../lua/release.lua")),
            renew: Script::new(concat!(
                include_str!("../../lua/common.lua"),
                include_str!("../../lua/renew.lua")
            )),
            acquire: Script::new(with_queue!("../../lua/acquire.lua")),
            leave: Script::new(with_queue!("../../lua/leave.lua")),
            reclaim: Script::new(with_queue!("../../lua/reclaim.lua")),
            take: Script::new(with_queue!("../../lua/take.lua")),
            adjust: Script::new(concat!(
                include_str!("../../lua/common.lua"),
                include_str!("../../lua/gcra.lua"),
                include_str!("../../lua/adjust.lua")
            )),
            refund: Script::new(with_queue!("../../lua/refund.lua")),
            upstream: Script::new(concat!(
                include_str!("../../lua/common.lua"),
                include_str!("../../lua/upstream.lua")
            )),
            paused: Script::new(concat!(
                include_str!("../../lua/common.lua"),
                include_str!("../../lua/paused.lua")
            )),
            lease: Script::new(concat!(
                include_str!("../../lua/common.lua"),
                include_str!("../../lua/lease.lua")
            )),
            cancel: Script::new(concat!(
                include_str!("../../lua/common.lua"),
                include_str!("../../lua/fixed_window.lua"),
                include_str!("../../lua/sliding_window.lua"),
                include_str!("../../lua/gcra.lua"),
                include_str!("../../lua/cancel.lua"),
            )),
        }
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts::new()
    }
}
