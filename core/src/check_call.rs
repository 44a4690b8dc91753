//! One check call of a request: the policies it carries (document indexes)
//! and their checks, whether it is in flight, the shim's answer, and what
//! an admission leaves to do at the stream's end (a lease to release, points
//! to adjust).

use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{Adjustment, Check, CheckOutcome, CheckRequest, CheckResponse, Views, WireLimit};
use sluice_policies::{Document, Limit};

use crate::decision::NoAnswer;
use crate::host::Host;

pub struct CheckCall {
    /// Parallel to `checks`: the index of each check's policy in the document.
    pub policies: Vec<usize>,
    pub checks: Vec<Check>,
    /// Sent and not answered yet (and so `unconfirmed` too).
    pub in_flight: bool,
    /// Sent, and no answer read yet that says whether the shim admitted it
    /// (in flight, timed out, reset, failed, malformed): the shim may hold a
    /// lease named `id` that nothing confirmed. Cleared by a readable answer.
    pub unconfirmed: bool,
    /// The longest the shim may hold this call's request, 0 for none; only
    /// the enforced call waits.
    pub wait_ms: u64,
    /// When the shim's admission reached the filter: a lease's hold starts here.
    pub admitted_ms: u64,
    /// When the call was sent, on the proxy's clock: the over-limit cache
    /// counts its deadline from here.
    pub sent_ms: u64,
    /// The answer, or why there is none; taken when the request is decided.
    pub answer: Option<Result<CheckResponse, NoAnswer>>,
    pub admitted: bool,
    /// The id this call sends with its check, given when it is sent: the
    /// shim names the request's lease with it, so a lease can be released even
    /// when its answer never came (the client reset the stream while the
    /// check was in flight).
    pub id: String,
    /// The lease the shim confirmed, taken when released.
    pub lease: Option<String>,
    /// The admitted answer's outcomes, parallel to `checks`: what each
    /// points limit charged until, which bounds a later refund.
    pub charged: Vec<CheckOutcome>,
}

impl Default for CheckCall {
    fn default() -> CheckCall {
        CheckCall::new()
    }
}

impl CheckCall {
    pub fn new() -> CheckCall {
        CheckCall {
            id: String::new(),
            policies: Vec::new(),
            checks: Vec::new(),
            in_flight: false,
            unconfirmed: false,
            wait_ms: 0,
            admitted_ms: 0,
            sent_ms: 0,
            answer: None,
            admitted: false,
            lease: None,
            charged: Vec::new(),
        }
    }

    pub fn push(&mut self, policy: usize, check: Check) {
        self.policies.push(policy);
        self.checks.push(check);
    }

    /// The call's body; `views` as the document's headers need them.
    pub fn request(&self, views: Views) -> CheckRequest<'_> {
        CheckRequest {
            checks: (&self.checks[..]).into(),
            now_us: None,
            id: Some(self.id.as_str().into()),
            wait_ms: (self.wait_ms > 0).then_some(Millis(self.wait_ms)),
            views,
        }
    }

    /// The lease to release at the stream's end: the confirmed one, or, when
    /// no answer said whether the shim admitted the check (still in flight,
    /// timed out, reset, malformed; even if `failure_mode` then decided), the
    /// one it may have taken under the call's id: releasing a lease that
    /// does not exist ends nothing. Taken once.
    pub fn lease_to_release(&mut self, doc: &Document) -> Option<String> {
        let unconfirmed = self.unconfirmed && !self.concurrency_policies(doc).is_empty();
        self.unconfirmed = false;
        self.in_flight = false;
        self.lease.take().or_else(|| unconfirmed.then(|| self.id.clone()))
    }

    /// The policies of this call with a concurrency limit: those a release frees.
    pub fn concurrency_policies(&self, doc: &Document) -> Vec<usize> {
        let holds = |index: &usize| {
            doc.policies.get(*index).is_some_and(|p| p.limits.iter().any(|l| l.lease().is_some()))
        };
        self.policies.iter().copied().filter(holds).collect()
    }

    /// Whether a policy of this call has a points limit whose true cost the
    /// response tells (`actual_cost_header`, or LLM tokens): only then are
    /// its outcomes kept.
    pub fn corrects_costs(&self, doc: &Document) -> bool {
        self.policies.iter().filter_map(|&i| doc.policies.get(i)).any(|p| p.limits.iter().any(Limit::settles))
    }

    /// The points corrections that the response's actual-cost headers call for.
    pub fn adjustments(&self, doc: &Document, host: &dyn Host) -> Vec<Adjustment> {
        self.corrections(doc, |_, limit, capacity| {
            response_cost(host, limit.actual_cost_header()?.as_str(), capacity)
        })
    }

    /// The points corrections to the true costs `actual` tells: given a
    /// policy (its document index), one of its limits and the limit's
    /// capacity, the limit's true cost, if known.
    pub fn corrections(
        &self,
        doc: &Document,
        actual: impl Fn(usize, &Limit, u32) -> Option<u32>,
    ) -> Vec<Adjustment> {
        let mut out = Vec::new();
        for (i, (index, check)) in self.policies.iter().zip(&self.checks).enumerate() {
            let Some(policy) = doc.policies.get(*index) else { continue };
            let outcomes = self.charged.get(i).map(|c| c.limits.as_slice()).unwrap_or_default();
            for (j, (limit, wire)) in policy.limits.iter().zip(&check.limits).enumerate() {
                let (WireLimit::Points { capacity, .. } | WireLimit::CalendarPoints { capacity, .. }) = wire
                else {
                    continue;
                };
                if let Some(actual) = actual(*index, limit, *capacity) {
                    out.push(Adjustment {
                        policy: check.policy.clone(),
                        key: check.key.clone(),
                        id: (!self.id.is_empty()).then(|| self.id.clone()),
                        limit: *wire,
                        actual,
                        held_until_us: outcomes.get(j).and_then(|o| o.held_until_us),
                        refunded_us: outcomes.get(j).map_or(Micros(0), |o| o.refunded_us),
                        level: check.level_of(j).cloned(),
                    });
                }
            }
        }
        out
    }
}

/// A response header as a cost, at most `capacity` (see `sluice_policies::cost`).
fn response_cost(host: &dyn Host, name: &str, capacity: u32) -> Option<u32> {
    let value = host.response_header(name)?;
    sluice_policies::cost::read_cost(&value, capacity)
}
