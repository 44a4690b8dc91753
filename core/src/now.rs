//! The time of one event, in milliseconds since the epoch: an argument of
//! every event of [`Flow`](crate::Flow) and [`Worker`](crate::Worker), as
//! in a sans-IO protocol machine. A test gives it ([`Now::at`]); an adapter
//! may give the host's clock instead ([`Now::read`]), which is read on first
//! use and once: in proxy-wasm the clock is a host call, and a request that
//! no policy matches reads none. Either way one event sees one instant, and
//! no handler can reach a clock of its own.

use std::cell::Cell;

pub struct Now<'c> {
    ms: Cell<Option<u64>>,
    clock: Option<&'c dyn Fn() -> u64>,
}

impl Now<'static> {
    /// The event happens at `ms`.
    pub fn at(ms: u64) -> Now<'static> {
        Now { ms: Cell::new(Some(ms)), clock: None }
    }
}

impl<'c> Now<'c> {
    /// The event happens when `clock` says, asked at most once.
    pub fn read(clock: &'c dyn Fn() -> u64) -> Now<'c> {
        Now { ms: Cell::new(None), clock: Some(clock) }
    }

    /// The event's time.
    pub fn ms(&self) -> u64 {
        if let Some(ms) = self.ms.get() {
            return ms;
        }
        let ms = self.clock.map_or(0, |clock| clock());
        self.ms.set(Some(ms));
        ms
    }

    /// The time, if it has been given or read already: never reads the clock.
    pub fn known(&self) -> Option<u64> {
        self.ms.get()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::Now;

    /// The clock is read on first use only, and once per event.
    #[test]
    fn the_clock_is_read_once_and_only_when_asked() {
        let reads = Cell::new(0);
        let clock = || {
            reads.set(reads.get() + 1);
            42
        };
        let now = Now::read(&clock);
        assert_eq!(now.known(), None);
        assert_eq!(reads.get(), 0);
        assert_eq!((now.ms(), now.ms()), (42, 42));
        assert_eq!(reads.get(), 1);
        assert_eq!(Now::at(7).known(), Some(7));
    }
}
