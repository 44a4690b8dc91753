//! What a check decides, as the scripts answer it: the reply of one Redis
//! slot ([`SlotReply`], read by [`decode`]), its outcomes split into the
//! request's checks ([`by_check`]), and why a request could not be decided
//! ([`CheckError`]). The deciding, waiting and observing code all speak it;
//! it uses no other module of the shim.

use sluice_policies::units::{Micros, Millis};
use sluice_policies::wire::{CheckOutcome, CheckRequest, LimitOutcome};

/// Why a request could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The request is malformed; answered with 400.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Redis failed or answered nonsense; answered with 503.
    #[error("store: {0}")]
    Store(String),
}

/// A request refused by the checks of the wire or of its keys.
impl From<sluice_policies::Invalid> for CheckError {
    fn from(invalid: sluice_policies::Invalid) -> CheckError {
        CheckError::BadRequest(invalid.to_string())
    }
}

/// One slot's answer to a check.
pub(crate) struct SlotReply {
    pub allowed: bool,
    pub retry_after_ms: Option<Millis>,
    /// The time the script charged at, for a refund.
    pub now: i64,
    pub limits: Vec<LimitOutcome>,
    /// The waiting path (`lua/lib/reserve.lua`): the slot admitted at, in µs.
    pub at: Option<u64>,
}

/// The outcomes of every limit, in order, split into the request's checks.
/// The pauses of checks with upstream feedback come after every limit, in
/// the checks' order (`keys::script_limits`): each becomes its check's
/// `paused_ms`.
pub(crate) fn by_check(
    req: &CheckRequest<'_>,
    outcomes: impl Iterator<Item = LimitOutcome>,
) -> Vec<CheckOutcome> {
    let mut outcomes = outcomes.collect::<Vec<_>>().into_iter();
    let mut checks: Vec<CheckOutcome> = req
        .checks
        .iter()
        .map(|c| CheckOutcome { limits: outcomes.by_ref().take(c.limits.len()).collect(), paused_ms: None })
        .collect();
    for (_, outcome) in req.checks.iter().zip(&mut checks).filter(|(c, _)| c.upstream) {
        outcome.paused_ms = outcomes.next().map(|pause| pause.reset_ms).filter(|ms| ms.get() > 0);
    }
    checks
}

pub(crate) fn store_error(err: redis::RedisError) -> CheckError {
    CheckError::Store(format!("redis: {err}"))
}

/// Reads the check script's flat reply (see `lua/scripts/check.lua`). A retry of -1 is
/// unknown; a held_until of 0 is none. The waiting path (`lua/lib/reserve.lua`)
/// adds one number: the slot it admitted the request at, 0 when denied.
pub(crate) fn decode(limits: usize, reply: &[i64]) -> Option<SlotReply> {
    let (head, rest) = reply.split_at_checked(3)?;
    let (rest, at) = match rest.len().checked_sub(7 * limits)? {
        0 => (rest, None),
        1 => (&rest[..7 * limits], u64::try_from(rest[7 * limits]).ok().filter(|&t| t > 0)),
        _ => return None,
    };
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let retry = |n: i64| u64::try_from(n).ok().map(Millis);
    let limits = rest
        .chunks_exact(7)
        .map(|r| LimitOutcome {
            allowed: r[0] == 1,
            remaining: count(r[1]),
            reset_ms: Millis(count(r[2])),
            retry_after_ms: retry(r[3]),
            reclaimed: count(r[4]),
            held_until_us: u64::try_from(r[5]).ok().filter(|&t| t > 0).map(Micros),
            refunded_us: Micros(count(r[6])),
        })
        .collect();
    Some(SlotReply { allowed: head[0] == 1, retry_after_ms: retry(head[1]), now: head[2], limits, at })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_error_is_a_std_error_that_names_its_cause() {
        let err: Box<dyn std::error::Error> = Box::new(CheckError::Store("redis: connection refused".into()));
        assert_eq!(err.to_string(), "store: redis: connection refused");
        assert_eq!(CheckError::BadRequest("no checks".into()).to_string(), "bad request: no checks");
    }
}
