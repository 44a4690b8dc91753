//! Space-Saving (Metwally, Agrawal and El Abbadi, 2005) in its
//! stream-summary form: the heaviest keys of a stream in at most `capacity`
//! counters, each request counted in O(1) whatever the capacity.
//!
//! A key already counted counts one more; a new key takes a free counter,
//! or else the counter of a key with the smallest count, starting from that
//! count plus one and keeping the count it inherited as its `error`. So:
//!
//! - a counted key's true count lies between `count - error` and `count`;
//! - the smallest count is at most `n / capacity` after `n` requests, so a
//!   key seen more often than that is always counted;
//! - at most `capacity` keys are held.
//!
//! **Stream summary.** Counters of equal count share a bucket; the buckets
//! form a list in increasing count. Counting one more moves a counter to
//! the next bucket (made if the next holds another count); the smallest
//! count is the first bucket's, so a new key finds its victim without a
//! scan. Counters and buckets live in two arenas, linked by index.

use std::collections::HashMap;

/// No link.
const NONE: usize = usize::MAX;

#[derive(Debug, Clone)]
struct Counter {
    key: String,
    count: u64,
    error: u64,
    bucket: usize,
    /// The other counters of its bucket.
    prev: usize,
    next: usize,
}

#[derive(Debug, Clone)]
struct Bucket {
    count: u64,
    /// Its first counter; `NONE` when the bucket is free.
    first: usize,
    /// The buckets of the next smaller and next larger counts.
    smaller: usize,
    larger: usize,
}

#[derive(Debug, Clone)]
pub struct StreamSummary {
    capacity: usize,
    index: HashMap<String, usize>,
    counters: Vec<Counter>,
    buckets: Vec<Bucket>,
    free_buckets: Vec<usize>,
    /// The bucket of the smallest count.
    smallest: usize,
}

impl StreamSummary {
    /// A summary of `capacity` counters (at least one).
    pub fn new(capacity: usize) -> StreamSummary {
        let capacity = capacity.max(1);
        StreamSummary {
            capacity,
            index: HashMap::with_capacity(capacity),
            counters: Vec::with_capacity(capacity),
            buckets: Vec::new(),
            free_buckets: Vec::new(),
            smallest: NONE,
        }
    }

    /// Counts one request for `key`: its count and error after it.
    pub fn observe(&mut self, key: &str) -> (u64, u64) {
        let c = match self.index.get(key) {
            Some(&c) => c,
            None if self.counters.len() < self.capacity => {
                let c = self.counters.len();
                self.counters.push(Counter {
                    key: key.to_string(),
                    count: 0,
                    error: 0,
                    bucket: NONE,
                    prev: NONE,
                    next: NONE,
                });
                self.index.insert(key.to_string(), c);
                // A count of 0 sits before every bucket.
                self.place(c, NONE, 1);
                return (1, 0);
            }
            None => {
                // The smallest count's first counter makes room; its count is
                // the new key's possible error.
                let c = self.buckets[self.smallest].first;
                let old = std::mem::replace(&mut self.counters[c].key, key.to_string());
                self.index.remove(&old);
                self.index.insert(key.to_string(), c);
                self.counters[c].error = self.counters[c].count;
                c
            }
        };
        self.increment(c);
        let counter = &self.counters[c];
        (counter.count, counter.error)
    }

    /// The count and error of `key`, if it is counted.
    pub fn get(&self, key: &str) -> Option<(u64, u64)> {
        self.index.get(key).map(|&c| (self.counters[c].count, self.counters[c].error))
    }

    /// How many keys are counted: at most the capacity.
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    /// Shifts every count and error right by `shift` (halves them `shift`
    /// times); keys counted down to nothing are dropped. Linear in the
    /// capacity: an ageing step, not a request's.
    pub fn shift_right(&mut self, shift: u32) {
        let mut kept: Vec<(String, u64, u64)> = std::mem::take(&mut self.counters)
            .into_iter()
            .map(|c| {
                (c.key, c.count.checked_shr(shift).unwrap_or(0), c.error.checked_shr(shift).unwrap_or(0))
            })
            .filter(|(_, count, _)| *count > 0)
            .collect();
        kept.sort_by_key(|(_, count, _)| *count);
        self.index.clear();
        self.buckets.clear();
        self.free_buckets.clear();
        self.smallest = NONE;
        let mut last = NONE;
        for (key, count, error) in kept {
            let c = self.counters.len();
            self.index.insert(key.clone(), c);
            self.counters.push(Counter { key, count: 0, error, bucket: NONE, prev: NONE, next: NONE });
            // Sorted: its bucket is the last one, or a new one after it.
            self.place(c, last, count);
            last = self.counters[c].bucket;
        }
    }

    /// Counts one more for counter `c`, which is in a bucket.
    fn increment(&mut self, c: usize) {
        let from = self.counters[c].bucket;
        let count = self.counters[c].count + 1;
        self.detach(c);
        // `from` stays linked until `place` has used it, then goes if empty.
        self.place(c, from, count);
        if self.buckets[from].first == NONE {
            self.unlink(from);
        }
    }

