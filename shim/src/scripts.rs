//! The Lua scripts, assembled from `lua/`: the helpers, the algorithms, then
//! each script's main part. Built once; `redis::Script` runs them by EVALSHA
//! and loads them again after a Redis restart or failover (NOSCRIPT).
//!
//! The check script, which every decision runs, is also a Redis Function
//! library ([`Library`]): its helpers and algorithms are defined once, when
//! the library loads, where EVALSHA defines them again on every call (a
//! fifth of a fixed window's Redis instructions; `bench/README.md`,
//! scenario 3). `Store::call` runs it by FCALL, and by EVALSHA where Redis
//! has no functions.

use redis::{Cmd, Script, ScriptInvocation, ToRedisArgs};

pub struct Scripts {
    pub check: Library,
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
            include_str!("../../lua/rate.lua"),
            include_str!("../../lua/slots.lua"),
            include_str!("../../lua/queue.lua"),
            $(include_str!($file)),*
        )
    };
}

/// The check script's main part.
const CHECK_MAIN: &str = include_str!("../../lua/check.lua");

/// The check script's source: every decision runs it.
pub const CHECK: &str = concat!(
    include_str!("../../lua/common.lua"),
    include_str!("../../lua/fixed_window.lua"),
    include_str!("../../lua/sliding_window.lua"),
    include_str!("../../lua/sliding_approx.lua"),
    include_str!("../../lua/gcra.lua"),
    include_str!("../../lua/pause.lua"),
    include_str!("../../lua/rate.lua"),
    include_str!("../../lua/slots.lua"),
    include_str!("../../lua/queue.lua"),
    include_str!("../../lua/concurrency.lua"),
    include_str!("../../lua/reserve.lua"),
    include_str!("../../lua/check.lua"),
);

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            check: Library::new(CHECK),
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
                include_str!("../../lua/rate.lua"),
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

/// A script that is also a Redis Function library: the same Lua, its
/// helpers defined once at load and its main part the function's body.
/// `KEYS` and `ARGV` are the library's locals, set by each call, so the
/// helpers read them as they do in a script.
pub struct Library {
    /// What `FUNCTION LOAD REPLACE` loads.
    pub source: String,
    /// The function's name, versioned by the script's hash, so shims of two
    /// versions can share a Redis during an upgrade.
    pub function: String,
    /// The same script for EVALSHA, where Redis has no functions.
    pub script: Script,
}

impl Library {
    /// `source` is a whole script whose main part is the check script's.
    fn new(source: &str) -> Library {
        let script = Script::new(source);
        let helpers = source.strip_suffix(CHECK_MAIN).unwrap_or_default();
        let version = script.get_hash().chars().take(16).collect::<String>();
        let function = format!("sluice_check_{version}");
        let source = format!(
            "#!lua name=sluice_{version}\nlocal KEYS, ARGV = {{}}, {{}}\n{helpers}\n\
             redis.register_function('{function}', function(keys, args)\nKEYS, ARGV = keys, args\n\
             {CHECK_MAIN}\nend)\n"
        );
        Library { source, function, script }
    }

    pub fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation { library: self, keys: Vec::new(), args: Vec::new() }
    }
}

/// One call of a [`Library`], built like a `redis::ScriptInvocation`.
pub struct Invocation<'a> {
    library: &'a Library,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl<'a> Invocation<'a> {
    pub fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    pub fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// `FCALL`.
    pub fn fcall(&self) -> Cmd {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&self.library.function).arg(self.keys.len()).arg(&self.keys).arg(&self.args);
        cmd
    }

    /// `FUNCTION LOAD REPLACE` of its library.
    pub fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(&self.library.source);
        cmd
    }

    /// The same call as a script, by EVALSHA.
    pub fn script(&self) -> ScriptInvocation<'a> {
        let mut call = self.library.script.prepare_invoke();
        for key in &self.keys {
            call.key(key);
        }
        for arg in &self.args {
            call.arg(arg);
        }
        call
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_holds_the_check_script_with_its_main_part_as_the_function() {
        let library = Library::new(CHECK);
        assert!(CHECK.ends_with(CHECK_MAIN) && library.source.contains(CHECK_MAIN));
        assert!(library.source.starts_with("#!lua name=sluice_"), "{}", &library.source[..40]);
        assert_eq!(library.function.len(), "sluice_check_".len() + 16);
    }
}
