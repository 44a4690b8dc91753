//! Waking a held request at its slot's instant, not on the next tick.
//!
//! Tokio's timer counts whole milliseconds: a sleep ends on the first
//! millisecond tick at or after its deadline, so a held request would wake
//! up to a millisecond late, varying from one request to the next; that is
//! jitter at the partner which the margin would have to cover. So a held
//! request sleeps on Tokio's timer only until [`COARSE`] before its slot,
//! then hands its instant to one thread of the shim ([`Precise`]), which
//! keeps every such instant in a heap and waits on a condition variable
//! until the earliest (a timer per waiter, no periodic tick), and wakes each
//! waiter as its instant comes.
//!
//! **Which instant.** A slot is a time on Redis's clock. The script read
//! that clock somewhere between the shim sending the call and the reply
//! arriving, so one call places the slot on the shim's clock only within a
//! round trip, which on a busy host can be milliseconds. [`RedisClock`]
//! keeps the tightest bounds on the offset between the two clocks over the
//! calls so far (each call's bounds intersected with the last ones, widened
//! for drift as they age), so a held request wakes at the latest instant its
//! slot can be on our clock (never early) and knows how late it woke within
//! the narrowest round trip seen.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How long before the slot the precise thread takes over: more than
/// Tokio's tick, with room for its driver to wake late.
const COARSE: Duration = Duration::from_millis(3);

/// Sleeps until `at`, waking within the kernel's timer slack of it (tens of
/// µs on an idle host) rather than on Tokio's next millisecond tick.
pub(crate) async fn sleep_until(at: Instant) {
    if let Some(coarse) = at.checked_sub(COARSE) {
        if coarse > Instant::now() {
            tokio::time::sleep_until(coarse.into()).await;
        }
    }
    if Instant::now() >= at {
        return;
    }
    let (tx, rx) = oneshot::channel();
    if Precise::get().add(at, tx) {
        // The sender is dropped only after it fired (or the thread could
        // not start, then add() said false).
        let _ = rx.await;
    } else {
        tokio::time::sleep_until(at.into()).await;
    }
}

/// The one thread that wakes held requests at their instants.
struct Precise {
    due: Mutex<BinaryHeap<Reverse<Due>>>,
    changed: Condvar,
    running: bool,
}

struct Due {
    at: Instant,
    seq: u64,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Due) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Due) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Due) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

