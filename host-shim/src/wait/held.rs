//! The requests a shim holds for their time slots, by id, and why a hold
//! ends before its slot: a release for the id (its client went away), or a
//! late send ahead of it that pushed it past its deadline. The send's own
//! shim learns of the push from `lua/scripts/confirm.lua`'s reply, every
//! other shim from the same call's PUBLISH on
//! [`PUSHED_CHANNEL`](sluice_policies::algorithm::confirm::PUSHED_CHANNEL)
//! (`wakeups`); whichever comes first ends the hold, the other finds it
//! gone.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// The requests a shim holds for their time slots, by id.
#[derive(Default)]
pub struct Held(Mutex<HashMap<String, oneshot::Sender<Ended>>>);

/// Why a hold ends before its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// A release for its id: its client went away.
    Released,
    /// A late send ahead of it (confirmed by any shim) pushed it past its
    /// deadline and dropped it from the chain: refused now, told this wait
    /// (µs) as its retry-after.
    Pushed(u64),
}

/// One held request's registration; dropping it forgets the id.
pub(crate) struct Holding<'a> {
    held: &'a Held,
    id: String,
    pub(crate) released: oneshot::Receiver<Ended>,
}

impl Held {
    fn map(&self) -> MutexGuard<'_, HashMap<String, oneshot::Sender<Ended>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn hold(&self, id: &str) -> Holding<'_> {
        let (tx, released) = oneshot::channel();
        self.map().insert(id.to_string(), tx);
        Holding { held: self, id: id.to_string(), released }
    }

    /// Ends the hold of request `id`, if this shim holds it.
    pub(crate) fn cancel(&self, id: &str) {
        self.end(id, Ended::Released);
    }

    /// Ends the hold of request `id`, if this shim holds it: a send pushed
    /// it past its deadline; `wait_us`, the wait it would have had.
    pub(crate) fn push_out(&self, id: &str, wait_us: u64) {
        self.end(id, Ended::Pushed(wait_us));
    }

    fn end(&self, id: &str, why: Ended) {
        if let Some(tx) = self.map().remove(id) {
            let _ = tx.send(why);
        }
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.held.map().remove(&self.id);
    }
}