    /// Puts counter `c` (in no bucket) at `count`, in the bucket after
    /// `after` (the bucket of the next smaller count; `NONE`: before all)
    /// when it holds that count, else in a new one there.
    fn place(&mut self, c: usize, after: usize, count: u64) {
        let next = if after == NONE { self.smallest } else { self.buckets[after].larger };
        let bucket = match next {
            b if b != NONE && self.buckets[b].count == count => b,
            _ if after != NONE && self.buckets[after].count == count => after,
            _ => self.new_bucket(count, after, next),
        };
        let first = self.buckets[bucket].first;
        let counter = &mut self.counters[c];
        (counter.count, counter.bucket, counter.prev, counter.next) = (count, bucket, NONE, first);
        if first != NONE {
            self.counters[first].prev = c;
        }
        self.buckets[bucket].first = c;
    }

    /// A bucket of `count` between `smaller` and `larger`.
    fn new_bucket(&mut self, count: u64, smaller: usize, larger: usize) -> usize {
        let bucket = Bucket { count, first: NONE, smaller, larger };
        let b = match self.free_buckets.pop() {
            Some(b) => {
                self.buckets[b] = bucket;
                b
            }
            None => {
                self.buckets.push(bucket);
                self.buckets.len() - 1
            }
        };
        match smaller {
            NONE => self.smallest = b,
            s => self.buckets[s].larger = b,
        }
        if larger != NONE {
            self.buckets[larger].smaller = b;
        }
        b
    }

    /// Takes counter `c` out of its bucket's list.
    fn detach(&mut self, c: usize) {
        let Counter { bucket, prev, next, .. } = self.counters[c];
        match prev {
            NONE => self.buckets[bucket].first = next,
            p => self.counters[p].next = next,
        }
        if next != NONE {
            self.counters[next].prev = prev;
        }
    }

    /// Takes the empty bucket `b` out of the list, and frees it.
    fn unlink(&mut self, b: usize) {
        let Bucket { smaller, larger, .. } = self.buckets[b];
        match smaller {
            NONE => self.smallest = larger,
            s => self.buckets[s].larger = larger,
        }
        if larger != NONE {
            self.buckets[larger].smaller = smaller;
        }
        self.free_buckets.push(b);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    /// Every bucket's count is larger than the one before, each counter
    /// sits in the bucket of its count, and the index names every counter.
    fn assert_consistent(s: &StreamSummary) {
        let mut seen = 0;
        let (mut b, mut last) = (s.smallest, 0);
        while b != NONE {
            let bucket = &s.buckets[b];
            assert!(bucket.count > last, "buckets in increasing count");
            let mut c = bucket.first;
            assert_ne!(c, NONE, "no empty bucket in the list");
            while c != NONE {
                assert_eq!((s.counters[c].bucket, s.counters[c].count), (b, bucket.count));
                assert_eq!(s.index.get(&s.counters[c].key), Some(&c));
                seen += 1;
                c = s.counters[c].next;
            }
            last = bucket.count;
            b = bucket.larger;
        }
        assert_eq!((seen, s.index.len()), (s.counters.len(), s.counters.len()));
    }

    proptest! {
        /// Space-Saving's guarantees on any stream: at most `capacity`
        /// keys; a counted key's true count within `[count - error,
        /// count]`; every key seen more than `n / capacity` times counted;
        /// the counts add up to the stream's length; and after halving,
        /// the same bounds on the halved counts.
        #[test]
        fn the_counts_bound_the_true_ones(
            capacity in 1usize..12,
            stream in prop::collection::vec(prop_oneof![3 => 0u32..4, 1 => 0u32..200], 0..600),
            shift in 0u32..3,
        ) {
            let mut s = StreamSummary::new(capacity);
            let mut truth: HashMap<String, u64> = HashMap::new();
            for k in &stream {
                let key = k.to_string();
                let (count, error) = s.observe(&key);
                let n = truth.entry(key.clone()).or_default();
                *n += 1;
                prop_assert!(count - error <= *n && *n <= count, "{key}: {n} not in [{count} - {error}, {count}]");
            }
            assert_consistent(&s);
            prop_assert!(s.len() <= capacity);
            prop_assert_eq!(s.counters.iter().map(|c| c.count).sum::<u64>(), stream.len() as u64);
            let n = stream.len() as u64;
            for (key, &t) in &truth {
                if t > n / capacity as u64 {
                    prop_assert!(s.get(key).is_some(), "{key} seen {t} of {n} times, not counted");
                }
            }
            s.shift_right(shift);
            assert_consistent(&s);
            for (key, &t) in &truth {
                if let Some((count, error)) = s.get(key) {
                    // Each count rounds down alone: the lower bound by at most one.
                    prop_assert!(count - error <= (t >> shift) + 1 && (t >> shift) <= count, "{key} after halving");
                }
            }
        }
    }

    /// A new key takes the smallest count's counter and inherits its count
    /// as its error; keys of a larger count stay.
    #[test]
    fn a_new_key_replaces_the_smallest_count() {
        let mut s = StreamSummary::new(2);
        for _ in 0..3 {
            s.observe("heavy");
        }
        s.observe("light");
        assert_eq!(s.observe("new"), (2, 1), "light's count of 1 is its error");
        assert_eq!(s.get("light"), None);
        assert_eq!(s.get("heavy"), Some((3, 0)));
        assert_eq!(s.observe("heavy"), (4, 0));
    }
}
