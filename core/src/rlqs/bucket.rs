//! One RLQS bucket of one stream: what Envoy holds for it, the tokens its
//! assignments took from the window, and when to take more or give some back.
//!
//! **How Envoy enforces an assignment** (its `rate_limit_quota` filter, as
//! read from its source and checked against Envoy 1.40 in
//! `tests/e2e/tests/envoy_rlqs.rs`): a token bucket of `max_tokens` starts full
//! when the bucket has none (no assignment yet, or a blanket rule before
//! it), refills at `tokens_per_fill / fill_interval` (whole seconds, at
//! least one token a year) up to `max_tokens`, and charges each request one
//! token. The same token bucket sent again keeps its tokens and restarts
//! its time to live (`assignment_time_to_live`, whole seconds, timed from
//! when Envoy applies it); a different one starts at most full. When the
//! time to live runs out, the bucket falls back to
//! `expired_assignment_behavior`, else `no_assignment_behavior` (Sluice's
//! rendered config: `deny_all` for `failure_mode: deny`).
//!
//! **Never over the limit.** Every token bucket Sluice sends holds tokens
//! taken from the window before it is sent (the lease call's grant), lives
//! no longer than the window (its time to live ends [`DELIVERY_MS`] before
//! the window's end), and refills less than one token in it: so however
//! Envoy spends it, and whatever it keeps of an earlier one, the requests
//! it admits after it arrives are at most its tokens. Tokens go back to the
//! window only once no request can spend them: a replaced or expired token
//! bucket's leftover is known from the reports once one came
//! `2 × DELIVERY_MS` after its end (every spend of it is counted by then),
//! and what goes back is at most everything sent less everything reported
//! admitted. So each gateway's share of the window's count is at least what
//! it admitted.
//!
//! **Under-admission, bounded as in leased mode.** A new token bucket
//! replaces the old one (a `deny_all` first, in the same response, so it
//! starts full) only once the reports show the old one down to half a lease
//! (`leased.tokens / 2`): what was sent, less what was reported admitted
//! and what went back, bounds what the live one has left ([`Ledger::unspent`]),
//! whichever token bucket each report's requests spent; and only once the
//! previous replacement's leftover went back. So a gateway holds back at
//! most its live assignment plus half a lease: `1.5 × tokens`. The same token
//! bucket is sent again, free, to keep it alive while the bucket is
//! reported busy; it is given up (and abandoned) once idle for [`IDLE_MS`].

use crate::leased::RETRY_MS;
use sluice_policies::rlqs::{Governed, Window};
use sluice_policies::wire::{GiveBack, LeaseCall as CallId, LeaseRequest, LeaseResponse};

use super::{
    Action, BucketId, LeaseCall, LeaseResult, Strategy, BLANKET_TTL_S, DELIVERY_MS, IDLE_MS, TICK_MS,
};

/// A token bucket is sent again this long before it could expire at the
/// earliest, at a moment that ends it as close to the window's end as
/// whole seconds allow.
const EXTEND_LEAD_MS: u64 = 1_500;

/// Whether two windows count in the same Redis counter: the same policy,
/// key and window length (the state key), whatever their limit or lease.
fn same_counter(a: &Window, b: &Window) -> bool {
    a.policy == b.policy && a.key == b.key && a.limit.quota().1 == b.limit.quota().1
}

/// Where a bucket's effects go.
pub(crate) struct Out<'a> {
    pub(crate) id: &'a BucketId,
    pub(crate) actions: &'a mut Vec<Action>,
    pub(crate) calls: &'a mut Vec<LeaseCall>,
}

impl Out<'_> {
    fn assign(&mut self, strategy: Strategy, ttl_s: u64) {
        self.actions.push(Action::Assign { id: self.id.clone(), strategy, ttl_s });
    }
}

/// What Envoy may hold for the bucket, as far as Sluice knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    Nothing,
    /// A token bucket of `tokens`, last sent at `sent_ms` for `ttl_s`: no
    /// request spends it from `spends_until` on.
    Tokens {
        tokens: u32,
        sent_ms: u64,
        ttl_s: u64,
        spends_until: u64,
    },
    /// `allow_all` (`allow`) or `deny_all`, sent at `sent_ms` for `ttl_s`.
    Blanket {
        allow: bool,
        sent_ms: u64,
        ttl_s: u64,
    },
}

