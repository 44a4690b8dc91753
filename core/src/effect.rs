//! What the flow asks its host to do, as plain values: call the shim, leave
//! a call to the worker, send a local reply, resume the request or the
//! response, add or set a response header, count a stat. The adapter
//! performs them in order.

use std::rc::Rc;

use sluice_policies::wire::{AdjustRequest, Encoding, ADJUST_PATH};

use crate::local_reply::LocalReply;
use crate::stats::{ClassStat, FilterStat, PolicyStat};

/// Names a call to the shim among those of its owner (one stream, or the
/// worker's background calls). The adapter maps the host's call token to it
/// and hands the answer back with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallId(pub u32);

/// A call to the shim: `POST path` with a body in `encoding` (JSON, or
/// for a check the binary wire), the answer in the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub id: CallId,
    pub path: &'static str,
    pub encoding: Encoding,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
    /// A check that may share its callout with others ([`crate::sharing`]):
    /// a plain check, one that does not wait.
    pub shared: bool,
}

/// A call a stream leaves to its worker, sent on the worker's next tick: a
/// stream's own calls are cancelled when it ends, the worker's outlive it.
/// A release names the policies (document indexes) whose slots it frees;
/// an adjustment or upstream feedback none. A token settlement names, per
/// adjustment, the policy whose `llm_tokens_given_back` its answer counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferred {
    pub path: &'static str,
    pub body: Vec<u8>,
    pub releases: Vec<usize>,
    pub settles: Vec<Option<usize>>,
}

/// What became of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallResult {
    /// The host could not send it (no such cluster, too many calls...).
    NotSent(String),
    /// It ended: `status` is the `:status` of the shim's answer, `None` when
    /// it failed without one (reset, timed out).
    Answered { status: Option<Vec<u8>>, body: Option<Vec<u8>> },
}

impl CallResult {
    /// The answer's status and body; `None` for both when there is none.
    pub fn parts(&self) -> (Option<&[u8]>, Option<&[u8]>) {
        match self {
            CallResult::NotSent(_) => (None, None),
            CallResult::Answered { status, body } => (status.as_deref(), body.as_deref()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send this call; its result comes back with its id. If the host cannot
    /// send it, the adapter hands back [`CallResult::NotSent`] at once.
    Send(Outgoing),
    /// Hand this call to the worker ([`crate::Worker::defer`]).
    Defer(Deferred),
    /// Answer the request locally; it stays paused. Shared: a worker hands
    /// out the same denial again while nothing in it changes.
    Reply(Rc<LocalReply>),
    /// Let the paused request go upstream.
    ResumeRequest,
    /// Let the paused response go on to the client.
    ResumeResponse,
    /// Add a header to the upstream's response.
    AddResponseHeader { name: &'static str, value: String },
    /// Set (replace) a header of the upstream's response.
    SetResponseHeader { name: &'static str, value: String },
    /// Replace the response body chunk being handled with these bytes.
    ReplaceResponseBody(Vec<u8>),
    /// End the response to the client once the bytes this callback hands
    /// on have gone, whatever the upstream still sends (a proxy-wasm host
    /// can only reset it: the client has had its last event).
    EndResponse,
    /// Add `n` to a policy's counter, or record `n` in its histogram.
    Policy { policy: usize, stat: PolicyStat, n: u64 },
    /// Add 1 to a class's counter, or set its gauge to `n`.
    Class { class: usize, stat: ClassStat, n: u64 },
    /// Add `n` to a filter counter or gauge (which may be negative), or
    /// record it in a histogram.
    Filter { stat: FilterStat, n: i64 },
}

/// The effects of one event, in order, with shorthands for the stats.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects(pub Vec<Effect>);

impl Effects {
    pub fn push(&mut self, effect: Effect) {
        self.0.push(effect);
    }

    /// Adds 1 to `stat` of policy `index`.
    pub fn count(&mut self, policy: usize, stat: PolicyStat) {
        self.add(policy, stat, 1);
    }

    /// Adds `n` to `stat` of policy `index`, or records `n` if it is a histogram.
    pub fn add(&mut self, policy: usize, stat: PolicyStat, n: u64) {
        self.0.push(Effect::Policy { policy, stat, n });
    }

    /// Adds 1 to `stat` of class `class` (nothing without classes: the adapter has no such stat).
    pub fn count_class(&mut self, class: usize, stat: ClassStat) {
        self.0.push(Effect::Class { class, stat, n: 1 });
    }

    /// Leaves a call to `path` with `body` to the worker; `releases` as in [`Deferred`].
    pub fn defer(&mut self, path: &'static str, body: &impl serde::Serialize, releases: Vec<usize>) {
        match serde_json::to_vec(body) {
            Ok(body) => self.0.push(Effect::Defer(Deferred { path, body, releases, settles: Vec::new() })),
            Err(err) => log::warn!("cannot encode {path}: {err}"),
        }
    }

    /// A token settlement left to the worker; `settles` as [`Deferred`]'s.
    pub fn defer_settlement(&mut self, request: &AdjustRequest, settles: Vec<Option<usize>>) {
        match serde_json::to_vec(request) {
            Ok(body) => self.0.push(Effect::Defer(Deferred {
                path: ADJUST_PATH,
                body,
                releases: Vec::new(),
                settles,
            })),
            Err(err) => log::warn!("cannot encode {ADJUST_PATH}: {err}"),
        }
    }

    pub fn filter(&mut self, stat: FilterStat, n: i64) {
        self.0.push(Effect::Filter { stat, n });
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many times `stat` of `policy` was counted (tests read this).
    pub fn counted(&self, policy: usize, stat: PolicyStat) -> u64 {
        self.0
            .iter()
            .map(|e| match e {
                Effect::Policy { policy: p, stat: s, n } if *p == policy && *s == stat => *n,
                _ => 0,
            })
            .sum()
    }
}
