//! Leased mode in one gateway: the pool of a leased policy's tokens that
//! every worker of one Envoy spends (see `sluice_policies::leased`).
//!
//! The pool lives in Envoy shared data, read and written with
//! compare-and-swap, so the workers spend it together; this module is the
//! state and its rules, over an injected clock (milliseconds), tested
//! natively. The adapter only loads, applies one rule, and stores.
//!
//! - [`Pool::spend`]: a request takes one token, if the pool holds one of a
//!   window that has not ended; else it is checked by the shim exactly.
//! - [`Pool::unspend`]: a request that took a token and was then refused
//!   (another policy denied it) puts it back, if its window still holds.
//! - [`Pool::tick`]: a root context's tick asks for the next lease once the
//!   pool holds half a lease or fewer and requests wanted tokens lately,
//!   and gives unused tokens back `ttl` after the last grant. One call per
//!   Envoy at a time: [`Pool::asking_ms`] claims it.
//! - [`Pool::answered`] (or [`Pool::granted`]), [`Pool::lost`] and
//!   [`Pool::failed`]: the call's answer, or none.
//!
//! **Lost answers.** Each call carries an id ([`Pool::call_id`]): the
//! gateway's and a sequence number. A call whose answer was lost (a
//! timeout, a broken connection: the shim may have run it) is sent again,
//! unchanged, after [`RETRY_MS`], until an answer comes; the shim answers a
//! call it has run already with the grant it recorded, charged once, so the
//! tokens of a lost answer reach the pool after all instead of staying
//! charged until their window ends (`lua/scripts/lease.lua`).
//!
//! **Never over the limit.** A token is spent only before the pool's
//! `ends_ms`: the time the lease was *asked for* plus what the shim said
//! was left of its window, so no later than the window's end on the shim's
//! clock (assuming the gateway's clock does not run slow or step back by
//! more than the call's round trip). Tokens given back leave the pool in
//! the same write that hands them to the call, so none is both spent and
//! given back. Tokens of an ended window are dropped, never carried on.
//!
//! **A bucket's leases** ([`Source::Bucket`]) belong to a lease period
//! (`ttl` long, aligned to the epoch) and the shim charges them as if spent
//! at its end, so no token is spent from then on either; the tokens still
//! held then are given back on the next tick ([`Pool::ended`]), with what
//! the pool was charged for that period ([`Pool::charged`]), which tells
//! the shim how much of a late give-back it can take back exactly.
//!
//! **Under-admission, bounded.** The pool asks only at [`Leased::low_water`]
//! or below and one call is in flight at a time, so it holds at most
//! [`Leased::held_at_most`]. A call unanswered for [`ASK_TIMEOUT_MS`] is
//! taken as lost and sent again.

use sluice_policies::leased::{Leased, Source};
use sluice_policies::wire::{GiveBack, LeaseCall, LeaseResponse};

/// A lease call unanswered this long is given up and may be asked again:
/// longer than any call's timeout (a background call's is at most 60 s).
pub const ASK_TIMEOUT_MS: u64 = 61_000;
/// After a failed call, or a grant of nothing, the pool waits this long
/// before it asks again; meanwhile its requests are checked exactly.
pub const RETRY_MS: u64 = 1_000;

/// One leased policy's pool, as it sits in shared data. Times are the
/// gateway's clock in milliseconds; 0 means none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pool {
    /// The shim's index of the window the tokens belong to.
    pub window: u64,
    /// Tokens held, charged to `window` and not yet spent.
    pub tokens: u64,
    /// No token may be spent from this time on: the window has ended.
    pub ends_ms: u64,
    /// Unused tokens go back from this time on: `ttl` after the last grant.
    pub expires_ms: u64,
    /// A lease call is in flight since then.
    pub asking_ms: u64,
    /// No lease call before this time.
    pub quiet_until_ms: u64,
    /// The last time a request wanted a token.
    pub demand_ms: u64,
    /// This gateway's id in its lease calls, random (0: none chosen yet).
    pub gateway: u64,
    /// The sequence number of the last call asked.
    pub seq: u64,
    /// The last call asked, until its answer comes: in flight, or lost and
    /// to be sent again.
    pub unanswered: Option<Ask>,
    /// What the window had left, beyond every lease, at the last grant.
    pub left: u64,
    /// Tokens of `window` that died unspent at its end and are not yet
    /// given back: a bucket's go back on the next tick; a window's are
    /// dropped (its count ends with it).
    pub ended: u64,
    /// Tokens of `window` granted to this pool and not given back, spent
    /// or not (a bucket's give-back carries it).
    pub charged: u64,
}