/// The tokens of one window that this bucket's assignments took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    pub window: Window,
    /// The window's index, as the lease script numbers it.
    pub index: u64,
    /// The window ends no earlier than this (an ask's time plus what the
    /// script said was left when it ran, the latest of them).
    pub ends_ms: u64,
    /// Tokens sent to Envoy in token buckets.
    pub sent: u64,
    /// Those of the token bucket Envoy may still spend (0: none).
    pub live: u64,
    /// Requests Envoy reported admitted since the ledger began.
    pub allowed: u64,
    /// Of those, how many may be earlier windows' requests, reported late:
    /// at most what their token buckets may still have had, and not yet
    /// reported, when this ledger began.
    pub carry: u64,
    /// Tokens given back after their token bucket ended.
    pub given: u64,
    /// The first report received from then on settles the token buckets
    /// that ended: all their spends are reported by then.
    pub settle_at: Option<u64>,
    /// Tokens to give back in the next call.
    pub back: u64,
}

impl Ledger {
    fn new(window: Window, index: u64, ends_ms: u64, carry: u64) -> Ledger {
        Ledger {
            window,
            index,
            ends_ms,
            sent: 0,
            live: 0,
            allowed: 0,
            carry,
            given: 0,
            settle_at: None,
            back: 0,
        }
    }

    /// At most what the live token bucket has left: everything sent, less
    /// what was reported admitted by this window's token buckets (the ended
    /// ones spent at most what they had) and what went back (at most what
    /// the ended ones left).
    pub fn unspent(&self) -> u64 {
        let own = self.allowed.saturating_sub(self.carry);
        self.sent.saturating_sub(own).saturating_sub(self.given)
    }

    /// At most how many requests of this and earlier windows are still to
    /// be reported: the next ledger's `carry`.
    fn owed(&self) -> u64 {
        self.carry.saturating_sub(self.allowed) + self.unspent()
    }

    /// The live token bucket ended (replaced, or expired) at the latest by
    /// `spent_by`: its leftover settles with the first report one delivery after.
    fn end_live(&mut self, spent_by: u64) {
        self.live = 0;
        let at = spent_by + DELIVERY_MS;
        self.settle_at = Some(self.settle_at.map_or(at, |s| s.max(at)));
    }

    /// A report settles what ended: what was sent and is no longer live,
    /// less everything reported admitted (this window's requests and any
    /// other), may go back.
    fn settle(&mut self, now: u64) {
        if self.settle_at.is_some_and(|at| now >= at) {
            self.settle_at = None;
            let safe = (self.sent - self.live).saturating_sub(self.allowed);
            if safe > self.given {
                self.back += safe - self.given;
                self.given = safe;
            }
        }
    }
}

/// A lease call asked, until its answer comes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    want: u32,
    give_back: Option<GiveBack>,
    window: Window,
    asked_ms: u64,
    in_flight: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    rule: Governed,
    /// This bucket's id in the lease calls' record.
    gateway: u64,
    seq: u64,
    call: Option<Pending>,
    quiet_until: u64,
    held: Held,
    ledger: Option<Ledger>,
    /// The last report with a request in it (0: none yet).
    demand_ms: u64,
    /// When a lease call found the window spent (0: not since the last grant).
    spent_at: u64,
    created_ms: u64,
}

impl Bucket {
    pub(crate) fn new(rule: Governed, gateway: u64) -> Bucket {
        Bucket {
            rule,
            gateway,
            seq: 0,
            call: None,
            quiet_until: 0,
            held: Held::Nothing,
            ledger: None,
            demand_ms: 0,
            spent_at: 0,
            created_ms: 0,
        }
    }

    /// What governs the bucket.
    pub fn rule(&self) -> &Governed {
        &self.rule
    }

    /// What Envoy may hold.
    pub fn held(&self) -> Held {
        self.held
    }

    /// The tokens of the current window.
    pub fn ledger(&self) -> Option<&Ledger> {
        self.ledger.as_ref()
    }

    /// Tokens on their way back to the window: settled or never sent, in
    /// the next call or in one not yet answered.
    pub fn returning(&self) -> u64 {
        let asked = self.call.as_ref().and_then(|c| c.give_back).map_or(0, |b| u64::from(b.tokens));
        self.ledger.as_ref().map_or(0, |l| l.back) + asked
    }

