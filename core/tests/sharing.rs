//! Shared callouts never change a request's decision. Requests come, calls
//! return or fail, time passes and streams end in random orders on a worker
//! that shares its check calls; a model shim decides each check it receives
//! on counters (two policies, all or nothing). Then the same checks are sent
//! one by one, in the order the shim received them, each answered at once or
//! failed as its call was: every request that got a decision gets the same
//! one (admitted, refused, or its failure mode), and none waited longer than
//! its `timeout_ms` for it. A check whose stream ended while it was queued
//! is never sent, and at most the set number of calls is ever out.

mod support;

use std::collections::HashMap;

use proptest::prelude::*;
use serde_json::json;
use sluice_core::flow::CHECK_ENCODING;
use sluice_core::{CallResult, Outgoing, Phase};
use sluice_policies::wire::{
    Answered, BatchAnswer, CheckBatch, CheckRequest, CheckResponse, WireLimit, BATCH_PATH, CHECK_PATH,
};
use support::*;

const TIMEOUT_MS: u64 = 100;

fn doc(shared_calls: u32, failure_mode: &str) -> String {
    json!({
        "shim": {"shared_calls": shared_calls, "failure_threshold": 0, "timeout_ms": TIMEOUT_MS},
        "over_limit_cache_slots": 0,
        "failure_mode": failure_mode,
        "policies": [
            {"name": "per-user", "key": ["header:x-user"],
             "limits": [{"type": "fixed_window", "limit": 3, "window": "1h"}]},
            {"name": "all", "limits": [{"type": "fixed_window", "limit": 9, "window": "1h"}]}
        ]
    })
    .to_string()
}

/// The shim, as counters: a request is admitted, and charged, only if every
/// limit of every check allows it.
#[derive(Default)]
struct Model {
    counts: HashMap<(String, String), u32>,
}

impl Model {
    fn decide(&mut self, body: &[u8]) -> CallResult {
        let req: CheckRequest = CHECK_ENCODING.decode(body).expect("a check");
        let limit = |l: &WireLimit| match l {
            WireLimit::FixedWindow { limit, .. } => *limit,
            other => panic!("not in this test: {other:?}"),
        };
        let count = |c: &sluice_policies::wire::Check| {
            *self.counts.get(&(c.policy.clone(), c.key.clone())).unwrap_or(&0)
        };
        let allowed = req.checks.iter().all(|c| c.limits.iter().all(|l| count(c) < limit(l)));
        let checks: Vec<_> = req
            .checks
            .iter()
            .map(|c| {
                let limits: Vec<_> = c
                    .limits
                    .iter()
                    .map(|l| {
                        let ok = count(c) < limit(l);
                        json!({"allowed": ok, "remaining": limit(l).saturating_sub(count(c) + 1),
                               "reset_ms": 1000, "retry_after_ms": if ok {0} else {1000}})
                    })
                    .collect();
                json!({ "limits": limits })
            })
            .collect();
        if allowed {
            for c in req.checks.iter() {
                *self.counts.entry((c.policy.clone(), c.key.clone())).or_default() += 1;
            }
        }
        let answer =
            json!({"allowed": allowed, "retry_after_ms": if allowed {0} else {1000}, "checks": checks});
        let answer: CheckResponse = serde_json::from_value(answer).expect("an answer");
        let body = CHECK_ENCODING.encode(&answer).expect("encodes");
        CallResult::Answered { status: Some(b"200".to_vec()), body: Some(body) }
    }
}

/// How a call ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Answered.
    None,
    /// 503 before any check was decided.
    Unavailable,
    /// Decided by the shim, but the answer was lost (reset, or timed out).
    Lost,
}