/// A token a request took: it can go back only into its own window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    pub window: u64,
}

/// A lease call to make: tokens wanted (0: only give back) and tokens given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub want: u32,
    pub give_back: Option<GiveBack>,
}

impl Pool {
    /// Takes one token for a request at `now`, if a live one is held.
    pub fn spend(&mut self, now: u64) -> Option<Token> {
        self.demand_ms = now.max(1);
        self.drop_ended(now);
        if self.tokens == 0 {
            return None;
        }
        self.tokens -= 1;
        Some(Token { window: self.window })
    }

    /// Puts back a token whose request was refused after all, if its window
    /// is the pool's and has not ended; otherwise it stays charged unspent.
    pub fn unspend(&mut self, token: Token, now: u64) {
        if token.window == self.window && now < self.ends_ms {
            self.tokens = self.tokens.saturating_add(1);
        }
    }

    /// A root context's tick: the lease call to make now, if any. Making
    /// it is claimed in the pool (`asking_ms`), and tokens given back leave it.
    pub fn tick(&mut self, lease: Leased, now: u64) -> Option<Ask> {
        if self.asking_ms != 0 {
            if now < self.asking_ms.saturating_add(ASK_TIMEOUT_MS) && now >= self.asking_ms {
                return None;
            }
            // Lost with its worker, or the clock stepped back: ask again.
            self.asking_ms = 0;
        }
        if now < self.quiet_until_ms {
            return None;
        }
        if let Some(again) = self.unanswered {
            // Its answer was lost: the same call again, so it is charged once.
            self.asking_ms = now.max(1);
            return Some(again);
        }
        self.drop_ended(now);
        let back = match lease.source() {
            // A window's count ends with it: its dead tokens need no call.
            Source::Window => {
                self.ended = 0;
                if now >= self.expires_ms {
                    std::mem::take(&mut self.tokens)
                } else {
                    0
                }
            }
            // A bucket's refill counts from its charge: its tokens go back
            // at their period's end (the expiry, for a bucket).
            Source::Bucket => std::mem::take(&mut self.ended),
        };
        let give_back = (back > 0).then(|| {
            let tokens = u32::try_from(back).unwrap_or(u32::MAX);
            let charged = (lease.source() == Source::Bucket)
                .then(|| u32::try_from(self.charged.max(back)).unwrap_or(u32::MAX));
            self.charged = self.charged.saturating_sub(back);
            GiveBack { window: self.window, tokens, charged }
        });
        let wanted = self.demand_ms != 0 && now < self.demand_ms.saturating_add(lease.ttl_ms());
        let want = if wanted && self.tokens <= lease.low_water() { lease.tokens() } else { 0 };
        if want == 0 && give_back.is_none() {
            return None;
        }
        self.asking_ms = now.max(1);
        self.seq = self.seq.wrapping_add(1);
        let ask = Ask { want, give_back };
        self.unanswered = Some(ask);
        Some(ask)
    }

    /// Chooses this gateway's id for its lease calls, if none is yet:
    /// `random` should differ between gateways (0 is taken as 1).
    pub fn adopt(&mut self, random: u64) {
        if self.gateway == 0 {
            self.gateway = random.max(1);
        }
    }

    /// The id of the last call asked (the one [`Pool::tick`] returned).
    pub fn call_id(&self) -> LeaseCall {
        LeaseCall { gateway: self.gateway, seq: self.seq }
    }

    /// The answer to call `seq`, asked at `asked_ms`, arriving at `now`: as
    /// [`Pool::granted`] if it is the call the pool waits for; an answer to
    /// any other (one given up and sent again, already answered) is dropped.
    /// Whether it was taken.
    pub fn answered(
        &mut self,
        seq: u64,
        lease: Leased,
        asked_ms: u64,
        now: u64,
        answer: LeaseResponse,
    ) -> bool {
        if self.unanswered.is_none() || seq != self.seq {
            return false;
        }
        self.granted(lease, asked_ms, now, answer);
        true
    }

