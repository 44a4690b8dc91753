//! The Lua scripts, assembled from `lua/`: each entry script in
//! `lua/scripts/` names the helpers it uses on its first line
//! (`-- requires: common, gcra`), and [`assemble`] puts those, with what
//! they require in turn, before its main part. Built once; `redis::Script`
//! runs them by EVALSHA and loads them again after a Redis restart or
//! failover (NOSCRIPT).
//!
//! The check script, which every decision runs, is also a Redis Function
//! library ([`Library`]): its helpers and algorithms are defined once, when
//! the library loads, where EVALSHA defines them again on every call (a
//! fifth of a fixed window's Redis instructions; `bench/README.md`,
//! scenario 3). `Store::call` runs it by FCALL, and by EVALSHA where Redis
//! has no functions.

use std::sync::LazyLock;

use redis::{Cmd, Script, ScriptInvocation, ToRedisArgs};

pub struct Scripts {
    pub check: Library,
    pub release: Script,
    pub renew: Script,
    pub adjust: Script,
    pub refund: Script,
    pub cancel: Script,
    pub confirm: Script,
    pub acquire: Script,
    pub leave: Script,
    pub reclaim: Script,
    pub take: Script,
    pub upstream: Script,
    pub paused: Script,
    pub lease: Script,
    pub lease_bucket: Script,
}

/// The shared helpers of `lua/lib/`, each after every helper it requires:
/// a script defines the ones it needs in this order, as Lua locals must be
/// defined before the functions that call them.
const LIB: &[(&str, &str)] = &[
    ("common", include_str!("../../lua/lib/common.lua")),
    ("counter", include_str!("../../lua/lib/counter.lua")),
    ("fixed_window", include_str!("../../lua/lib/fixed_window.lua")),
    ("first_hit", include_str!("../../lua/lib/first_hit.lua")),
    ("sliding_window", include_str!("../../lua/lib/sliding_window.lua")),
    ("sliding_approx", include_str!("../../lua/lib/sliding_approx.lua")),
    ("gcra", include_str!("../../lua/lib/gcra.lua")),
    ("calendar", include_str!("../../lua/lib/calendar.lua")),
    ("settle", include_str!("../../lua/lib/settle.lua")),
    ("pause", include_str!("../../lua/lib/pause.lua")),
    ("rate", include_str!("../../lua/lib/rate.lua")),
    ("slots", include_str!("../../lua/lib/slots.lua")),
    ("queue", include_str!("../../lua/lib/queue.lua")),
    ("concurrency", include_str!("../../lua/lib/concurrency.lua")),
    ("reserve", include_str!("../../lua/lib/reserve.lua")),
    ("lease", include_str!("../../lua/lib/lease.lua")),
];

/// The helpers a Lua file names on its `-- requires:` line, if any.
fn requires(source: &str) -> impl Iterator<Item = &str> {
    let line = source.lines().next().and_then(|l| l.strip_prefix("-- requires:")).unwrap_or_default();
    line.split(',').map(str::trim).filter(|name| !name.is_empty())
}

/// A whole script from its main part: the helpers it requires, and those
/// they require in turn, each once and in [`LIB`]'s order, then `main`.
///
/// # Panics
///
/// If a `-- requires:` line names a helper [`LIB`] does not hold: a
/// mistake in `lua/` that every test of the shim trips on at once.
pub fn assemble(main: &str) -> String {
    let mut wanted = [false; LIB.len()];
    let mut todo: Vec<&str> = requires(main).collect();
    while let Some(name) = todo.pop() {
        let Some(i) = LIB.iter().position(|(n, _)| *n == name) else {
            panic!("a Lua script requires `{name}`, which is not in lua/lib/ (scripts::LIB)");
        };
        if !wanted[i] {
            wanted[i] = true;
            todo.extend(requires(LIB[i].1));
        }
    }
    let mut source: String =
        LIB.iter().zip(wanted).filter(|(_, wanted)| *wanted).map(|((_, text), _)| *text).collect();
    source.push_str(main);
    source
}

fn script(main: &str) -> Script {
    Script::new(&assemble(main))
}

/// The check script's main part.
const CHECK_MAIN: &str = include_str!("../../lua/scripts/check.lua");

/// The check script's source: every decision runs it.
pub static CHECK: LazyLock<String> = LazyLock::new(|| assemble(CHECK_MAIN));

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            check: Library::new(&CHECK),
            release: script(include_str!("../../lua/scripts/release.lua")),
            renew: script(include_str!("../../lua/scripts/renew.lua")),
            acquire: script(include_str!("../../lua/scripts/acquire.lua")),
            leave: script(include_str!("../../lua/scripts/leave.lua")),
            reclaim: script(include_str!("../../lua/scripts/reclaim.lua")),
            take: script(include_str!("../../lua/scripts/take.lua")),
            adjust: script(include_str!("../../lua/scripts/adjust.lua")),
            refund: script(include_str!("../../lua/scripts/refund.lua")),
            upstream: script(include_str!("../../lua/scripts/upstream.lua")),
            paused: script(include_str!("../../lua/scripts/paused.lua")),
            lease: script(include_str!("../../lua/scripts/lease.lua")),
            lease_bucket: script(include_str!("../../lua/scripts/lease_bucket.lua")),
            cancel: script(include_str!("../../lua/scripts/cancel.lua")),
            confirm: script(include_str!("../../lua/scripts/confirm.lua")),
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
        let library = Library::new(&CHECK);
        assert!(CHECK.ends_with(CHECK_MAIN) && library.source.contains(CHECK_MAIN));
        assert!(library.source.starts_with("#!lua name=sluice_"), "{}", &library.source[..40]);
        assert_eq!(library.function.len(), "sluice_check_".len() + 16);
    }

    /// Every helper comes after the helpers it requires, so a script that
    /// defines them in `LIB`'s order never calls one before its definition.
    #[test]
    fn every_helper_follows_what_it_requires() {
        for (i, (name, text)) in LIB.iter().enumerate() {
            for needed in requires(text) {
                let at = LIB.iter().position(|(n, _)| *n == needed);
                assert!(
                    at.is_some_and(|at| at < i),
                    "lua/lib/{name}.lua requires {needed}, not before it in LIB"
                );
            }
        }
    }

    /// The check script holds its helpers in the order the hand-written
    /// assembly had them, each once, before its main part.
    #[test]
    fn a_script_holds_what_it_requires_each_once_before_its_main_part() {
        let order = [
            "common",
            "counter",
            "fixed_window",
            "first_hit",
            "sliding_window",
            "sliding_approx",
            "gcra",
            "calendar",
            "pause",
            "rate",
            "slots",
            "queue",
            "concurrency",
            "reserve",
        ];
        let expected: String =
            order.iter().map(|n| LIB.iter().find(|(m, _)| m == n).expect("in LIB").1).collect();
        assert_eq!(*CHECK, expected + CHECK_MAIN);
        let renew = include_str!("../../lua/scripts/renew.lua");
        assert_eq!(assemble(renew), format!("{}{renew}", LIB[0].1));
        let shed = include_str!("../../lua/scripts/shed.lua");
        assert_eq!(assemble(shed), shed, "a script that requires nothing is its main part");
    }
}
