//! What the partner saw: one [`Arrival`] per call, by its own clock, and the
//! measures the egress tests and the bench take from them.

use std::time::Duration;

/// One call as the partner saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// When it arrived, since the partner started.
    pub at: Duration,
    /// The account header's value ("" without one).
    pub key: String,
    /// The client's sequence header, if it sent a number.
    pub seq: Option<u64>,
    /// Calls of this key in flight at the partner once this one was admitted
    /// (itself included); for a refused one, those in flight when it came.
    pub in_flight: u32,
    /// What refused it (the partner answered 429); `None` if admitted.
    pub refused: Option<String>,
    /// When its answer was done (admitted calls only; `None` while in flight).
    pub finished: Option<Duration>,
}

/// Every call in order of arrival.
#[derive(Clone, Debug, Default)]
pub struct Log(pub Vec<Arrival>);

impl Log {
    /// The calls of one key only.
    pub fn of(&self, key: &str) -> Log {
        Log(self.0.iter().filter(|a| a.key == key).cloned().collect())
    }

    pub fn admitted(&self) -> impl Iterator<Item = &Arrival> {
        self.0.iter().filter(|a| a.refused.is_none())
    }

    /// How many calls the partner answered 429.
    pub fn refused(&self) -> usize {
        self.0.iter().filter(|a| a.refused.is_some()).count()
    }

    /// The sequence numbers of admitted calls, in order of arrival.
    pub fn seqs(&self) -> Vec<u64> {
        self.admitted().filter_map(|a| a.seq).collect()
    }

    /// Gaps between consecutive admitted calls (any key).
    pub fn gaps(&self) -> Vec<Duration> {
        let times: Vec<Duration> = self.admitted().map(|a| a.at).collect();
        times.windows(2).map(|pair| pair[1].saturating_sub(pair[0])).collect()
    }

    /// The smallest gap between consecutive admitted calls.
    pub fn min_gap(&self) -> Option<Duration> {
        self.gaps().into_iter().min()
    }

    /// The most calls of one key in flight at once.
    pub fn max_in_flight(&self) -> u32 {
        self.admitted().map(|a| a.in_flight).max().unwrap_or(0)
    }

    /// From the first admitted call's arrival to the last one's.
    pub fn span(&self) -> Duration {
        let mut times = self.admitted().map(|a| a.at);
        let first = times.next().unwrap_or_default();
        times.last().map_or(Duration::ZERO, |last| last - first)
    }

    /// How long each freed concurrency slot stayed empty: answers finishing
    /// and admitted calls arriving, by time, paired first-freed to
    /// next-arrived. With callers queued at the gateway, each pair is a
    /// release and the next waiter's admission, seen from the partner. Slots
    /// freed when nobody waits any more (the run's tail) stay unpaired.
    pub fn handoffs(&self) -> Vec<Duration> {
        let mut events: Vec<(Duration, bool)> = Vec::new();
        for a in self.admitted() {
            events.push((a.at, true));
            if let Some(done) = a.finished {
                events.push((done, false));
            }
        }
        // At the same instant a finish comes first: it may free the slot taken.
        events.sort_by_key(|&(at, arrival)| (at, arrival));
        let mut freed = std::collections::VecDeque::new();
        let mut gaps = Vec::new();
        for (at, arrival) in events {
            if !arrival {
                freed.push_back(at);
            } else if let Some(since) = freed.pop_front() {
                gaps.push(at - since);
            }
        }
        gaps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(at: u64, seq: u64, finished: Option<u64>) -> Arrival {
        Arrival {
            at: Duration::from_millis(at),
            key: "k".into(),
            seq: Some(seq),
            in_flight: 1,
            refused: None,
            finished: finished.map(Duration::from_millis),
        }
    }

    /// Two slots: calls 0 and 1 take them at once; 1 finishes at 100 and 2
    /// arrives at 103, 0 finishes at 110 and 3 arrives at 112: handoffs of 3
    /// and 2 ms; the last answers free slots nobody takes.
    #[test]
    fn handoffs_pair_each_freed_slot_with_the_next_arrival() {
        let log = Log(vec![
            arrival(0, 0, Some(110)),
            arrival(0, 1, Some(100)),
            arrival(103, 2, Some(200)),
            arrival(112, 3, Some(210)),
        ]);
        let ms = Duration::from_millis;
        assert_eq!(log.handoffs(), [ms(3), ms(2)]);
        assert_eq!(log.gaps(), [ms(0), ms(103), ms(9)]);
        assert_eq!((log.min_gap(), log.span(), log.seqs()), (Some(ms(0)), ms(112), vec![0, 1, 2, 3]));
    }
}