    /// Call `seq`'s answer was lost (the shim may have run it): it is sent
    /// again, unchanged, after [`RETRY_MS`]; exact checks meanwhile.
    pub fn lost(&mut self, seq: u64, now: u64) {
        if self.unanswered.is_none() || seq != self.seq {
            return;
        }
        self.asking_ms = 0;
        self.quiet_until_ms = now.saturating_add(RETRY_MS);
    }

    /// The answer to the call asked at `asked_ms`, arriving at `now`.
    pub fn granted(&mut self, lease: Leased, asked_ms: u64, now: u64, answer: LeaseResponse) {
        self.asking_ms = 0;
        self.unanswered = None;
        // The shim's window ends this long after it answered, so no later
        // than this long after the call was sent.
        let ends = asked_ms.saturating_add(answer.expires_in_ms.get());
        if answer.granted == 0 {
            // The window is spent: until it ends, only give-backs elsewhere
            // free tokens, which exact checks find.
            self.quiet_until_ms = ends.min(now.saturating_add(RETRY_MS));
            return;
        }
        let granted = u64::from(answer.granted);
        if now >= ends {
            // Its window is over already: the tokens are dead (a bucket's
            // go back on the next tick).
            if lease.source() == Source::Bucket {
                if answer.window != self.window {
                    *self = Pool { window: answer.window, tokens: 0, ended: 0, charged: 0, ..*self };
                }
                self.ended = self.ended.saturating_add(granted);
                self.charged = self.charged.saturating_add(granted);
            }
            return;
        }
        if answer.window != self.window || now >= self.ends_ms {
            // Tokens of another window, or dead ones, are replaced.
            self.tokens = 0;
            if answer.window != self.window {
                self.ended = 0;
                self.charged = 0;
            }
            self.window = answer.window;
            self.ends_ms = ends;
        } else {
            self.ends_ms = self.ends_ms.min(ends);
        }
        self.tokens = self.tokens.saturating_add(granted);
        self.charged = self.charged.saturating_add(granted);
        self.left = answer.remaining;
        self.expires_ms = now.saturating_add(lease.ttl_ms()).min(self.ends_ms);
    }

    /// The `RateLimit` header's view for a request admitted from the pool at
    /// `now`: what remains (the tokens held plus what the window had left at
    /// the last grant) and the milliseconds to the window's end. Off by what
    /// other gateways hold (not counted) and what they admitted since the
    /// last grant (still counted); see docs/leased-mode.md.
    pub fn view(&self, now: u64) -> (u64, u64) {
        (self.tokens.saturating_add(self.left), self.ends_ms.saturating_sub(now))
    }

    /// The call failed for good (the shim refused it, so it ran nothing):
    /// exact checks until a retry. Tokens it gave back stay charged until
    /// their window ends. (An answer that was lost is [`Pool::lost`].)
    pub fn failed(&mut self, now: u64) {
        self.asking_ms = 0;
        self.unanswered = None;
        self.quiet_until_ms = now.saturating_add(RETRY_MS);
    }

    /// Tokens of a window that has ended are dead: none is spent any more.
    fn drop_ended(&mut self, now: u64) {
        if now >= self.ends_ms {
            self.ended = self.ended.saturating_add(std::mem::take(&mut self.tokens));
        }
    }

    /// The form stored in shared data: `L3` and the fields in order, the
    /// unanswered call as a flag (0 or 1), its `want`, its give-back's
    /// window, tokens (0 tokens: none) and charged (0: none).
    pub fn encode(&self) -> Vec<u8> {
        let (flag, ask) = match self.unanswered {
            Some(ask) => (1, ask),
            None => (0, Ask { want: 0, give_back: None }),
        };
        let back = ask.give_back.unwrap_or(GiveBack { window: 0, tokens: 0, charged: None });
        format!(
            "L3 {} {} {} {} {} {} {} {} {} {flag} {} {} {} {} {} {} {}",
            self.window,
            self.tokens,
            self.ends_ms,
            self.expires_ms,
            self.asking_ms,
            self.quiet_until_ms,
            self.demand_ms,
            self.gateway,
            self.seq,
            ask.want,
            back.window,
            back.tokens,
            self.left,
            back.charged.unwrap_or(0),
            self.ended,
            self.charged,
        )
        .into_bytes()
    }

