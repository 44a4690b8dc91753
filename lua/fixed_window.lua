-- fixed_window: one counter per window aligned to the epoch.
-- Twin of policies/src/algorithm/fixed_window.rs.
--
-- The window of now is now / window; it ends at (index + 1) * window. A
-- request passes while the window's count is below limit. State: a hash with
-- the window index `w` and its count `n`.
local function fixed_window(key, now, limit, window)
  local index = window_index(now, window)
  local stop = (index + 1) * window
  local state = redis.call('HMGET', key, 'w', 'n')
  local count = 0
  if tonumber(state[1]) == index then count = tonumber(state[2]) end
  local reset = stop - now
  local allowed = count < limit
  return {
    allowed = allowed,
    now = {math.max(limit - count, 0), reset},
    after = {math.max(limit - count - 1, 0), reset},
    retry = allowed and 0 or reset,
    reclaimed = 0,
    commit = function()
      redis.call('HSET', key, 'w', index, 'n', count + 1)
      redis.call('PEXPIRE', key, ceil_ms(reset) + 1000)
    end,
  }
end
