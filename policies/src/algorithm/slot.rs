//! One limit's earliest slot on the waiting path, and its charge there:
//! what each time-based algorithm gives `reserve` (its own module, so that
//! `reserve` uses the algorithms and they do not reach back into it).

use super::{State, View};

/// One limit's earliest slot.
pub struct Slot {
    /// `None`: the limit never admits the request.
    pub at: Option<u64>,
    /// What the limit admits at `now`, without the request.
    pub remaining_now: u64,
    /// The state with its expired entries removed, stored whatever the decision.
    pub pruned: Option<State>,
    /// Charges the request at `t >= at`.
    pub commit: Box<dyn Fn(u64) -> Committed>,
}

pub struct Committed {
    pub state: State,
    /// The limit seen from `t`, the request charged.
    pub view: View,
    pub held_until: Option<u64>,
    /// More keys to store, by their suffix to the limit's key (a bucket's
    /// held reservations and its sends' `tat`).
    pub extra: Vec<(String, State)>,
}