    /// Reads [`Pool::encode`]'s form, the `L2` form before a bucket's
    /// fields, or the `L1` form before lost answers were sent again (the
    /// first seven fields); `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<Pool> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut parts = text.split(' ');
        let version = parts.next()?;
        if !["L1", "L2", "L3"].contains(&version) {
            return None;
        }
        let mut field = || parts.next()?.parse::<u64>().ok();
        let mut pool = Pool {
            window: field()?,
            tokens: field()?,
            ends_ms: field()?,
            expires_ms: field()?,
            asking_ms: field()?,
            quiet_until_ms: field()?,
            demand_ms: field()?,
            ..Pool::default()
        };
        if version != "L1" {
            pool.gateway = field()?;
            pool.seq = field()?;
            let flag = field()?;
            let want = u32::try_from(field()?).ok()?;
            let back_window = field()?;
            let back_tokens = u32::try_from(field()?).ok()?;
            pool.left = field()?;
            let charged = if version == "L3" {
                let back_charged = u32::try_from(field()?).ok()?;
                pool.ended = field()?;
                pool.charged = field()?;
                (back_charged > 0).then_some(back_charged)
            } else {
                None
            };
            let give_back =
                (back_tokens > 0).then_some(GiveBack { window: back_window, tokens: back_tokens, charged });
            pool.unanswered = match flag {
                0 => None,
                1 => Some(Ask { want, give_back }),
                _ => return None,
            };
        }
        parts.next().is_none().then_some(pool)
    }
}

/// The shared data key of policy `name`'s pool.
pub fn pool_key(name: &str) -> String {
    format!("sluice:lease:{name}")
}

