//! When the worker next needs a tick ([`crate::Worker::poll_timeout`]) is
//! asked after every event, and changes on few of them: so it is kept, not
//! computed each time. The parts of the worker it depends on are
//! [`Watched`]: read freely, changed only through [`Watched::change`],
//! which marks the kept time stale when what the time reads of the part
//! ([`Timing::seen`]) moved; the next poll computes it again from every
//! part. A poll stays a query of the state: the kept time is always the one
//! a computation would give.

use std::cell::{Cell, Ref, RefCell};

/// A part of the worker that its next tick depends on: `seen` is all the
/// worker's due time reads of it.
pub(crate) trait Timing {
    type Seen: PartialEq;
    fn seen(&self) -> Self::Seen;
}

/// The worker's next due time as last computed (`None` when stale), and
/// how many times it went stale.
#[derive(Default)]
pub(crate) struct Due {
    kept: Cell<Option<Option<u64>>>,
    moves: Cell<u32>,
}

impl Due {
    /// Something it depends on changed: computed again on the next poll.
    pub(crate) fn stale(&self) {
        self.kept.set(None);
        self.moves.set(self.moves.get().wrapping_add(1));
    }

    /// The kept time, or `compute`d and kept when stale.
    pub(crate) fn get(&self, compute: impl FnOnce() -> Option<u64>) -> Option<u64> {
        if let Some(due) = self.kept.get() {
            return due;
        }
        let due = compute();
        self.kept.set(Some(due));
        due
    }

    /// How many times it went stale: while this is the same, so is the time.
    pub(crate) fn moves(&self) -> u32 {
        self.moves.get()
    }
}

/// A part of the worker that its due time depends on.
pub(crate) struct Watched<T>(RefCell<T>);

impl<T: Timing> Watched<T> {
    pub(crate) fn new(value: T) -> Watched<T> {
        Watched(RefCell::new(value))
    }

