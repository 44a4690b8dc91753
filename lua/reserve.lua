-- reserve: the waiting path of check.lua, for a request that may be held up
-- to wait microseconds. Twin of policies/src/algorithm/reserve.rs.
--
-- Each limit names the earliest time at or after now at which it admits the
-- request; past that time it keeps admitting it (reservations on a key keep
-- arrival order, so nothing recorded lies beyond a later slot). The request's
-- slot t is the latest of these. If t - now <= wait, every limit is charged
-- at t and the shim holds its answer until t; otherwise nothing changes but
-- expired entries, and the reply says how far away t is (-1: never).
--
-- ARGV[4n+3 + i]   limit i's margin in microseconds (n limits)
--
-- Returns check.lua's reply, then the slot t in microseconds (0 when denied).
-- Per limit: allowed_i is whether its own slot lies within the wait; remaining
-- is what it still admits (after the request at t, or at now if denied);
-- reset_ms is, when admitted, the time from t until it frees capacity, and
-- when denied its own wait, as is retry_ms.
local function reserve(now, id, wait)
  local n = #KEYS
  local found = {}
  local at, never = now, false
  for i, key in ipairs(KEYS) do
    local base = 4 * i - 1
    local kind = ARGV[base]
    local a, b, c = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
    local margin = tonumber(ARGV[4 * n + 3 + i]) or 0
    local f
    if kind == 'fixed_window' then
      f = fixed_window_reserve(key, now, a, b, margin)
    elseif kind == 'sliding_window' then
      f = sliding_window_reserve(key, now, id, a, b, margin)
    elseif kind == 'gcra' then
      f = gcra_reserve(key, now, a, b, c, margin)
    else
      return redis.error_reply('cannot wait on ' .. tostring(kind))
    end
    found[i] = f
    if f.at < 0 then never = true elseif f.at > at then at = f.at end
  end
  local allowed = (not never) and at - now <= wait
  local retry = 0
  if never then retry = -1 elseif not allowed then retry = ceil_ms(at - now) end
  local reply = {allowed and 1 or 0, retry, now}
  for _, f in ipairs(found) do
    local own = -1
    if f.at >= 0 then own = ceil_ms(f.at - now) end
    if allowed then
      local view, held = f.commit(at)
      for _, v in ipairs({1, view[1], ceil_ms(view[2]), 0, 0, held or 0}) do reply[#reply + 1] = v end
    else
      local fits = (f.at >= 0 and f.at - now <= wait) and 1 or 0
      for _, v in ipairs({fits, f.remaining_now, math.max(own, 0), own, 0, 0}) do reply[#reply + 1] = v end
    end
  end
  reply[#reply + 1] = allowed and at or 0
  return reply
end