/// The shared data key of the pool of a keyed policy `name`'s hot key
/// `key` (encoded, as the shim takes it).
pub fn key_pool_key(name: &str, key: &str) -> String {
    format!("sluice:lease:{name}:{key}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policies::units::Millis;

    fn lease() -> Leased {
        Leased::new(10, 2_000).expect("valid")
    }

    fn answer(granted: u32, window: u64, expires_in_ms: u64) -> LeaseResponse {
        LeaseResponse { granted, window, expires_in_ms: Millis(expires_in_ms), remaining: 0 }
    }

    /// Empty at first: the request goes to the shim, and the next tick asks
    /// for a whole lease, once.
    #[test]
    fn an_empty_pool_asks_once_demand_is_seen() {
        let mut pool = Pool::default();
        assert_eq!(pool.tick(lease(), 1_000), None, "no demand, no call");
        assert_eq!(pool.spend(1_000), None);
        assert_eq!(pool.tick(lease(), 1_010), Some(Ask { want: 10, give_back: None }));
        assert_eq!(pool.tick(lease(), 1_030), None, "one call at a time");
        pool.granted(lease(), 1_010, 1_012, answer(10, 7, 500));
        assert_eq!((pool.tokens, pool.ends_ms, pool.expires_ms), (10, 1_510, 1_510));
        assert_eq!(pool.spend(1_020), Some(Token { window: 7 }));
    }

    /// Half a lease or fewer: the next one is asked for, and added.
    #[test]
    fn the_next_lease_comes_at_half() {
        let mut pool = Pool::default();
        pool.spend(0);
        pool.tick(lease(), 10);
        pool.granted(lease(), 10, 11, answer(10, 1, 60_000));
        for t in 0..4 {
            assert!(pool.spend(20 + t).is_some());
        }
        assert_eq!(pool.tick(lease(), 30), None, "6 left, above the low water");
        assert!(pool.spend(31).is_some());
        assert_eq!(pool.tick(lease(), 40), Some(Ask { want: 10, give_back: None }));
        pool.granted(lease(), 40, 41, answer(10, 1, 59_000));
        assert_eq!(pool.tokens, 15, "at most held_at_most");
        assert!(pool.tokens <= lease().held_at_most());
        assert_eq!(pool.ends_ms, 59_040, "the earlier of the two ends");
    }

    /// No token is spent at or after the window's end, measured from the ask.
    #[test]
    fn tokens_die_with_their_window() {
        let mut pool = Pool::default();
        pool.spend(0);
        pool.tick(lease(), 100);
        pool.granted(lease(), 100, 150, answer(10, 3, 200));
        assert!(pool.spend(299).is_some());
        assert_eq!(pool.spend(300), None);
        assert_eq!(pool.tokens, 0);
        pool.unspend(Token { window: 3 }, 300);
        assert_eq!(pool.tokens, 0, "a token of an ended window never comes back");
    }

    /// A grant that arrives after its window ended adds nothing; one of a
    /// new window replaces the old window's tokens.
    #[test]
    fn late_and_new_windows() {
        let mut pool = Pool::default();
        pool.spend(0);
        pool.tick(lease(), 0);
        pool.granted(lease(), 0, 60, answer(10, 1, 50));
        assert_eq!(pool.tokens, 0);
        pool.spend(60);
        pool.tick(lease(), 60);
        pool.granted(lease(), 60, 61, answer(10, 2, 1_000));
        assert_eq!((pool.window, pool.tokens), (2, 10));
        pool.unspend(Token { window: 1 }, 62);
        assert_eq!(pool.tokens, 10, "another window's token is not put back");
        pool.unspend(Token { window: 2 }, 62);
        assert_eq!(pool.tokens, 11);
    }

    /// `ttl` after the last grant, unused tokens leave the pool in the same
    /// step that asks to give them back; with demand, a new lease is asked too.
    #[test]
    fn unused_tokens_go_back_after_the_ttl() {
        let mut pool = Pool::default();
        pool.spend(0);
        pool.tick(lease(), 0);
        pool.granted(lease(), 0, 1, answer(10, 5, 60_000));
        pool.spend(2);
        assert_eq!(pool.tick(lease(), 2_000), None, "not yet");
        let back = Some(GiveBack { window: 5, tokens: 9, charged: None });
        assert_eq!(pool.tick(lease(), 2_001), Some(Ask { want: 10, give_back: back }), "demand 2 ms ago");
        assert_eq!(pool.tokens, 0);
        pool.failed(2_005);
        assert_eq!(pool.tick(lease(), 2_500), None, "quiet after a failure");
        assert_eq!(pool.tick(lease(), 3_005), None, "no demand since");
        assert_eq!(pool.spend(3_006), None);
        assert_eq!(pool.tick(lease(), 3_010), Some(Ask { want: 10, give_back: None }));
    }

    /// A grant of nothing: the window is spent; quiet for a second, or until
    /// it ends if sooner.
    #[test]
    fn a_spent_window_quiets_the_pool() {
        let mut pool = Pool::default();
        pool.spend(0);
        pool.tick(lease(), 0);
        pool.granted(lease(), 0, 1, answer(0, 5, 300));
        assert_eq!(pool.quiet_until_ms, 300);
        assert_eq!(pool.tick(lease(), 299), None);
        pool.spend(300);
        assert!(pool.tick(lease(), 300).is_some());
    }

    /// An unanswered call is given up after [`ASK_TIMEOUT_MS`].
    #[test]
    fn a_lost_call_is_given_up() {
        let mut pool = Pool::default();
        pool.spend(0);
        assert!(pool.tick(lease(), 0).is_some());
        pool.spend(ASK_TIMEOUT_MS);
        assert_eq!(pool.tick(lease(), ASK_TIMEOUT_MS), None);
        assert!(pool.tick(lease(), ASK_TIMEOUT_MS + 1).is_some());
    }

    /// A lost answer: the same call (same id, same give-back) goes again
    /// after the retry pause, with or without demand, until answered; an
    /// answer to an older call is dropped.
    #[test]
    fn a_lost_answer_sends_the_same_call_again() {
        let mut pool = Pool::default();
        pool.adopt(42);
        pool.spend(0);
        pool.tick(lease(), 0);
        pool.granted(lease(), 0, 1, answer(10, 5, 60_000));
        let first = pool.call_id();
        pool.spend(2);
        let ask = pool.tick(lease(), 2_001).expect("give back, ask again");
        let id = pool.call_id();
        assert_eq!((id.gateway, id.seq), (42, first.seq + 1));
        pool.lost(id.seq, 2_005);
        assert_eq!(pool.tick(lease(), 2_500), None, "quiet after a loss");
        assert_eq!(pool.tick(lease(), 3_005), Some(ask), "the same call, though nobody asked since");
        assert_eq!(pool.call_id(), id);
        assert!(!pool.answered(first.seq, lease(), 3_005, 3_006, answer(10, 5, 50_000)), "an older call's");
        assert!(pool.answered(id.seq, lease(), 3_005, 3_006, answer(10, 5, 50_000)));
        assert_eq!((pool.tokens, pool.unanswered), (10, None));
        assert!(!pool.answered(id.seq, lease(), 3_005, 3_007, answer(10, 5, 50_000)), "taken once");
        assert_eq!(pool.tokens, 10);
        let stored = Pool { unanswered: Some(ask), ..pool };
        assert_eq!(Pool::decode(&stored.encode()), Some(stored));
        assert_eq!(Pool::decode(b"L1 1 2 3 4 5 6 7").map(|p| (p.tokens, p.unanswered)), Some((2, None)));
    }

    fn bucket_lease() -> Leased {
        lease().taken_from(Source::Bucket)
    }

    /// A bucket's tokens, dead at their period's end, go back on the next
    /// tick with what the pool was charged for the period; a window's are
    /// dropped. A bucket's grant that arrives after its period ended goes
    /// back too.
    #[test]
    fn a_buckets_tokens_go_back_at_their_periods_end() {
        let mut pool = Pool::default();
        pool.spend(0);
        pool.tick(bucket_lease(), 0);
        pool.granted(bucket_lease(), 0, 1, answer(10, 7, 500));
        assert_eq!((pool.tokens, pool.ends_ms, pool.charged), (10, 500, 10));
        for t in 0..6 {
            assert!(pool.spend(10 + t).is_some());
        }
        assert_eq!(
            pool.tick(bucket_lease(), 20),
            Some(Ask { want: 10, give_back: None }),
            "4 left: half a lease"
        );
        pool.granted(bucket_lease(), 20, 21, answer(10, 7, 470));
        assert_eq!((pool.tokens, pool.ends_ms, pool.charged), (14, 490, 20));
        assert_eq!(pool.spend(490), None, "dead at the end");
        assert_eq!((pool.tokens, pool.ended), (0, 14));
        let back = Some(GiveBack { window: 7, tokens: 14, charged: Some(20) });
        assert_eq!(pool.tick(bucket_lease(), 495), Some(Ask { want: 10, give_back: back }));
        assert_eq!((pool.ended, pool.charged), (0, 6));
        // The next period's grant, arriving after it ended: its tokens go back.
        pool.granted(bucket_lease(), 495, 900, answer(3, 8, 100));
        assert_eq!((pool.window, pool.tokens, pool.ended, pool.charged), (8, 0, 3, 3));
        let back = Some(GiveBack { window: 8, tokens: 3, charged: Some(3) });
        assert_eq!(pool.tick(bucket_lease(), 901).and_then(|a| a.give_back), back);
        // A window's dead tokens need no call.
        let mut pool = Pool::default();
        pool.spend(0);
        pool.tick(lease(), 0);
        pool.granted(lease(), 0, 1, answer(10, 7, 500));
        assert_eq!(pool.spend(500), None);
        assert_eq!(
            pool.tick(lease(), 501).map(|a| a.give_back),
            Some(None),
            "asks again, gives nothing back"
        );
        assert_eq!(pool.ended, 0);
        let stored =
            Pool { ended: 3, charged: 9, unanswered: Some(Ask { want: 1, give_back: back }), ..pool };
        assert_eq!(Pool::decode(&stored.encode()), Some(stored));
    }

    #[test]
    fn encodes_and_refuses_anything_else() {
        let pool = Pool {
            window: 1,
            tokens: 2,
            ends_ms: 3,
            expires_ms: 4,
            asking_ms: 5,
            quiet_until_ms: 6,
            demand_ms: 7,
            ..Pool::default()
        };
        assert_eq!(Pool::decode(&pool.encode()), Some(pool));
        for bad in
            [&b""[..], b"L1 1 2 3", b"L1 1 2 3 4 5 6 7 8", b"L2 1 2 3 4 5 6 7", b"L1 1 2 3 4 5 6 -7", b"\xff"]
        {
            assert_eq!(Pool::decode(bad), None, "{bad:?}");
        }
    }
}