    pub(crate) fn handle_report(
        &mut self,
        now: u64,
        allowed: u64,
        denied: u64,
        rule: Governed,
        out: &mut Out,
    ) {
        if self.created_ms == 0 {
            self.created_ms = now.max(1);
        }
        if allowed + denied > 0 {
            self.demand_ms = now.max(1);
            if self.spent_at != 0 && now >= self.spent_at + RETRY_MS {
                // A spent window, and requests since: other gateways may
                // have given tokens back.
                self.quiet_until = self.quiet_until.min(now);
                self.spent_at = 0;
            }
        }
        if let Some(ledger) = &mut self.ledger {
            ledger.allowed += allowed;
            ledger.settle(now);
        }
        if rule != self.rule {
            if let (Governed::Leased(new), Some(ledger)) = (&rule, &mut self.ledger) {
                // A reload that keeps the counter (a lowered limit, say):
                // the ledger goes on, so what Envoy held goes back at the
                // first report that settles it, not at the window's end.
                if same_counter(&ledger.window, new) {
                    ledger.window = new.clone();
                }
            }
            self.rule = rule;
            self.replace(now, out);
        }
        self.step(now, out);
    }

    pub(crate) fn handle_lease(&mut self, now: u64, seq: u64, result: LeaseResult, out: &mut Out) {
        if seq != self.seq || self.call.as_ref().is_none_or(|c| !c.in_flight) {
            return;
        }
        match result {
            LeaseResult::Lost => {
                if let Some(call) = &mut self.call {
                    call.in_flight = false;
                }
                self.quiet_until = now + RETRY_MS;
            }
            LeaseResult::Refused => {
                self.call = None;
                self.quiet_until = now + RETRY_MS;
            }
            LeaseResult::Answered(answer) => {
                if let Some(call) = self.call.take() {
                    self.answered(now, call, answer, out);
                }
            }
        }
        self.step(now, out);
    }

    /// Time passes; `false` once the bucket is abandoned.
    pub(crate) fn tick(&mut self, now: u64, out: &mut Out) -> bool {
        match self.held {
            Held::Tokens { spends_until, .. } if now >= spends_until => {
                self.held = Held::Nothing;
                if let Some(ledger) = &mut self.ledger {
                    ledger.end_live(spends_until);
                }
            }
            Held::Blanket { sent_ms, ttl_s, .. } if now >= sent_ms + ttl_s * 1000 + DELIVERY_MS => {
                self.held = Held::Nothing;
            }
            _ => {}
        }
        let idle = now.saturating_sub(self.demand_ms.max(self.created_ms)) >= IDLE_MS;
        let settled = self
            .ledger
            .as_ref()
            .is_none_or(|l| now >= l.ends_ms || (l.live == 0 && l.settle_at.is_none() && l.back == 0));
        if idle && self.call.is_none() && settled && !matches!(self.held, Held::Tokens { .. }) {
            out.actions.push(Action::Abandon { id: out.id.clone() });
            return false;
        }
        self.step(now, out);
        true
    }

    fn busy(&self, now: u64) -> bool {
        self.demand_ms != 0 && now.saturating_sub(self.demand_ms) < IDLE_MS
    }

    /// The policy changed: what Envoy holds no longer stands.
    fn replace(&mut self, now: u64, out: &mut Out) {
        if let (Held::Tokens { .. }, Some(ledger)) = (self.held, &mut self.ledger) {
            ledger.end_live(now + DELIVERY_MS);
        }
        let (allow, ttl_s) = match self.rule {
            Governed::Unmatched | Governed::Unlimited { .. } => (true, BLANKET_TTL_S),
            Governed::MissingKey { .. } => (false, BLANKET_TTL_S),
            // Denied until the new policy's first grant comes.
            Governed::Leased(_) => (false, 1),
        };
        self.blanket(now, allow, ttl_s, out);
        self.quiet_until = 0;
    }

    fn blanket(&mut self, now: u64, allow: bool, ttl_s: u64, out: &mut Out) {
        out.assign(if allow { Strategy::AllowAll } else { Strategy::DenyAll }, ttl_s);
        self.held = Held::Blanket { allow, sent_ms: now, ttl_s };
    }

