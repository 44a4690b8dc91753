//! The shim's drain on SIGTERM, as the handlers and the waiters see it.
//!
//! 1. **Draining** ([`Drain::announce`]): `GET /healthz` answers 503
//!    `draining`, so a health-checking gateway stops sending new calls; the
//!    shim still accepts and serves everything for `--drain-delay-ms`.
//! 2. **Closing** ([`Drain::close`]): the listener is closed and every
//!    connection told to finish (HTTP/2 GOAWAY); the calls in flight are
//!    answered. A request waiting for its slot (egress `wait`) is served if
//!    its slot comes before the hold deadline, else refused with a
//!    `retry_after_ms`, its reservation or queue place given back to Redis
//!    before it answers.
//! 3. **Cleanup**: the process exits only once the Redis calls that give
//!    back a reservation or leave a queue (for clients that went away)
//!    have run ([`Drain::cleanup`], [`Drain::idle`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use tokio::sync::{watch, Notify};

#[derive(Default)]
pub struct Drain {
    draining: AtomicBool,
    /// The hold deadline once closing: no waiter is held past it.
    closing: watch::Sender<Option<Instant>>,
    /// Give-backs spawned and not yet finished.
    pending: AtomicUsize,
    finished: Notify,
}

impl Drain {
    /// Step 1: `/healthz` says draining from now on.
    pub fn announce(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Step 2: waiters are held no later than `hold_until`.
    pub fn close(&self, hold_until: Instant) {
        self.announce();
        self.closing.send_replace(Some(hold_until));
    }

    /// The hold deadline, once the drain closes the shim.
    pub fn hold_deadline(&self) -> Option<Instant> {
        *self.closing.borrow()
    }

    /// Completes when the drain closes the shim, with the hold deadline;
    /// never, while it serves.
    pub async fn closed(&self) -> Instant {
        let mut rx = self.closing.subscribe();
        let at = rx.wait_for(Option::is_some).await.ok().map(|at| at.unwrap_or_else(Instant::now));
        match at {
            Some(at) => at,
            None => std::future::pending().await,
        }
    }

    /// Counts a give-back task until the returned guard drops.
    pub fn cleanup(self: &std::sync::Arc<Self>) -> Cleanup {
        self.pending.fetch_add(1, Ordering::SeqCst);
        Cleanup(self.clone())
    }

    /// Completes once no give-back task runs.
    pub async fn idle(&self) {
        loop {
            let finished = self.finished.notified();
            if self.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            finished.await;
        }
    }

    /// Give-back tasks still running.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }
}

/// One running give-back task (see [`Drain::cleanup`]).
pub struct Cleanup(std::sync::Arc<Drain>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.finished.notify_waiters();
        }
    }
}
