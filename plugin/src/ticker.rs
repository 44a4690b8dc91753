//! The root context's timer, armed for the instant the next tick is needed
//! rather than on a fixed period: the worker's next call or renewal
//! (`Worker::poll_timeout`), a stream whose body wait ends, a response to
//! end. proxy-wasm gives a root context one periodic timer, and setting its
//! period restarts it (from any context of the VM): so it is set when an
//! event makes something due sooner than the armed tick, and after a tick
//! when the next one is at another distance.

use std::cell::Cell;
use std::time::Duration;

use proxy_wasm::hostcalls;
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
    /// After an event: brings the tick forward if `due` comes before the
    /// armed one. Reads no clock when it does not.
    pub fn arm(&self, due: Option<u64>, now: &Now) {
        let Some(due) = due else { return };
        if self.armed_ms.get().is_some_and(|at| at <= due) {
            return;
        }
        let now = now.ms();
        self.set(now, due.saturating_sub(now), true);
    }

    /// After a tick at `now` (or the configuration): the next one when
    /// `due`, at most [`MAX_MS`] away.
    pub fn ticked(&self, due: Option<u64>, now: u64) {
        self.set(now, due.map_or(MAX_MS, |due| due.saturating_sub(now)), false);
    }

    /// Fires the timer `delay_ms` from `now`; `restart`: even if the period
    /// is unchanged (else a periodic timer that just fired fires again at
    /// that distance by itself).
    fn set(&self, now: u64, delay_ms: u64, restart: bool) {
        let delay = delay_ms.clamp(MIN_MS, MAX_MS);
        self.armed_ms.set(Some(now.saturating_add(delay)));
        if !restart && delay == self.period_ms.get() {
            return;
        }
        self.period_ms.set(delay);
        if let Err(status) = hostcalls::set_tick_period(Duration::from_millis(delay)) {
            log::warn!("cannot set the tick period: {status:?}; leases will be reclaimed by TTL");
        }
    }
}