    /// Whatever is due now.
    fn step(&mut self, now: u64, out: &mut Out) {
        match self.rule.clone() {
            Governed::Unmatched | Governed::Unlimited { .. } => self.keep_blanket(now, true, out),
            Governed::MissingKey { .. } => self.keep_blanket(now, false, out),
            Governed::Leased(window) => self.leased(now, &window, out),
        }
        self.give_back(now, out);
    }

    /// Keeps a policy's blanket rule in place while the bucket is reported.
    fn keep_blanket(&mut self, now: u64, allow: bool, out: &mut Out) {
        let due = match self.held {
            Held::Blanket { allow: a, sent_ms, ttl_s } if a == allow => now >= sent_ms + ttl_s * 500,
            _ => true,
        };
        if due && (self.busy(now) || self.demand_ms == 0) {
            if let (Held::Tokens { .. }, Some(ledger)) = (self.held, &mut self.ledger) {
                ledger.end_live(now + DELIVERY_MS);
            }
            self.blanket(now, allow, BLANKET_TTL_S, out);
        }
    }

    fn leased(&mut self, now: u64, window: &Window, out: &mut Out) {
        if let Some(call) = &mut self.call {
            if !call.in_flight && now >= self.quiet_until {
                // Its answer measures the window from when it runs: after now.
                call.in_flight = true;
                call.asked_ms = now;
                let again = call.clone();
                out.calls.push(self.call_of(&again, out.id));
            }
        }
        let ending = self.ledger.as_ref().filter(|l| l.window == *window).map(|l| l.ends_ms);
        let room = ending.map_or(u64::MAX, |ends| ends.saturating_sub(now + DELIVERY_MS));
        let window_left = ending.is_none_or(|ends| now >= ends) || room >= 1_000;
        let may_ask = self.call.is_none() && now >= self.quiet_until && self.busy(now) && window_left;
        match self.held {
            Held::Tokens { tokens, sent_ms, ttl_s, spends_until } => {
                let low = self.ledger.as_ref().is_none_or(|l| l.unspent() <= window.lease.low_water());
                let settled = self.ledger.as_ref().is_none_or(|l| l.settle_at.is_none());
                if low && settled && may_ask {
                    self.ask(now, window, window.lease.tokens(), out);
                    return;
                }
                // Sent again, free, to live on while busy: before it can
                // expire, ending as near the window's end as whole seconds allow.
                let earliest = sent_ms + ttl_s * 1000;
                if !self.busy(now) || now + EXTEND_LEAD_MS < earliest || now + DELIVERY_MS >= earliest {
                    return;
                }
                let k = (room / 1000).min(window.ttl_s());
                let aligned = k == window.ttl_s() || room % 1000 < 2 * TICK_MS;
                let last_chance = now + DELIVERY_MS + 2 * TICK_MS >= earliest;
                if k >= 1 && (aligned || last_chance) {
                    out.assign(Strategy::TokenBucket { tokens }, k);
                    let until = now + DELIVERY_MS + k * 1000;
                    self.held = Held::Tokens {
                        tokens,
                        sent_ms: now,
                        ttl_s: k,
                        spends_until: until.max(spends_until),
                    };
                }
            }
            Held::Nothing | Held::Blanket { .. } if may_ask => {
                self.ask(now, window, window.lease.tokens(), out)
            }
            // A spent window's `deny_all` lives on until the window ends,
            // requests or not: expired, the bucket would fall back to
            // `no_assignment_behavior`, which may admit.
            Held::Blanket { allow: false, sent_ms, ttl_s } if self.spent_at != 0 => {
                let left_s = ending.map_or(0, |ends| ends.saturating_sub(now).div_ceil(1000));
                if left_s > 0 && now >= sent_ms + ttl_s * 500 {
                    self.blanket(now, false, left_s.min(window.ttl_s()), out);
                }
            }
            _ => {}
        }
    }

    /// Gives back what settled, in a call of its own when no other is due.
    fn give_back(&mut self, now: u64, out: &mut Out) {
        let Some(ledger) = &self.ledger else { return };
        if ledger.back == 0 || self.call.is_some() || now >= ledger.ends_ms {
            return;
        }
        let window = ledger.window.clone();
        self.ask(now, &window, 0, out);
    }

