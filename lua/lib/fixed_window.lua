-- requires: common, counter
-- fixed_window: one counter per window aligned to the epoch.
-- Twin of policies/src/algorithm/fixed_window.rs.
--
-- The window of now is now / window; it ends at (index + 1) * window. A
-- request of cost (1, or an RLS call's hits_addend) passes while the
-- window's count plus cost is at most limit (counter.lua). State: a hash
-- with the window index `w` and its count `n`.
--
-- The hash holds one window, and it never goes back to an older one. A stored
-- window newer than now's means now's window is full (a reservation moves on
-- to a later window only when the current one is full) or the clock stepped
-- back; either way nothing is admitted before the stored window, which keeps
-- its count.
local function fixed_window(key, now, limit, window, cost)
  local index = window_index(now, window)
  local state = redis.call('HMGET', key, 'w', 'n')
  local stored = tonumber(state[1])
  if stored and stored > index then
    local wait = stored * window - now
    if tonumber(state[2]) + cost > limit then wait = wait + window end
    return {
      allowed = false,
      now = {0, wait},
      after = {0, wait},
      retry = wait,
      reclaimed = 0,
      commit = function() end,
    }
  end
  local count = 0
  if stored == index then count = tonumber(state[2]) end
  return counter(key, 'w', index, count, limit, cost, (index + 1) * window - now)
end

-- Waiting (reserve.lua): the earliest time at or after now at which a window
-- has room. The stored window, if not older than now's, is where counting
-- goes on; past a full one the next window is empty. A slot in a later window
-- than now's moves on by margin, and so does one in a window that already
-- holds requests (arrival order). Any time after `at` is admissible too, so
-- the request may be committed at a later t: it counts in the window of t.
local function fixed_window_reserve(key, now, limit, window, margin)
  local current = window_index(now, window)
  local state = redis.call('HMGET', key, 'w', 'n')
  local stored, count = tonumber(state[1]), tonumber(state[2]) or 0
  local index, n = current, 0
  if stored and stored >= current then index, n = stored, count end
  local remaining_now = 0
  if index == current then remaining_now = math.max(limit - n, 0) end
  if n >= limit then index, n = index + 1, 0 end
  -- Reservations keep arrival order: a window already holding requests may
  -- hold some reserved at its start + margin, so nobody goes before that.
  local at = now
  if index > current then
    at = index * window + margin
  elseif index == stored then
    at = math.max(now, index * window + margin)
  end
  return {
    at = at,
    remaining_now = remaining_now,
    commit = function(t)
      local slot = window_index(t, window)
      local held = 0
      if slot == stored then held = count end
      redis.call('HSET', key, 'w', slot, 'n', held + 1)
      local stop = (slot + 1) * window
      redis.call('PEXPIRE', key, ceil_ms(stop - now) + 1000)
      return {math.max(limit - held - 1, 0), stop - t}
    end,
  }
end

-- At its slot (confirm.lua): a held request sent in the window its slot
-- was counted in is counted; one that woke past that window's end is
-- counted again in now's window if it has room (a past window's count
-- stays: it can admit nothing more), else it waits for the next window with
-- room. Nothing marks a fixed window's requests: it is never gone (nil).
local function fixed_window_confirm(key, now, at, limit, window, margin)
  local slot, current = window_index(at, window), window_index(now, window)
  local none = function() end
  if now < at then return {due = at, commit = none} end
  if current == slot then return {due = now, commit = none} end
  local state = redis.call('HMGET', key, 'w', 'n')
  local stored, count = tonumber(state[1]), tonumber(state[2]) or 0
  if stored and stored > current then return {due = stored * window + margin, commit = none} end
  if stored == current and count >= limit then return {due = (current + 1) * window + margin, commit = none} end
  if stored ~= current then count = 0 end
  return {
    due = now,
    commit = function()
      redis.call('HSET', key, 'w', current, 'n', count + 1)
      redis.call('PEXPIRE', key, ceil_ms((current + 1) * window - now) + 1000)
    end,
  }
end

-- Cancellation (cancel.lua): gives back a held reservation's count while its
-- window is still the stored one; it was never sent.
local function fixed_window_cancel(key, now, at, window)
  local slot = window_index(at, window)
  local state = redis.call('HMGET', key, 'w', 'n')
  if tonumber(state[1]) == slot and (tonumber(state[2]) or 0) > 0 then
    redis.call('HINCRBY', key, 'n', -1)
  end
end
