//! Space-Saving (Metwally, Agrawal and El Abbadi, 2005): the heaviest
//! hitters of a stream in a fixed number of counters.
//!
//! At most `capacity` keys are kept. A key already kept counts one more; a
//! new key takes a free counter, or else replaces the key with the smallest
//! count and starts from that count plus one, remembering the count it
//! inherited as its `error`. So a kept key's true count lies between
//! `count - error` and `count`, and every key seen more than `n / capacity`
//! times out of `n` is kept. Memory never grows past `capacity` keys.
//!
//! [`SpaceSaving::halve`] ages the counts, so that the keys busy lately
//! outrank those that were busy long ago.

use std::collections::HashMap;

/// The count of a kept key, and how much of it may belong to keys it replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    pub count: u64,
    pub error: u64,
}

#[derive(Debug)]
pub struct SpaceSaving {
    capacity: usize,
    counters: HashMap<String, Estimate>,
}

impl SpaceSaving {
    /// A sketch of `capacity` counters (at least one).
    pub fn new(capacity: usize) -> SpaceSaving {
        let capacity = capacity.max(1);
        SpaceSaving { capacity, counters: HashMap::with_capacity(capacity) }
    }

    /// Counts one occurrence of `key`.
    pub fn add(&mut self, key: &str) {
        self.add_n(key, 1);
    }

    /// Counts `n` occurrences of `key` at once (weighted Space-Saving: a
    /// new key starts from the smallest count plus `n`).
    pub fn add_n(&mut self, key: &str, n: u64) {
        if let Some(estimate) = self.counters.get_mut(key) {
            estimate.count = estimate.count.saturating_add(n);
            return;
        }
        let mut inherited = 0;
        if self.counters.len() >= self.capacity {
            // Linear in the capacity: a few dozen counters, only for a key not kept.
            let smallest =
                self.counters.iter().min_by_key(|(_, e)| e.count).map(|(k, e)| (k.clone(), e.count));
            if let Some((key, count)) = smallest {
                self.counters.remove(&key);
                inherited = count;
            }
        }
        self.counters
            .insert(key.to_string(), Estimate { count: inherited.saturating_add(n), error: inherited });
    }

    /// Halves every count and error: older traffic weighs half as much. A
    /// key halved to nothing is forgotten (a busy key has been checked).
    pub fn halve(&mut self) {
        self.counters.retain(|_, estimate| {
            estimate.count /= 2;
            estimate.error /= 2;
            estimate.count > 0
        });
    }

    /// The `n` keys with the highest counts, highest first (ties by key).
    pub fn top(&self, n: usize) -> Vec<(String, Estimate)> {
        let mut all: Vec<(String, Estimate)> = self.counters.iter().map(|(k, e)| (k.clone(), *e)).collect();
        all.sort_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }

    pub fn len(&self) -> usize {
        self.counters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(sketch: &SpaceSaving) -> Vec<(String, u64, u64)> {
        sketch.top(usize::MAX).into_iter().map(|(k, e)| (k, e.count, e.error)).collect()
    }

    #[test]
    fn exact_while_there_is_room() {
        let mut sketch = SpaceSaving::new(3);
        for key in ["a", "b", "a", "c", "a", "b"] {
            sketch.add(key);
        }
        assert_eq!(counts(&sketch), [("a".into(), 3, 0), ("b".into(), 2, 0), ("c".into(), 1, 0)]);
    }

    #[test]
    fn a_new_key_replaces_the_smallest_and_inherits_its_count() {
        let mut sketch = SpaceSaving::new(2);
        for key in ["a", "a", "a", "b", "c"] {
            sketch.add(key);
        }
        // c replaced b (count 1): its count 2 may hold 1 of b's.
        assert_eq!(counts(&sketch), [("a".into(), 3, 0), ("c".into(), 2, 1)]);
    }

    #[test]
    fn memory_is_bounded_and_heavy_hitters_stay() {
        let mut sketch = SpaceSaving::new(8);
        for i in 0..10_000 {
            // One heavy key among 10,000 distinct light ones.
            sketch.add("heavy");
            sketch.add(&format!("light-{i}"));
        }
        assert_eq!(sketch.len(), 8);
        let top = sketch.top(1);
        assert_eq!(top[0].0, "heavy");
        let e = top[0].1;
        assert!(e.count - e.error <= 10_000 && 10_000 <= e.count, "{e:?}");
    }

    #[test]
    fn halving_lets_new_traffic_outrank_old() {
        let mut sketch = SpaceSaving::new(4);
        for _ in 0..10 {
            sketch.add("old");
        }
        sketch.halve();
        sketch.halve();
        for _ in 0..4 {
            sketch.add("new");
        }
        assert_eq!(counts(&sketch), [("new".into(), 4, 0), ("old".into(), 2, 0)]);
    }

    #[test]
    fn a_key_halved_to_nothing_is_forgotten() {
        let mut sketch = SpaceSaving::new(4);
        sketch.add("once");
        for _ in 0..3 {
            sketch.add("thrice");
        }
        sketch.halve();
        assert_eq!(counts(&sketch), [("thrice".into(), 1, 0)], "no key shown with 0 checks");
        sketch.halve();
        assert!(sketch.is_empty());
    }
}
