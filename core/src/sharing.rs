//! Shared callouts: a worker keeps at most `shim.shared_calls` check calls
//! in flight; a check that comes while they are all out waits in the
//! queue, and when one returns the queue goes out together as one call
//! (`POST /v1/checks`), whose answer resumes each request in it. A lone
//! check is sent at once, exactly as without sharing.
//!
//! A request's decision does not change: its check is the body it would
//! send alone, the shim decides it alone, and its flow is handed the status
//! and body that the lone call would have had. Its deadline counts from
//! when it came: a check still queued at its deadline is answered as a call
//! that timed out, and a batch's timeout is the least time any of its
//! checks has left. A check that waits (`wait_ms`) and every other call go
//! alone, and are not counted here.
//!
//! Sans-IO, like the flow: the adapter offers each stream's call
//! ([`Sharing::offer`]), tells when a lone check ends and when a stream
//! ends, sends what [`Sharing::poll_batch`] gives from the worker's own
//! context (a stream's calls end with it), and hands each batch's answer
//! back ([`Sharing::batch_answered`]); time is an argument.

use std::collections::{HashMap, VecDeque};

use sluice_policies::bounds::{MAX_BATCH, MAX_BATCH_BODY};
use sluice_policies::wire::{BatchAnswer, CheckBatch, BATCH_PATH};

use crate::decision::CHECK_ENCODING;
use crate::effect::{CallId, CallResult, Outgoing};

/// Bytes a batch keeps free of its checks' bodies for its own framing.
const FRAMING: usize = 1024;

/// A request's check in a batch: its stream (the adapter's id) and the
/// stream's id for the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Member {
    pub stream: u32,
    pub call: CallId,
}

struct Queued {
    member: Member,
    body: Vec<u8>,
    deadline_ms: u64,
}

/// The shared calls of one worker.
pub struct Sharing {
    /// At most this many check calls in flight; 0 sends every check alone.
    most: usize,
    /// Lone checks and batches out now.
    in_flight: usize,
    queue: VecDeque<Queued>,
    /// Each batch in flight, with its members in the batch's order.
    batches: HashMap<CallId, Vec<Member>>,
    next: u32,
    /// Members of a batch that could not be written: answered on the next poll.
    failed: Vec<(Member, CallResult)>,
}

impl Sharing {
    pub fn new(most: u32) -> Sharing {
        Sharing {
            most: most as usize,
            in_flight: 0,
            queue: VecDeque::new(),
            batches: HashMap::new(),
            next: 0,
            failed: Vec::new(),
        }
    }

    /// Whether checks are shared at all.
    pub fn is_on(&self) -> bool {
        self.most > 0
    }

    /// A stream's call: `Some` to send it now, alone (sharing off, a call
    /// that is not shared, or fewer than the most checks out and none
    /// queued: then it counts as in flight until [`Sharing::lone_ended`]);
    /// `None` when it waits in the queue.
    pub fn offer(&mut self, stream: u32, call: Outgoing, now_ms: u64) -> Option<Outgoing> {
        if self.most == 0 || !call.shared {
            return Some(call);
        }
        if self.in_flight < self.most && self.queue.is_empty() {
            self.in_flight += 1;
            return Some(call);
        }
        let member = Member { stream, call: call.id };
        let deadline_ms = now_ms.saturating_add(call.timeout_ms);
        self.queue.push_back(Queued { member, body: call.body, deadline_ms });
        None
    }

