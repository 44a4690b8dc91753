//! What one VM (one Envoy worker) shares between its requests: the
//! [`Worker`] and the stats. The root context makes it; each stream holds it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;

use sluice_core::{CallId, CallResult, Now, Worker};

use crate::host::ProxyHost;
use crate::stats::Stats;
use crate::ticker::Ticker;
use crate::wake::Wake;

/// How long a stream whose headers are held for its body may wait for the
/// body's first callback before the root lets its headers go (see
/// [`Vm::unheld`]).
pub const BODY_WAIT_MS: u64 = 500;

pub struct Vm {
    pub worker: Rc<Worker>,
    pub stats: Stats,
    /// Streams whose headers are held while their body is read, which have
    /// had no body callback yet.
    reading: RefCell<Reading>,
    /// The host has been seen not to hand over a body while its headers are
    /// held (an Envoy without `allow_on_headers_stop_iteration`).
    pub no_body_while_held: Cell<bool>,
    /// Streams whose response is to end at the next tick, once the bytes
    /// their last callback handed on have gone (`Effect::EndResponse`).
    ending: RefCell<Vec<u32>>,
    /// The root's timer.
    pub ticker: Ticker,
    /// The worker's `due_moves` when the timer was last armed for what is
    /// due; `None` once the VM's own waits (`reading`, `ending`) changed.
    /// While it holds, arming again would set nothing.
    armed_for: Cell<Option<u32>>,
    /// Streams with a check in the worker's queue or in a batch out, by
    /// context id: the root hands each its answer (until the stream ends).
    pub shared: RefCell<HashMap<u32, Rc<RefCell<dyn SharingStream>>>>,
    /// Wakes the root at once when checks queued for a batch are due.
    pub wake: Wake,
}

/// A stream with a check in the worker's queue or in a batch out, as the
/// root reaches it (the filter's state of the stream).
pub trait SharingStream {
    /// The result of the stream's call `call`, from a batch's answer.
    fn resume(&mut self, vm: &Vm, id: u32, call: CallId, result: CallResult, now: &Now, host: &ProxyHost);
    /// Whether the host's call `token` is the stream's.
    fn owns(&self, token: u32) -> bool;
    /// What became of the stream's call `token`.
    fn answered(&mut self, vm: &Vm, id: u32, token: u32, result: CallResult, now: &Now, host: &ProxyHost);
}

impl Vm {
    pub fn new(worker: Rc<Worker>, stats: Stats) -> Vm {
        Vm {
            worker,
            stats,
            reading: RefCell::new(Reading::default()),
            no_body_while_held: Cell::new(false),
            ending: RefCell::new(Vec::new()),
            ticker: Ticker::default(),
            armed_for: Cell::new(None),
            shared: RefCell::new(HashMap::new()),
            wake: Wake::default(),
        }
    }

    /// A stream's lone check ended (answered, failed or cancelled): the
    /// checks queued behind it go out now, from the root, woken at once
    /// rather than at its next tick.
    pub fn lone_ended(&self) {
        self.worker.change_sharing(|s| s.lone_ended());
        if self.worker.sharing().batch_due() {
            self.wake.ring();
        }
    }

    /// When the root next needs a tick: a response to end (at once), the
    /// worker's next work, a body wait that ends. O(1): each part keeps its
    /// earliest time.
    pub fn next_due(&self) -> Option<u64> {
        if !self.ending.borrow().is_empty() {
            return Some(0);
        }
        let worker = self.worker.poll_timeout();
        match (worker, self.reading.borrow().due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// After an event at `now`: the tick brought forward if it made
    /// something due sooner. Nothing to do when nothing it waits for
    /// changed since the timer was armed: the same due time arms nothing.
    pub fn arm(&self, now: &Now) {
        let moves = self.worker.due_moves();
        if self.armed_for.get() == Some(moves) {
            return;
        }
        set_tick_period(self.ticker.arm(self.next_due(), now));
        self.armed_for.set(Some(moves));
    }

    /// After a tick at `now` (or the configuration): the next one armed.
    pub fn ticked(&self, now: u64) {
        set_tick_period(self.ticker.ticked(self.next_due(), now));
        self.armed_for.set(Some(self.worker.due_moves()));
    }

    /// Stream `id`'s response is to end at the next tick.
    pub fn end_response(&self, id: u32) {
        self.ending.borrow_mut().push(id);
        self.armed_for.set(None);
    }

    /// Stream `id` ended: no response of it to end.
    pub fn ended(&self, id: u32) {
        let mut ending = self.ending.borrow_mut();
        if !ending.is_empty() {
            ending.retain(|&e| e != id);
            self.armed_for.set(None);
        }
    }

    /// The responses to end now, taken off the list.
    pub fn take_ending(&self) -> Vec<u32> {
        self.armed_for.set(None);
        std::mem::take(&mut *self.ending.borrow_mut())
    }

    /// The streams held for their body longer than [`BODY_WAIT_MS`] with no
    /// body callback, taken off the list: a host that converts a filter's
    /// `StopIteration` on headers into stopping everything never calls the
    /// body callback until the headers go on, so the root resumes them
    /// (their headers go upstream before the decision, their body is still
    /// held until it).
    pub fn unheld(&self, now: u64) -> Vec<u32> {
        self.armed_for.set(None);
        self.reading.borrow_mut().take(|(_, since)| now.saturating_sub(*since) >= BODY_WAIT_MS)
    }

    /// Stream `id`'s headers are held from `now` while its body is read,
    /// until its first body callback.
    pub fn reading_body(&self, id: u32, now: u64) {
        self.reading.borrow_mut().push(id, now);
        self.armed_for.set(None);
    }

    /// Stream `id` has had its body callback (or ended).
    pub fn body_came(&self, id: u32) {
        let mut reading = self.reading.borrow_mut();
        if !reading.streams.is_empty() {
            reading.take(|(c, _)| *c == id);
            self.armed_for.set(None);
        }
    }
}

/// Streams whose headers are held while their body is read, which have
/// had no body callback yet: (context id, since when, ms); and the
/// earliest of those times, kept.
#[derive(Default)]
struct Reading {
    streams: Vec<(u32, u64)>,
    earliest: Option<u64>,
}

impl Reading {
    fn push(&mut self, id: u32, since: u64) {
        self.streams.push((id, since));
        self.earliest = Some(self.earliest.map_or(since, |at| at.min(since)));
    }

    /// When the first of their body waits ends.
    fn due(&self) -> Option<u64> {
        self.earliest.map(|since| since + BODY_WAIT_MS)
    }

    /// The streams `gone` says, taken off the list.
    fn take(&mut self, gone: impl Fn(&(u32, u64)) -> bool) -> Vec<u32> {
        let mut taken = Vec::new();
        self.streams.retain(|s| {
            let out = gone(s);
            if out {
                taken.push(s.0);
            }
            !out
        });
        if !taken.is_empty() {
            self.earliest = self.streams.iter().map(|(_, since)| *since).min();
        }
        taken
    }
}

/// Sets the root's tick period, if there is one to set.
fn set_tick_period(period_ms: Option<u64>) {
    let Some(period) = period_ms else { return };
    if let Err(status) = hostcalls::set_tick_period(Duration::from_millis(period)) {
        log::warn!("cannot set the tick period: {status:?}; leases will be reclaimed by TTL");
    }
}
