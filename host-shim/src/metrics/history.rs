//! One policy's recent past for the dashboard: a fixed ring of
//! [`BUCKETS`] buckets of [`BUCKET_S`] seconds each (the last 10 minutes),
//! each counting the requests admitted at once, denied, admitted after
//! being held, and let through by `failure_mode` (reported by the filters,
//! [`sluice_policies::wire::ReportRequest`]).
//!
//! Memory is fixed: the ring never grows, and a bucket is reused for a
//! newer time once its own has left the window. Time is an argument (whole
//! seconds on the shim's monotonic clock), so tests drive it: a gap longer
//! than the ring leaves nothing stale behind, and a clock that steps back
//! counts into the newest bucket rather than rewriting an older one.

use serde::Serialize;

/// Seconds each bucket covers.
pub const BUCKET_S: u64 = 5;
/// Buckets kept: `BUCKETS * BUCKET_S` seconds of history (10 minutes).
pub const BUCKETS: usize = 120;

/// What one bucket counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Admitted at once.
    Allowed,
    /// Denied by this policy.
    Denied,
    /// Admitted after being held (egress wait).
    Waited,
    /// Let through by `failure_mode: allow`, never decided by the shim.
    FailurePass,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    allowed: u64,
    denied: u64,
    waited: u64,
    failure_passes: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Bucket {
    /// Which bucket of time it holds: the time over [`BUCKET_S`].
    at: u64,
    counts: Counts,
}

/// The ring, by `at % BUCKETS`.
#[derive(Debug, Clone)]
pub struct History {
    buckets: Box<[Bucket; BUCKETS]>,
    /// The newest bucket written: a clock that steps back counts into it.
    newest: u64,
}

/// The history as `/dashboard.json` serves it: each series oldest first,
/// [`BUCKETS`] counts each, the last one the bucket that holds now (still
/// filling).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Series {
    pub bucket_seconds: u64,
    pub allowed: Vec<u64>,
    pub denied: Vec<u64>,
    pub waited: Vec<u64>,
    /// Reported by the filters when received: a few seconds late.
    pub failure_passes: Vec<u64>,
}

impl Default for History {
    fn default() -> Self {
        History { buckets: Box::new([Bucket::default(); BUCKETS]), newest: 0 }
    }
}

impl Default for Series {
    /// An empty history: zeros over the whole window.
    fn default() -> Self {
        History::default().series(0)
    }
}

impl History {
    /// Adds `n` requests of `kind` at `now_s`.
    pub fn add(&mut self, now_s: u64, kind: Kind, n: u64) {
        let at = (now_s / BUCKET_S).max(self.newest);
        self.newest = at;
        let bucket = &mut self.buckets[slot(at)];
        if bucket.at != at {
            *bucket = Bucket { at, counts: Counts::default() };
        }
        let c = &mut bucket.counts;
        let count = match kind {
            Kind::Allowed => &mut c.allowed,
            Kind::Denied => &mut c.denied,
            Kind::Waited => &mut c.waited,
            Kind::FailurePass => &mut c.failure_passes,
        };
        *count = count.saturating_add(n);
    }

    /// The last [`BUCKETS`] buckets up to `now_s`'s (or the newest written,
    /// if the clock stepped back), oldest first; a bucket that holds an
    /// older time than its place (or none yet) counts zero.
    pub fn series(&self, now_s: u64) -> Series {
        let newest = (now_s / BUCKET_S).max(self.newest);
        let mut series = Series {
            bucket_seconds: BUCKET_S,
            allowed: Vec::with_capacity(BUCKETS),
            denied: Vec::with_capacity(BUCKETS),
            waited: Vec::with_capacity(BUCKETS),
            failure_passes: Vec::with_capacity(BUCKETS),
        };
        for back in (0..BUCKETS as u64).rev() {
            let counts = newest
                .checked_sub(back)
                .map(|at| (at, self.buckets[slot(at)]))
                .filter(|(at, bucket)| bucket.at == *at)
                .map(|(_, bucket)| bucket.counts)
                .unwrap_or_default();
            series.allowed.push(counts.allowed);
            series.denied.push(counts.denied);
            series.waited.push(counts.waited);
            series.failure_passes.push(counts.failure_passes);
        }
        series
    }
}

