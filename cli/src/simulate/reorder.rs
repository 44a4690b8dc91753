//! The reorder buffer: an access log's lines come in the order requests
//! *ended*, and the replay needs them in the order they *started*. A line is
//! held in a min-heap on its start time until the newest start time seen is
//! `window` past it, then released; so memory holds the lines of one window,
//! whatever the file's length. A line that starts before one already released
//! (it ended more than `window` after later-starting requests began) cannot
//! be put back in order: it is refused as late, for the caller to count.
//! Lines with equal start times keep their order in the file.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

pub(crate) struct Reorder<T> {
    window_us: u64,
    heap: BinaryHeap<Reverse<Held<T>>>,
    /// The newest start time pushed so far.
    newest_us: Option<u64>,
    /// The start time of the last line released: nothing earlier may follow.
    released_us: Option<u64>,
    sequence: u64,
}

/// A line that came after the window: it starts before `released_us`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Late;

struct Held<T> {
    at_us: u64,
    sequence: u64,
    item: T,
}

impl<T> PartialEq for Held<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.at_us, self.sequence) == (other.at_us, other.sequence)
    }
}
impl<T> Eq for Held<T> {}
impl<T> PartialOrd for Held<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Held<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at_us, self.sequence).cmp(&(other.at_us, other.sequence))
    }
}

impl<T> Reorder<T> {
    pub(crate) fn new(window_us: u64) -> Reorder<T> {
        Reorder { window_us, heap: BinaryHeap::new(), newest_us: None, released_us: None, sequence: 0 }
    }

    /// Holds `item`, which started at `at_us`; `Late` if it can no longer be
    /// replayed in order.
    pub(crate) fn push(&mut self, at_us: u64, item: T) -> Result<(), Late> {
        if self.released_us.is_some_and(|released| at_us < released) {
            return Err(Late);
        }
        self.newest_us = Some(self.newest_us.map_or(at_us, |newest| newest.max(at_us)));
        self.sequence += 1;
        self.heap.push(Reverse(Held { at_us, sequence: self.sequence, item }));
        Ok(())
    }

    /// The earliest held line, once the newest start is `window` past it.
    pub(crate) fn pop_ready(&mut self) -> Option<T> {
        let Reverse(earliest) = self.heap.peek()?;
        let newest = self.newest_us?;
        if newest.saturating_sub(earliest.at_us) < self.window_us {
            return None;
        }
        self.release()
    }

    /// The earliest held line, whatever the window: at the end of the log.
    pub(crate) fn pop_any(&mut self) -> Option<T> {
        self.release()
    }

    /// How many lines are held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    fn release(&mut self) -> Option<T> {
        let Reverse(held) = self.heap.pop()?;
        self.released_us = Some(held.at_us);
        Some(held.item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn ready(r: &mut Reorder<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| r.pop_ready()).collect()
    }

    /// Lines out of start order within the window come out sorted, each
    /// once the newest start is a full window past it.
    #[test]
    fn lines_within_the_window_come_out_in_start_order() {
        let mut r = Reorder::new(60 * S);
        assert_eq!(r.push(10 * S, "b"), Ok(()));
        assert_eq!(r.push(5 * S, "a"), Ok(()));
        assert_eq!(r.push(40 * S, "c"), Ok(()));
        assert!(ready(&mut r).is_empty(), "newest 40 s: nothing is 60 s old");
        assert_eq!(r.push(65 * S, "d"), Ok(()));
        assert_eq!(ready(&mut r), ["a"], "65 - 5 = 60: a goes; 65 - 10 < 60: b stays");
        assert_eq!(r.push(70 * S, "e"), Ok(()));
        assert_eq!(ready(&mut r), ["b"]);
        assert_eq!(r.len(), 3);
        assert_eq!(std::iter::from_fn(|| r.pop_any()).collect::<Vec<_>>(), ["c", "d", "e"]);
    }

    /// A line that starts before one already released is late, and
    /// refused; one at or after it is still taken.
    #[test]
    fn a_line_behind_a_released_one_is_late() {
        let mut r = Reorder::new(60 * S);
        r.push(100 * S, "a").expect("first");
        r.push(170 * S, "b").expect("in order");
        assert_eq!(ready(&mut r), ["a"]);
        assert_eq!(r.push(99 * S, "late"), Err(Late));
        assert_eq!(r.push(100 * S, "tie"), Ok(()), "the same start as the released line is in order");
        assert_eq!(r.push(120 * S, "c"), Ok(()), "behind the newest, but nothing later was released");
        assert_eq!(ready(&mut r), ["tie"], "170 - 120 < 60: c waits");
        assert_eq!(r.push(180 * S, "d"), Ok(()));
        assert_eq!(ready(&mut r), ["c"]);
    }

    /// Equal start times keep the file's order.
    #[test]
    fn ties_keep_file_order() {
        let mut r = Reorder::new(0);
        for item in ["1", "2", "3"] {
            r.push(7 * S, item).expect("in order");
        }
        assert_eq!(std::iter::from_fn(|| r.pop_any()).collect::<Vec<_>>(), ["1", "2", "3"]);
    }

    /// A zero window replays in file order and refuses anything earlier
    /// than what came before it.
    #[test]
    fn a_zero_window_releases_at_once() {
        let mut r = Reorder::new(0);
        r.push(5 * S, "a").expect("first");
        assert_eq!(ready(&mut r), ["a"]);
        assert_eq!(r.push(4 * S, "b"), Err(Late));
        assert_eq!(r.len(), 0);
    }
}
