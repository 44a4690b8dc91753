//! The Lua scripts, assembled from `lua/`: the helpers, the algorithms, then
//! each script's main part. Built once; `redis::Script` runs them by EVALSHA
//! and loads them again after a Redis restart or failover (NOSCRIPT).

use redis::Script;

pub struct Scripts {
    pub check: Script,
    pub release: Script,
    pub adjust: Script,
    pub refund: Script,
    pub cancel: Script,
}

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            check: Script::new(concat!(
                include_str!("../../lua/common.lua"),
                include_str!("../../lua/fixed_window.lua"),
                include_str!("../../lua/sliding_window.lua"),
                include_str!("../../lua/sliding_approx.lua"),
                include_str!("../../lua/gcra.lua"),
                include_str!("../../lua/concurrency.lua"),
                include_str!("../../lua/reserve.lua"),
                include_str!("../../lua/check.lua"),
            )),
            release: Script::new(include_str!("../../lua/release.lua")),
            adjust: Script::new(concat!(
                include_str!("../../lua/common.lua"),
                include_str!("../../lua/adjust.lua")
            )),
            refund: Script::new(concat!(
                include_str!("../../lua/common.lua"),
                include_str!("../../lua/refund.lua")
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
