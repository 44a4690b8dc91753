//! `sliding_window`: an exact log. Twin of `lua/lib/sliding_window.lua`.
//!
//! One entry per admitted request, scored by its time. An entry admitted at
//! `s` counts while `now < s + window`, so over any interval one window long
//! at most `limit` requests are admitted.

use super::slot::{Committed, Slot};
use super::{Found, State, View};

pub fn check(state: Option<&State>, now: u64, id: &str, limit: u64, window: u64) -> Found {
    // Entries at or before now - window have expired.
    let mut live: Vec<(u64, String)> = match state {
        Some(State::Set(entries)) => entries.iter().filter(|(s, _)| s + window > now).cloned().collect(),
        _ => Vec::new(),
    };
    live.sort();
    let count = live.len() as u64;
    let oldest = live.first().map(|(s, _)| *s);
    let allowed = count < limit;
    // Without this request, capacity next frees when the oldest entry expires.
    let reset_now = oldest.map_or(0, |s| s + window - now);
    let reset_after = oldest.map_or(window, |s| s + window - now);
    // The request fits once all but limit - 1 entries have expired: when the
    // entry at rank count - limit (oldest first) does.
    let retry = if allowed { 0 } else { live[(count - limit) as usize].0 + window - now };
    let pruned = State::Set(live.clone());
    live.push((now, id.to_string()));
    Found {
        allowed,
        now: View { remaining: limit.saturating_sub(count), reset_us: reset_now },
        after: View { remaining: limit.saturating_sub(count + 1), reset_us: reset_after },
        retry_us: Some(retry),
        reclaimed: 0,
        held_until: None,
        pruned: Some(pruned),
        commit: Some(State::Set(live)),
    }
}

/// Waiting (`reserve`): the earliest `t` at or after `now`, and at or after
/// the newest entry (reservations keep arrival order), at which fewer than
/// `limit` entries lie in `(t - span, t]`, `span = window + margin`. Entries
/// may be in the future: they count. With `t` at or after every entry, that
/// holds once the entry at rank `count - limit` (oldest first) is at or
/// before `t - span`.
pub fn reserve(state: Option<&State>, now: u64, id: &str, limit: u64, window: u64, margin: u64) -> Slot {
    let span = window + margin;
    let mut live: Vec<(u64, String)> = match state {
        Some(State::Set(entries)) => entries.iter().filter(|(s, _)| s + span > now).cloned().collect(),
        _ => Vec::new(),
    };
    live.sort();
    let count = live.len() as u64;
    let mut at = now.max(live.last().map_or(0, |(s, _)| *s));
    if count >= limit {
        at = at.max(live[(count - limit) as usize].0 + span);
    }
    let id = id.to_string();
    Slot {
        at: Some(at),
        remaining_now: limit.saturating_sub(count),
        pruned: Some(State::Set(live.clone())),
        commit: Box::new(move |t| {
            let counting: Vec<u64> = live.iter().map(|(s, _)| *s).filter(|s| s + span > t).collect();
            let oldest = counting.first().copied().unwrap_or(t);
            let view = View {
                remaining: limit.saturating_sub(counting.len() as u64 + 1),
                reset_us: oldest + span - t,
            };
            // ZADD: an entry already under this id (a mixed waiter's earlier
            // slot) moves to t.
            let mut entries: Vec<(u64, String)> = live.iter().filter(|(_, m)| *m != id).cloned().collect();
            entries.push((t, id.clone()));
            Committed { state: State::Set(entries), view, held_until: None, extra: Vec::new() }
        }),
    }
}

/// At its slot (`confirm`): the held request may be sent while fewer than
/// `limit` other entries lie in `(now - span, now]`; a request that woke
/// late may find entries sent since (or moved there late) in its way, and
/// waits until enough of them leave. Sent, its entry moves to `now`, where
/// the partner sees it. `None` when its entry is gone. The due time and the
/// state to store once sent.
pub fn confirm(
    state: Option<&State>,
    now: u64,
    id: &str,
    limit: u64,
    window: u64,
    margin: u64,
) -> Option<(u64, Option<State>)> {
    let span = window + margin;
    let Some(State::Set(entries)) = state else { return None };
    let &(score, _) = entries.iter().find(|(_, m)| m == id)?;
    if score > now {
        return Some((score, None));
    }
    let mut others: Vec<(u64, &String)> = entries
        .iter()
        .filter(|(s, m)| m != id && s + span > now && *s <= now)
        .map(|(s, m)| (*s, m))
        .collect();
    others.sort();
    let count = others.len() as u64;
    let due = if count >= limit { others[(count - limit) as usize].0 + span } else { now };
    let mut sent: Vec<(u64, String)> = entries.iter().filter(|(_, m)| m != id).cloned().collect();
    sent.push((now, id.to_string()));
    Some((due, Some(State::Set(sent))))
}

/// Cancellation (`cancel`): removes the request's entry; it was never sent.
pub fn cancel(state: Option<&mut State>, id: &str) {
    if let Some(State::Set(entries)) = state {
        entries.retain(|(_, m)| m != id);
    }
}
