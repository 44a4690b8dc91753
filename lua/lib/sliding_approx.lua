-- requires: common
-- sliding_approx: the sliding window in O(1) memory.
-- Twin of policies/src/algorithm/sliding_approx.rs.
--
-- A hash keeps the window index `w`, its count `c` and the previous window's
-- count `p`. The estimate of the last window is the previous count weighted by
-- the share of it that still overlaps, plus the current count. A request
-- passes if the estimate, with it, stays within limit:
--   previous * (window - elapsed) + (current + 1) * window <= limit * window
--
-- The hash never goes back to an older window: after the clock steps back,
-- the stored newer window stays the current one, seen from its start, so
-- its counts are kept and the wait runs to the same moments.
local function sliding_approx_wait(current, previous, limit, window, elapsed)
  if current < limit and previous > 0 then
    -- Later in this window: previous * (window - e) <= (limit - current - 1) * window.
    local room = math.floor((limit - current - 1) * window / previous)
    local at = window - math.min(room, window)
    if at < window then
      -- At least 1: rounding must not turn a denial into "now".
      return math.max(at - elapsed, 1)
    end
  end
  -- In the next window the current count is the previous one.
  local at = 0
  if current > 0 then at = window - math.min(math.floor((limit - 1) * window / current), window) end
  return window - elapsed + at
end

local function sliding_approx(key, now, limit, window)
  local index = window_index(now, window)
  local state = redis.call('HMGET', key, 'w', 'c', 'p')
  local w, current, previous = tonumber(state[1]), 0, 0
  if w and w > index then index = w end
  -- Before the stored window starts (a clock step back), its start.
  local elapsed = math.max(now - index * window, 0)
  local ahead = math.max(index * window - now, 0)
  if w == index then
    current, previous = tonumber(state[2]), tonumber(state[3])
  elseif w and w + 1 == index then
    previous = tonumber(state[2])
  end
  local weighted = previous * (window - elapsed)
  local allowed = weighted + (current + 1) * window <= limit * window
  local function remaining(charged)
    return math.max(math.floor((limit * window - (weighted + charged * window)) / window), 0)
  end
  local retry = 0
  if not allowed then retry = sliding_approx_wait(current, previous, limit, window, elapsed) + ahead end
  local reset = window - elapsed + ahead
  return {
    allowed = allowed,
    now = {remaining(current), reset},
    after = {remaining(current + 1), reset},
    retry = retry,
    reclaimed = 0,
    commit = function()
      redis.call('HSET', key, 'w', index, 'c', current + 1, 'p', previous)
      -- The counts matter until the end of the next window.
      redis.call('PEXPIRE', key, ceil_ms(reset) + ceil_ms(window) + 1000)
    end,
  }
end