static PRECISE: OnceLock<&'static Precise> = OnceLock::new();
static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Precise {
    fn get() -> &'static Precise {
        PRECISE.get_or_init(|| {
            let precise: &'static Precise = Box::leak(Box::new(Precise {
                due: Mutex::default(),
                changed: Condvar::new(),
                running: true,
            }));
            let started = std::thread::Builder::new().name("sluice-wake".into()).spawn(move || precise.run());
            if started.is_err() {
                tracing::warn!(
                    "cannot start the precise wake-up thread; held requests wake on Tokio's timer"
                );
                return Box::leak(Box::new(Precise {
                    due: Mutex::default(),
                    changed: Condvar::new(),
                    running: false,
                }));
            }
            precise
        })
    }

    /// Wakes `wake` at `at`; false if there is no thread to do it.
    fn add(&self, at: Instant, wake: oneshot::Sender<()>) -> bool {
        if !self.running {
            return false;
        }
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let earliest = due.peek().is_none_or(|Reverse(first)| at < first.at);
        due.push(Reverse(Due { at, seq, wake }));
        drop(due);
        if earliest {
            self.changed.notify_one();
        }
        true
    }

    fn run(&self) {
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let now = Instant::now();
            while due.peek().is_some_and(|Reverse(first)| first.at <= now) {
                if let Some(Reverse(first)) = due.pop() {
                    // A request gone meanwhile has dropped its receiver.
                    let _ = first.wake.send(());
                }
            }
            due = match due.peek() {
                Some(Reverse(first)) => {
                    let wait = first.at.saturating_duration_since(now);
                    self.changed.wait_timeout(due, wait).unwrap_or_else(PoisonError::into_inner).0
                }
                None => self.changed.wait(due).unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

/// The offset of Redis's clock from the shim's, bounded.
#[derive(Debug)]
pub struct RedisClock {
    origin: Instant,
    /// (lowest, highest) offset in µs (Redis's time minus ours since
    /// `origin`), and when they were last tightened.
    bounds: Mutex<Option<(i64, i64, Instant)>>,
}

/// How fast the two clocks may drift apart: one µs in 2,000 (500 ppm, the
/// most an NTP daemon slews a clock); the bounds widen by this as they age.
const DRIFT_ONE_IN: i64 = 2_000;

impl Default for RedisClock {
    fn default() -> RedisClock {
        RedisClock { origin: Instant::now(), bounds: Mutex::new(None) }
    }
}

impl RedisClock {
    fn local_us(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.origin).as_micros()).unwrap_or(i64::MAX)
    }

    /// A call sent at `asked` and answered at `received` read Redis's time
    /// `redis_us`; returns where `slot_us` on Redis's clock lies on ours:
    /// (earliest, latest).
    pub(crate) fn place(
        &self,
        asked: Instant,
        received: Instant,
        redis_us: u64,
        slot_us: u64,
    ) -> (Instant, Instant) {
        let redis_us = i64::try_from(redis_us).unwrap_or(i64::MAX);
        let (low_now, high_now) = (redis_us - self.local_us(received), redis_us - self.local_us(asked));
        let mut bounds = self.bounds.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut low, mut high) = match *bounds {
            Some((low, high, since)) => {
                let widen = self.local_us(received).saturating_sub(self.local_us(since)) / DRIFT_ONE_IN + 1;
                (low_now.max(low - widen), high_now.min(high + widen))
            }
            None => (low_now, high_now),
        };
        if low > high {
            // The clocks disagree with what we knew (Redis's was stepped):
            // start again from this call alone.
            (low, high) = (low_now, high_now);
        }
        *bounds = Some((low, high, received));
        drop(bounds);
        let slot_us = i64::try_from(slot_us).unwrap_or(i64::MAX);
        let at = |offset: i64| {
            let local = u64::try_from(slot_us.saturating_sub(offset)).unwrap_or(0);
            self.origin + Duration::from_micros(local)
        };
        (at(high), at(low))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One call bounds the slot within its round trip; a later, faster call
    /// narrows it; a clock stepped past the bounds starts them again.
    #[test]
    fn the_slot_is_placed_within_the_narrowest_round_trip() {
        let clock = RedisClock::default();
        let t = |us: u64| clock.origin + Duration::from_micros(us);
        // Redis's clock is ours plus 1,000,000 µs; read at 1,500 µs.
        let (earliest, latest) = clock.place(t(1_000), t(3_000), 1_001_500, 1_011_500);
        assert_eq!((earliest, latest), (t(11_000), t(13_000)));
        // Read exactly at 20,050 µs, within a 100 µs round trip.
        let (earliest, latest) = clock.place(t(20_000), t(20_100), 1_020_050, 1_030_000);
        assert!(earliest <= t(30_000) && t(30_000) <= latest, "{earliest:?} {latest:?}");
        assert!(latest - earliest <= Duration::from_micros(110), "{:?}", latest - earliest);
        // Redis stepped 5 s ahead: bounds from this call alone.
        let (earliest, latest) = clock.place(t(40_000), t(40_200), 6_040_100, 6_050_100);
        assert_eq!((earliest, latest), (t(50_000), t(50_200)));
    }

    /// Never early, whatever the order the instants come in.
    #[tokio::test]
    async fn wakes_each_waiter_at_or_after_its_instant() {
        let start = Instant::now();
        let offsets = [9u64, 1, 5, 0, 4, 12, 4];
        let tasks: Vec<_> = offsets
            .iter()
            .map(|&ms| {
                let at = start + Duration::from_millis(ms);
                tokio::spawn(async move {
                    sleep_until(at).await;
                    Instant::now() >= at
                })
            })
            .collect();
        for task in tasks {
            assert!(task.await.expect("a sleeper"), "woke before its instant");
        }
    }
}