fn slot(at: u64) -> usize {
    (at % BUCKETS as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nonzero buckets of a series: (buckets before the last, count).
    fn nonzero(series: &[u64]) -> Vec<(usize, u64)> {
        let last = series.len() - 1;
        series.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, n)| (last - i, *n)).collect()
    }

    /// Each kind counts in the bucket of its time; the series end at now's
    /// bucket, oldest first, always [`BUCKETS`] long.
    #[test]
    fn counts_land_in_the_bucket_of_their_time() {
        let mut h = History::default();
        h.add(100, Kind::Allowed, 1);
        h.add(104, Kind::Allowed, 2);
        h.add(105, Kind::Denied, 1);
        h.add(112, Kind::Waited, 1);
        h.add(113, Kind::FailurePass, 7);
        let s = h.series(114);
        assert_eq!(s.bucket_seconds, BUCKET_S);
        assert_eq!(s.allowed.len(), BUCKETS);
        // Now (114) is bucket 22; 100 to 104 is bucket 20, two before it.
        assert_eq!(nonzero(&s.allowed), [(2, 3)]);
        assert_eq!(nonzero(&s.denied), [(1, 1)]);
        assert_eq!(nonzero(&s.waited), [(0, 1)]);
        assert_eq!(nonzero(&s.failure_passes), [(0, 7)]);
        // A minute later the same counts have moved 12 buckets back.
        assert_eq!(nonzero(&h.series(174).allowed), [(14, 3)]);
    }

    /// A bucket leaves the series once it is older than the ring, and its
    /// slot is reused: the new time's counts start at zero.
    #[test]
    fn old_buckets_fall_out_and_their_slots_start_afresh() {
        let mut h = History::default();
        h.add(0, Kind::Allowed, 4);
        let ring = BUCKETS as u64 * BUCKET_S;
        assert_eq!(nonzero(&h.series(ring - 1).allowed), [(BUCKETS - 1, 4)]);
        assert_eq!(nonzero(&h.series(ring).allowed), []);
        h.add(ring, Kind::Allowed, 1);
        assert_eq!(nonzero(&h.series(ring).allowed), [(0, 1)]);
    }

    /// After a silence longer than the whole ring, nothing from before it
    /// shows, though every slot still holds its old counts.
    #[test]
    fn a_gap_longer_than_the_ring_shows_nothing_stale() {
        let mut h = History::default();
        for t in (0..BUCKETS as u64 * BUCKET_S).step_by(BUCKET_S as usize) {
            h.add(t, Kind::Denied, 1);
        }
        assert_eq!(nonzero(&h.series(BUCKETS as u64 * BUCKET_S - 1).denied).len(), BUCKETS);
        let later = 10 * BUCKETS as u64 * BUCKET_S + 3;
        assert_eq!(nonzero(&h.series(later).denied), []);
        h.add(later, Kind::Denied, 2);
        assert_eq!(nonzero(&h.series(later).denied), [(0, 2)]);
    }

    /// A clock that steps back counts into the newest bucket, never into an
    /// older one (which would rewrite a bucket the page already showed),
    /// and the series still ends at the newest bucket.
    #[test]
    fn a_clock_that_steps_back_counts_into_the_newest_bucket() {
        let mut h = History::default();
        h.add(1_000, Kind::Allowed, 1);
        h.add(400, Kind::Allowed, 1);
        h.add(999, Kind::FailurePass, 1);
        let s = h.series(400);
        assert_eq!(nonzero(&s.allowed), [(0, 2)]);
        assert_eq!(nonzero(&s.failure_passes), [(0, 1)]);
        assert_eq!(s, h.series(1_000));
    }

    /// Early on, the buckets before the clock's start count zero, and an
    /// empty history is zeros over the whole window.
    #[test]
    fn the_start_and_an_empty_history_are_zeros() {
        let mut h = History::default();
        h.add(3, Kind::Allowed, u64::MAX);
        h.add(3, Kind::Allowed, 1);
        assert_eq!(nonzero(&h.series(3).allowed), [(0, u64::MAX)]);
        let empty = Series::default();
        assert_eq!((empty.bucket_seconds, empty.waited.len()), (BUCKET_S, BUCKETS));
        assert!(empty.allowed.iter().chain(&empty.failure_passes).all(|&n| n == 0));
    }
}
