//! The root context's timer, armed for the instant the next tick is needed
//! rather than on a fixed period: the worker's next call or renewal
//! (`Worker::poll_timeout`), a stream whose body wait ends, a response to
//! end. proxy-wasm gives a root context one periodic timer, and setting its
//! period restarts it (from any context of the VM): so it is set when an
//! event makes something due sooner than the armed tick, and after a tick
//! when the next one is at another distance. Plain arithmetic: the caller
//! sets the period it returns.

use std::cell::Cell;

use sluice_core::Now;

/// The shortest period: 0 would stop the timer.
pub const MIN_MS: u64 = 1;
/// The longest: an idle worker still ticks once a second (its copy of the
/// over-limit cache is refreshed on each tick).
pub const MAX_MS: u64 = 1_000;

#[derive(Default)]
pub struct Ticker {
    /// When the timer fires next, as far as this VM set it.
    armed_ms: Cell<Option<u64>>,
    /// Its period now (0: never set).
    period_ms: Cell<u64>,
}

impl Ticker {
    /// After an event: the period to set, if `due` comes before the armed
    /// tick. Reads no clock when it does not.
    pub fn arm(&self, due: Option<u64>, now: &Now) -> Option<u64> {
        let due = due?;
        if self.armed_ms.get().is_some_and(|at| at <= due) {
            return None;
        }
        // Already at the shortest period: nothing can fire sooner, so a
        // request while a call is due (a report, say) sets nothing again.
        if self.armed_ms.get().is_some() && self.period_ms.get() == MIN_MS {
            return None;
        }
        let now = now.ms();
        self.set(now, due.saturating_sub(now), true)
    }

    /// After a tick at `now` (or the configuration): the period to set for
    /// the next one when `due`, at most [`MAX_MS`] away; `None` if the
    /// timer already fires then.
    pub fn ticked(&self, due: Option<u64>, now: u64) -> Option<u64> {
        self.set(now, due.map_or(MAX_MS, |due| due.saturating_sub(now)), false)
    }

    /// The timer to fire `delay_ms` from `now`; `restart`: even if the
    /// period is unchanged (a periodic timer that just fired fires again at
    /// that distance by itself, one that did not must be restarted).
    fn set(&self, now: u64, delay_ms: u64, restart: bool) -> Option<u64> {
        let delay = delay_ms.clamp(MIN_MS, MAX_MS);
        self.armed_ms.set(Some(now.saturating_add(delay)));
        if !restart && delay == self.period_ms.get() {
            return None;
        }
        self.period_ms.set(delay);
        Some(delay)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use sluice_core::Now;

    use super::{Ticker, MAX_MS};

    /// A call a stream leaves (due at once) fires the timer 1 ms later; a
    /// renewal due after the armed tick sets nothing and reads no clock; a
    /// tick with nothing due waits the longest, once.
    #[test]
    fn the_timer_is_set_for_what_is_due_first() {
        let ticker = Ticker::default();
        assert_eq!(ticker.ticked(None, 1_000), Some(MAX_MS), "idle: once a second");
        assert_eq!(ticker.ticked(None, 2_000), None, "already so");
        let reads = Cell::new(0);
        let clock = || {
            reads.set(reads.get() + 1);
            2_300
        };
        assert_eq!(ticker.arm(Some(12_000), &Now::read(&clock)), None, "a renewal later than the tick");
        assert_eq!(reads.get(), 0, "no clock read for it");
        assert_eq!(ticker.arm(Some(0), &Now::read(&clock)), Some(1), "a release: at once");
        let before = reads.get();
        assert_eq!(ticker.arm(Some(0), &Now::read(&clock)), None, "at 1 ms already: nothing sooner");
        assert_eq!(reads.get(), before, "and no clock read for it");
        assert_eq!(ticker.arm(Some(2_800), &Now::at(2_300)), None, "the armed tick comes first");
        assert_eq!(ticker.ticked(Some(2_320), 2_301), Some(19), "leased pools: 20 ms after the last tick");
        assert_eq!(ticker.ticked(Some(2_340), 2_321), None, "the same period again");
    }

    /// Arming again for the due time the timer was last armed or ticked
    /// for sets nothing, at any later instant: so the VM skips arming while
    /// nothing it waits for has changed (`Vm::arm`).
    #[test]
    fn the_same_due_time_arms_nothing_again() {
        let dues =
            [None, Some(0), Some(999), Some(1_000), Some(1_001), Some(1_500), Some(2_200), Some(9_000)];
        for (due, armed, at) in dues
            .into_iter()
            .flat_map(|due| [true, false].map(|armed| (due, armed)))
            .flat_map(|(due, armed)| [1_000, 1_001, 1_200, 2_000].map(|at| (due, armed, at)))
        {
            let ticker = Ticker::default();
            ticker.ticked(Some(5_000), 900);
            if armed {
                ticker.arm(due, &Now::at(1_000));
            } else {
                ticker.ticked(due, 1_000);
            }
            assert_eq!(ticker.arm(due, &Now::at(at)), None, "{due:?} again at {at} (armed: {armed})");
        }
    }
}
