//! Waking the root context at once, from a stream's callback: the VM's own
//! shared queue, which the root registers (its name holds the VM's random
//! seed, so each worker's root has its own). Enqueueing a byte makes the
//! host call the root's `on_queue_ready` on the worker's next turn of its
//! event loop, well inside the 1 ms the shortest tick takes.
//!
//! The root sends what must outlive a stream (a stream's calls end with
//! it): the calls a stream leaves (a lease's release, a settlement), due
//! at once, since a freed lease is a waiter's place; and shared callouts'
//! batches, due when a stream's lone check returns with checks queued
//! behind it.

use std::cell::Cell;

use crate::abi;

#[derive(Default)]
pub struct Wake {
    /// The root's queue; `None`: not registered (the tick does the work).
    queue: Cell<Option<u32>>,
    /// A byte is in the queue that the root has not read yet.
    rung: Cell<bool>,
}

impl Wake {
    /// From the root's context: the queue `sluice-wake-SEED`.
    pub fn register(&self, seed: u64) {
        match abi::register_shared_queue(&format!("sluice-wake-{seed:016x}")) {
            Ok(queue) => self.queue.set(Some(queue)),
            Err(status) => log::debug!("no wake-up queue ({status:?}): the tick sends queued checks"),
        }
    }

    /// Asks for the root's `on_queue_ready`, once until it comes.
    pub fn ring(&self) {
        let Some(queue) = self.queue.get() else { return };
        if self.rung.get() {
            return;
        }
        match abi::enqueue_shared_queue(queue, b"w") {
            Ok(()) => self.rung.set(true),
            Err(status) => log::debug!("cannot wake the root ({status:?}): the tick sends queued checks"),
        }
    }

    /// In the root's `on_queue_ready`: whether it is this queue; if so the
    /// queue is emptied and may ring again.
    pub fn answered(&self, queue: u32) -> bool {
        if self.queue.get() != Some(queue) {
            return false;
        }
        while let Ok(true) = abi::dequeue_shared_queue(queue) {}
        self.rung.set(false);
        true
    }
}
