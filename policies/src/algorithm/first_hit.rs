//! `fixed_window` with `start: first_hit`: a window starts at the first
//! request a key counts once its last window ended, and lasts `window` from
//! there. Twin of `lua/lib/first_hit.lua`.
//!
//! The state is the window's start and its count (a hash `s`, `n`). The
//! window of `now` is the stored one while `now < s + window`; past its end
//! (or with none stored) a window would start at `now`, and starts only if
//! the request is counted: a refusal starts nothing, as it charges nothing.
//! A request of `cost` passes while the window's count plus `cost` is at
//! most `limit` ([`counter`]); every view
//! resets at the window's end, which is also the key's own expiry in Redis
//! (plus a second's slack), so a refusal's wait is the window's time left.
//! A clock stepped back (`now < s`) keeps the stored window until its end.

use super::{counter, Found, State};

pub fn check(state: Option<&State>, now: u64, limit: u64, window: u64, cost: u64) -> Found {
    let (start, count) = match state {
        Some(&State::Counter { window: start, count }) if now < start.saturating_add(window) => {
            (start, count)
        }
        _ => (now, 0),
    };
    counter::check(start, count, limit, cost, start + window - now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(state: &mut Option<State>, now: u64) -> Found {
        let f = check(state.as_ref(), now, 2, 1_000, 1);
        if f.allowed {
            *state = f.commit.clone();
        }
        f
    }

    /// The window opens at the first request, not at a multiple of the
    /// window: two at 1,500 and 2,400 fill it, 2,499 is refused until
    /// 2,500, when the next window opens.
    #[test]
    fn the_window_runs_from_the_first_hit() {
        let mut state = None;
        assert!(run(&mut state, 1_500).allowed);
        assert!(run(&mut state, 2_400).allowed);
        let refused = run(&mut state, 2_499);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_us, Some(1));
        assert_eq!((refused.now.remaining, refused.now.reset_us), (0, 1));
        let next = run(&mut state, 2_500);
        assert!(next.allowed);
        assert_eq!((next.after.remaining, next.after.reset_us), (1, 1_000));
        assert_eq!(state, Some(State::Counter { window: 2_500, count: 1 }));
    }
}