impl Fault {
    /// What the call of a check that the shim decided (or not) gives.
    fn result(self, model: &mut Model, body: &[u8]) -> CallResult {
        match self {
            Fault::None => model.decide(body),
            Fault::Unavailable => {
                CallResult::Answered { status: Some(b"503".to_vec()), body: Some(b"down".to_vec()) }
            }
            Fault::Lost => {
                model.decide(body);
                CallResult::Answered { status: None, body: None }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Arrive { user: u8 },
    Return { pick: usize, fault: Fault },
    Advance { ms: u64 },
    End { pick: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let fault = prop_oneof![6 => Just(Fault::None), 1 => Just(Fault::Unavailable), 1 => Just(Fault::Lost)];
    prop_oneof![
        4 => (0u8..4).prop_map(|user| Op::Arrive { user }),
        4 => (any::<usize>(), fault).prop_map(|(pick, fault)| Op::Return { pick, fault }),
        1 => (1u64..60).prop_map(|ms| Op::Advance { ms }),
        1 => any::<usize>().prop_map(|pick| Op::End { pick }),
    ]
}

/// A call out on the host: a stream's lone check, or the worker's batch.
struct Out {
    call: Outgoing,
    lone: Option<usize>,
    sent_ms: u64,
}

/// What became of a request: its phase and the status of its reply, if refused.
type Decision = (Phase, Option<u16>);

/// The shared run, as an adapter drives it: the streams, the calls out,
/// and the order in which the shim received checks (or their calls failed
/// before it did), with the fault each one's call met.
struct Run<'t> {
    t: &'t Test,
    model: Model,
    streams: Vec<Stream<'t>>,
    arrived: Vec<u64>,
    replies: Vec<Option<u16>>,
    /// When each request was decided, and its phase then.
    decided: Vec<Option<(u64, Phase)>>,
    ended: Vec<bool>,
    out: Vec<Out>,
    received: Vec<(usize, Fault)>,
    /// Which request each check body is.
    bodies: HashMap<Vec<u8>, usize>,
}

impl<'t> Run<'t> {
    fn now(&self) -> u64 {
        self.t.host.now().ms()
    }

    /// Hands a result to request `i`'s flow, unless its stream ended.
    fn deliver(&mut self, i: usize, id: sluice_core::CallId, result: CallResult) {
        if self.ended[i] {
            return;
        }
        let call = Outgoing {
            id,
            path: CHECK_PATH,
            encoding: CHECK_ENCODING,
            body: Vec::new(),
            timeout_ms: TIMEOUT_MS,
            shared: true,
        };
        let fx = self.streams[i].answer(&call, &result);
        assert!(sends(&fx).is_empty(), "a check's answer sends nothing more");
        if let Some(reply) = replied(&fx) {
            self.replies[i] = Some(reply.status);
        }
        let phase = self.streams[i].phase();
        if phase != Phase::Checking && self.decided[i].is_none() {
            self.decided[i] = Some((self.now(), phase));
        }
    }

    fn arrive(&mut self, user: u8) {
        let (i, now) = (self.streams.len(), self.now());
        let mut s = self.t.stream();
        let fx = s.request(&get("/").header("x-user", format!("u{user}")));
        self.streams.push(s);
        self.arrived.push(now);
        self.replies.push(replied(&fx).map(|r| r.status));
        self.decided.push(None);
        self.ended.push(false);
        for call in sends(&fx) {
            assert_eq!(call.path, CHECK_PATH);
            self.bodies.insert(call.body.clone(), i);
            if let Some(call) = self.t.worker.change_sharing(|s| s.offer(i as u32, call, now)) {
                self.out.push(Out { call, lone: Some(i), sent_ms: now });
            }
        }
    }

    /// Call `k` out ends with `fault`.
    fn end_call(&mut self, k: usize, fault: Fault) {
        let Out { call, lone, .. } = self.out.remove(k);
        if let Some(i) = lone {
            self.t.worker.change_sharing(|s| s.lone_ended());
            self.received.push((i, fault));
            let result = fault.result(&mut self.model, &call.body);
            return self.deliver(i, call.id, result);
        }
        assert_eq!(call.path, BATCH_PATH);
        let batch: CheckBatch = CHECK_ENCODING.decode(&call.body).expect("a batch");
        let mut answers = Vec::new();
        for body in &batch.checks {
            let i = self.bodies[body];
            self.received.push((i, fault));
            if fault != Fault::Unavailable {
                let CallResult::Answered { body: Some(body), .. } = self.model.decide(body) else {
                    unreachable!()
                };
                answers.push(Answered { status: 200, body });
            }
        }
        let result = match fault {
            Fault::None => CallResult::Answered {
                status: Some(b"200".to_vec()),
                body: Some(CHECK_ENCODING.encode(&BatchAnswer { answers }).expect("encodes")),
            },
            Fault::Unavailable => Fault::Unavailable.result(&mut self.model, &[]),
            Fault::Lost => CallResult::Answered { status: None, body: None },
        };
        let members = self.t.worker.change_sharing(|s| s.batch_answered(call.id, result));
        assert_eq!(members.len(), batch.checks.len(), "one result per check");
        for (m, result) in members {
            self.deliver(m.stream as usize, m.call, result);
        }
    }

    fn end_stream(&mut self, pick: usize) {
        if self.streams.is_empty() {
            return;
        }
        let i = pick % self.streams.len();
        if self.ended[i] {
            return;
        }
        self.ended[i] = true;
        let withdrawn = self.t.worker.change_sharing(|s| s.stream_ended(i as u32));
        assert!(!self.t.worker.sharing().queued(i as u32));
        for id in &withdrawn {
            self.streams[i].flow.handle_withdrawn(*id);
        }
        let fx = self.streams[i].end();
        assert!(withdrawn.is_empty() || sends(&fx).is_empty(), "nothing is sent for a check never sent");
        if !withdrawn.is_empty() {
            // Never sent: the shim will not see it.
            self.bodies.retain(|_, j| *j != i);
        }
        // Its lone call is cancelled with it; the shim never saw it.
        if let Some(k) = self.out.iter().position(|o| o.lone == Some(i)) {
            self.out.remove(k);
            self.t.worker.change_sharing(|s| s.lone_ended());
        }
    }

    /// One millisecond passes: the host times out each call past its
    /// timeout (the shim decided what it carried).
    fn advance(&mut self) {
        self.t.host.advance(1);
        let now = self.now();
        while let Some(k) = self.out.iter().position(|o| o.sent_ms + o.call.timeout_ms <= now) {
            self.end_call(k, Fault::Lost);
        }
        self.poll();
    }

    /// The worker's own context: checks past their deadline, then the batches due.
    fn poll(&mut self) {
        let now = self.now();
        loop {
            let answers = self.t.worker.change_sharing(|s| s.poll_answers(now));
            for (m, result) in answers {
                // Failed before the shim saw it, as a call that never reached it.
                self.received.push((m.stream as usize, Fault::Unavailable));
                self.deliver(m.stream as usize, m.call, result);
            }
            let Some(batch) = self.t.worker.change_sharing(|s| s.poll_batch(now)) else { break };
            self.out.push(Out { call: batch, lone: None, sent_ms: now });
        }
        let most = self.t.worker.doc.shim.shared_calls.get() as usize;
        assert!(self.out.len() <= most, "{} calls out, at most {most}", self.out.len());
    }

    fn run(t: &'t Test, ops: &[Op]) -> (Vec<Option<Decision>>, Vec<(usize, Fault)>) {
        let mut run = Run {
            t,
            model: Model::default(),
            streams: Vec::new(),
            arrived: Vec::new(),
            replies: Vec::new(),
            decided: Vec::new(),
            ended: Vec::new(),
            out: Vec::new(),
            received: Vec::new(),
            bodies: HashMap::new(),
        };
        for op in ops {
            match *op {
                Op::Arrive { user } => run.arrive(user),
                Op::Return { pick, fault } if !run.out.is_empty() => {
                    run.end_call(pick % run.out.len(), fault)
                }
                Op::Return { .. } => {}
                Op::Advance { ms } => (0..ms).for_each(|_| run.advance()),
                Op::End { pick } => run.end_stream(pick),
            }
            run.poll();
        }
        while !run.out.is_empty() {
            run.end_call(0, Fault::None);
            run.poll();
        }
        let mut decisions = Vec::new();
        for i in 0..run.streams.len() {
            let Some((at, phase)) = run.decided[i] else {
                assert!(run.ended[i], "request {i} is neither decided nor ended");
                decisions.push(None);
                continue;
            };
            let waited = at - run.arrived[i];
            assert!(waited <= TIMEOUT_MS, "request {i} waited {waited} ms for its decision");
            decisions.push(Some((phase, run.replies[i])));
        }
        (decisions, run.received)
    }
}

/// Sharing decides each request as the same checks sent one by one, in the
/// order the shim received them, would.
fn sharing_decides_as_alone(most: u32, deny: bool, ops: &[Op]) -> Result<(), TestCaseError> {
    let failure_mode = if deny { "deny" } else { "allow" };
    let shared = Test::new(&doc(most, failure_mode));
    let (decisions, received) = Run::run(&shared, ops);

    // The same checks, one by one in the order the shim received them.
    let alone = Test::new(&doc(0, failure_mode));
    let mut model = Model::default();
    let users: Vec<u8> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Arrive { user } => Some(*user),
            _ => None,
        })
        .collect();
    let mut seen = vec![false; users.len()];
    for (i, fault) in received {
        prop_assert!(!seen[i], "request {} checked twice", i);
        seen[i] = true;
        let mut s = alone.stream();
        let fx = s.request(&get("/").header("x-user", format!("u{}", users[i])));
        let call = sent(&fx, CHECK_PATH);
        let result = fault.result(&mut model, &call.body);
        let fx = s.answer(&call, &result);
        let want = (s.phase(), replied(&fx).map(|r| r.status));
        if let Some(got) = decisions[i] {
            prop_assert_eq!(got, want, "request {}", i);
        }
    }
    for (i, d) in decisions.iter().enumerate() {
        prop_assert!(seen[i] || d.is_none(), "request {} decided but never checked", i);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn sharing_never_changes_a_decision(
        most in 1u32..4,
        deny in any::<bool>(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        sharing_decides_as_alone(most, deny, &ops)?;
    }
}

/// A case the property once found: a lone call returns and its stream
/// ends at once.
#[test]
fn a_stream_that_ends_as_its_lone_call_returns() {
    let ops = [Op::Arrive { user: 0 }, Op::Return { pick: 0, fault: Fault::None }, Op::End { pick: 0 }];
    sharing_decides_as_alone(3, false, &ops).expect("as alone");
}