    /// A lease call on `window`: up to `want` tokens, and the settled
    /// leftovers of the ledger if it is that window's.
    fn ask(&mut self, now: u64, window: &Window, want: u32, out: &mut Out) {
        let give_back = match &mut self.ledger {
            Some(ledger) if ledger.window == *window && ledger.back > 0 && now < ledger.ends_ms => {
                // At most what one call takes back; the rest in the next.
                let most = LeaseRequest::most_given_back(window.limit.capacity());
                let tokens = u32::try_from(ledger.back).unwrap_or(u32::MAX).min(most);
                ledger.back -= u64::from(tokens);
                Some(GiveBack { window: ledger.index, tokens, charged: None })
            }
            _ => None,
        };
        if want == 0 && give_back.is_none() {
            return;
        }
        self.seq += 1;
        let call = Pending { want, give_back, window: window.clone(), asked_ms: now, in_flight: true };
        out.calls.push(self.call_of(&call, out.id));
        self.call = Some(call);
    }

    fn call_of(&self, call: &Pending, id: &BucketId) -> LeaseCall {
        let request = LeaseRequest {
            policy: call.window.policy.clone(),
            key: call.window.key.clone(),
            limit: call.window.limit,
            want: call.want,
            give_back: call.give_back,
            ttl_ms: None,
            now_us: None,
            call: Some(CallId { gateway: self.gateway, seq: self.seq }),
        };
        LeaseCall { id: id.clone(), seq: self.seq, request }
    }

    fn answered(&mut self, now: u64, call: Pending, answer: LeaseResponse, out: &mut Out) {
        let ends = call.asked_ms + answer.expires_in_ms.get();
        let ledger = match &mut self.ledger {
            Some(l) if same_counter(&l.window, &call.window) && l.index == answer.window => {
                // Each answer's end is no later than the window's: the latest is the closest.
                l.ends_ms = l.ends_ms.max(ends);
                l
            }
            slot => {
                let carry = slot.as_ref().map_or(0, Ledger::owed);
                slot.insert(Ledger::new(call.window.clone(), answer.window, ends, carry))
            }
        };
        let granted = u64::from(answer.granted);
        let current = matches!(&self.rule, Governed::Leased(w) if *w == call.window);
        let room = ledger.ends_ms.saturating_sub(now + DELIVERY_MS);
        let k = (room / 1000).min(call.window.ttl_s());
        if granted > 0 && (!current || k == 0) {
            // Tokens no assignment can carry: back to their window, and
            // no more asks until it ends.
            ledger.back += granted;
            self.quiet_until = if current { ledger.ends_ms.max(now + RETRY_MS) } else { 0 };
            return;
        }
        if granted == 0 {
            if call.want > 0 {
                // The window is spent: deny once the live token bucket is
                // empty, and ask again later (other gateways give back).
                let empty = match self.held {
                    Held::Tokens { .. } => ledger.unspent() == 0,
                    Held::Nothing => true,
                    Held::Blanket { allow, .. } => allow,
                };
                if empty && current {
                    if ledger.live > 0 {
                        ledger.end_live(now + DELIVERY_MS);
                    }
                    let until_end = ledger.ends_ms.saturating_sub(now).div_ceil(1000);
                    self.blanket(now, false, until_end.clamp(1, call.window.ttl_s()), out);
                }
                // Asked again once a report shows requests a second from
                // now or later (see `handle_report`), else at the window's end.
                self.quiet_until = self.ledger.as_ref().map_or(now + RETRY_MS, |l| l.ends_ms.max(now));
                self.spent_at = now;
            }
            return;
        }
        // A fresh token bucket: `deny_all` first, in the same response, so
        // Envoy starts it full instead of scaling what the old one kept.
        if ledger.live > 0 {
            ledger.end_live(now + DELIVERY_MS);
        }
        ledger.sent += granted;
        ledger.live = granted;
        self.spent_at = 0;
        let tokens = answer.granted;
        out.assign(Strategy::DenyAll, 1);
        out.assign(Strategy::TokenBucket { tokens }, k);
        self.held =
            Held::Tokens { tokens, sent_ms: now, ttl_s: k, spends_until: now + DELIVERY_MS + k * 1000 };
    }
}