    /// A lone check sent by [`Sharing::offer`] ended: answered, failed, or
    /// cancelled with its stream.
    pub fn lone_ended(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// The stream ended: its queued checks leave the queue unsent; their
    /// call ids (for [`crate::Flow::handle_withdrawn`]).
    pub fn stream_ended(&mut self, stream: u32) -> Vec<CallId> {
        let mut withdrawn = Vec::new();
        self.queue.retain(|q| {
            let gone = q.member.stream == stream;
            if gone {
                withdrawn.push(q.member.call);
            }
            !gone
        });
        withdrawn
    }

    /// Whether a check of `stream` waits in the queue.
    pub fn queued(&self, stream: u32) -> bool {
        self.queue.iter().any(|q| q.member.stream == stream)
    }

    /// Whether [`Sharing::poll_batch`] has a batch to send now.
    pub fn batch_due(&self) -> bool {
        self.in_flight < self.most && !self.queue.is_empty()
    }

    /// The batch to send now, if a call may go out and checks wait: the
    /// queue from its head, at most [`MAX_BATCH`] checks and
    /// [`MAX_BATCH_BODY`] bytes (the rest wait for the next), with the
    /// least time its checks have left as its timeout. Checks past their
    /// deadline are left for [`Sharing::poll_answers`].
    pub fn poll_batch(&mut self, now_ms: u64) -> Option<Outgoing> {
        self.expire(now_ms);
        if !self.batch_due() {
            return None;
        }
        let (mut members, mut checks, mut bytes) = (Vec::new(), Vec::new(), FRAMING);
        let mut timeout_ms = u64::MAX;
        while let Some(next) = self.queue.front() {
            let full = checks.len() == MAX_BATCH || bytes + next.body.len() + 4 > MAX_BATCH_BODY;
            if full && !checks.is_empty() {
                break;
            }
            let Some(q) = self.queue.pop_front() else { break };
            bytes += q.body.len() + 4;
            timeout_ms = timeout_ms.min(q.deadline_ms.saturating_sub(now_ms).max(1));
            members.push(q.member);
            checks.push(q.body);
        }
        match CHECK_ENCODING.encode(&CheckBatch { checks }) {
            Ok(body) => {
                let id = CallId(self.next);
                self.next = self.next.wrapping_add(1);
                self.batches.insert(id, members);
                self.in_flight += 1;
                Some(Outgoing {
                    id,
                    path: BATCH_PATH,
                    encoding: CHECK_ENCODING,
                    body,
                    timeout_ms,
                    shared: false,
                })
            }
            Err(err) => {
                let reason = format!("cannot encode the batch: {err}");
                self.failed.extend(members.into_iter().map(|m| (m, CallResult::NotSent(reason.clone()))));
                None
            }
        }
    }

    /// The batch `id` could not be sent, or ended: each of its checks'
    /// results, in the batch's order. An answer of one entry per check
    /// gives each its own status and body; any other (no answer, a status
    /// but 200, a body that is not a batch's answer or of another length)
    /// is every check's, as if its lone call had ended so.
    pub fn batch_answered(&mut self, id: CallId, result: CallResult) -> Vec<(Member, CallResult)> {
        let Some(members) = self.batches.remove(&id) else { return Vec::new() };
        self.in_flight = self.in_flight.saturating_sub(1);
        if let CallResult::Answered { status: Some(status), body: Some(body) } = &result {
            if status.as_slice() == b"200" {
                if let Ok(answer) = CHECK_ENCODING.decode::<BatchAnswer>(body) {
                    if answer.answers.len() == members.len() {
                        return members
                            .into_iter()
                            .zip(answer.answers)
                            .map(|(m, a)| {
                                let status = Some(a.status.to_string().into_bytes());
                                (m, CallResult::Answered { status, body: Some(a.body) })
                            })
                            .collect();
                    }
                }
                let malformed = b"not one answer per check".to_vec();
                let result = CallResult::Answered { status: Some(status.clone()), body: Some(malformed) };
                return members.into_iter().map(|m| (m, result.clone())).collect();
            }
        }
        members.into_iter().map(|m| (m, result.clone())).collect()
    }

    /// Checks whose deadline came while they were queued, answered as a
    /// call that timed out (no status), and those a batch could not be
    /// written for.
    pub fn poll_answers(&mut self, now_ms: u64) -> Vec<(Member, CallResult)> {
        self.expire(now_ms);
        std::mem::take(&mut self.failed)
    }

    /// When the next queued check's deadline comes; `None` with none queued.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.queue.iter().map(|q| q.deadline_ms).min()
    }

    fn expire(&mut self, now_ms: u64) {
        let failed = &mut self.failed;
        self.queue.retain(|q| {
            let due = q.deadline_ms <= now_ms;
            if due {
                failed.push((q.member, CallResult::Answered { status: None, body: None }));
            }
            !due
        });
    }
}