    pub(crate) fn borrow(&self) -> Ref<'_, T> {
        self.0.borrow()
    }

    /// Changes the part with `change`; `due` goes stale if what it reads
    /// of the part moved.
    pub(crate) fn change<R>(&self, due: &Due, change: impl FnOnce(&mut T) -> R) -> R {
        let mut value = self.0.borrow_mut();
        let before = value.seen();
        let out = change(&mut value);
        if value.seen() != before {
            due.stale();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use sluice_policies::units::Millis;
    use sluice_policies::wire::{Check, Encoding, RenewRequest, WireLimit};

    use crate::effect::{CallId, CallResult, Deferred, Effect, Outgoing};
    use crate::testing::FakeHost;
    use crate::Worker;

    /// A leased policy (its pools' tick), one that sheds (its reports), a
    /// plain one (failure-mode passes, cache denials); shared callouts, a
    /// breaker that opens after two failures.
    const DOC: &str = r#"{"shim": {"shared_calls": 1, "failure_threshold": 2, "cooldown_ms": 500, "timeout_ms": 100},
        "classes": [{"name": "critical"}, {"name": "batch"}],
        "policies": [
          {"name": "leased", "leased": {"tokens": 10, "ttl": "2s"},
           "limits": [{"type": "fixed_window", "limit": 100, "window": "1m"}]},
          {"name": "shed", "shed": {"signal": {"header": "x-load"}},
           "limits": [{"type": "concurrency", "limit": 100, "lease": "3s"}]},
          {"name": "plain", "limits": [{"type": "interval", "every": "1s"}]}]}"#;

    /// Everything that changes what the worker waits for.
    #[derive(Debug, Clone)]
    enum Step {
        Advance(u64),
        Defer,
        Tick,
        /// The answer to the worker's `n`th call out (of those not yet answered).
        Answer(usize, bool),
        CallAllowed,
        CallEnded(bool),
        FailurePassed(usize),
        CacheDenied(usize),
        Hold(u8, u64),
        End(u8),
        Observe(u8),
        Offer(u32),
        LoneEnded,
        StreamEnded(u32),
        PollBatch,
        BatchAnswered(usize),
        PollAnswers,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u64..1_500).prop_map(Step::Advance),
            Just(Step::Defer),
            Just(Step::Tick),
            (0usize..4, any::<bool>()).prop_map(|(n, ok)| Step::Answer(n, ok)),
            Just(Step::CallAllowed),
            any::<bool>().prop_map(Step::CallEnded),
            (0usize..3).prop_map(Step::FailurePassed),
            (0usize..3).prop_map(Step::CacheDenied),
            (0u8..3, 3u64..5_000).prop_map(|(l, ms)| Step::Hold(l, ms)),
            (0u8..3).prop_map(Step::End),
            (0u8..=100).prop_map(Step::Observe),
            (0u32..3).prop_map(Step::Offer),
            Just(Step::LoneEnded),
            (0u32..3).prop_map(Step::StreamEnded),
            Just(Step::PollBatch),
            (0usize..2).prop_map(Step::BatchAnswered),
            Just(Step::PollAnswers),
        ]
    }

    fn renewal(lease: u8, lease_ms: u64) -> RenewRequest {
        let check = Check {
            policy: "shed".into(),
            key: "k".into(),
            limits: vec![WireLimit::Concurrency { limit: 3, lease_ms: Millis(lease_ms) }],
            margin_ms: None,
            upstream: false,
            levels: Vec::new(),
        };
        RenewRequest { lease: format!("L{lease}"), checks: vec![check] }
    }

    fn sends(effects: Vec<Effect>, out: &mut Vec<CallId>) {
        out.extend(effects.into_iter().filter_map(|e| match e {
            Effect::Send(call) => Some(call.id),
            _ => None,
        }));
    }

    proptest! {
        /// After any sequence of changes to what the worker waits for, with
        /// polls between some of them, the kept due time is the one
        /// computed from every part: nothing that moves it leaves it stale.
        #[test]
        fn the_kept_due_time_is_the_computed_one(
            steps in prop::collection::vec((step(), any::<bool>()), 0..60),
        ) {
            let doc = sluice_policies::parse(DOC).expect("doc");
            let host = FakeHost::at(1_000_000);
            let worker = Worker::new(doc, host.now.get(), 7);
            let (mut calls, mut batches, mut offered) = (Vec::new(), Vec::new(), 0u32);
            for (step, poll) in steps {
                let now = host.now.get();
                match step {
                    Step::Advance(ms) => host.advance(ms),
                    Step::Defer => worker.defer(Deferred {
                        path: "/v1/release",
                        body: b"{}".to_vec(),
                        releases: vec![1],
                        settles: Vec::new(),
                    }),
                    Step::Tick => sends(worker.tick(&host.now(), &host), &mut calls),
                    Step::Answer(n, ok) => {
                        if n < calls.len() {
                            let id = calls.remove(n);
                            let result = if ok {
                                CallResult::Answered { status: Some(b"200".to_vec()), body: Some(br#"{"level":1}"#.to_vec()) }
                            } else {
                                CallResult::NotSent("down".into())
                            };
                            sends(worker.handle_answer(&host.now(), id, result, &host), &mut calls);
                        }
                    }
                    Step::CallAllowed => {
                        worker.call_allowed(now, &mut crate::effect::Effects::default());
                    }
                    Step::CallEnded(ok) => {
                        worker.call_ended(ok, now.saturating_sub(10), now, &mut crate::effect::Effects::default())
                    }
                    Step::FailurePassed(index) => worker.failure_passed(index),
                    Step::CacheDenied(index) => worker.cache_denied(index),
                    Step::Hold(lease, ms) => worker.change_live(|live| live.hold(renewal(lease, ms), now)),
                    Step::End(lease) => worker.change_live(|live| live.end(&format!("L{lease}"))),
                    Step::Observe(load) => {
                        worker.change_shedding(|s| s.observe(1, f64::from(load) / 100.0))
                    }
                    Step::Offer(stream) => {
                        offered += 1;
                        let call = Outgoing {
                            id: CallId(offered),
                            path: "/v1/check",
                            encoding: Encoding::Json,
                            body: vec![1, 2, 3],
                            timeout_ms: 100,
                            shared: true,
                        };
                        worker.change_sharing(|s| s.offer(stream, call, now));
                    }
                    Step::LoneEnded => worker.change_sharing(|s| s.lone_ended()),
                    Step::StreamEnded(stream) => {
                        worker.change_sharing(|s| s.stream_ended(stream));
                    }
                    Step::PollBatch => {
                        if let Some(batch) = worker.change_sharing(|s| s.poll_batch(now)) {
                            batches.push(batch.id);
                        }
                    }
                    Step::BatchAnswered(n) => {
                        if n < batches.len() {
                            let id = batches.remove(n);
                            let result = CallResult::Answered { status: None, body: None };
                            worker.change_sharing(|s| s.batch_answered(id, result));
                        }
                    }
                    Step::PollAnswers => {
                        worker.change_sharing(|s| s.poll_answers(now));
                    }
                }
                if poll {
                    prop_assert_eq!(worker.poll_timeout(), worker.next_due(), "after {:?}", step);
                }
            }
            prop_assert_eq!(worker.poll_timeout(), worker.next_due());
        }
    }
}
