-- requires: common, slots
-- reserve: the waiting path of check.lua, for a request that may be held up
-- to wait microseconds. Twin of policies/src/algorithm/reserve.rs.
--
-- The request's slot is where every limit admits it (slots.lua). If it lies
-- within the wait, every limit is charged there and the shim holds its
-- answer until then; otherwise nothing changes but expired entries, and the
-- reply says how far away the slot is (-1: never).
--
-- ARGV[5n+3 + i]   limit i's margin in microseconds (n limits)
-- ARGV[6n+4]       optional: 'hold' holds a slot at now too (a mixed
--     request, which must still take its concurrency slot), else a slot at
--     now is sent at once
--
-- Returns check.lua's reply, then the slot t in microseconds (0 when denied).
-- Per limit: allowed_i is whether its own slot lies within the wait; remaining
-- is what it still admits (after the request at t, or at now if denied);
-- reset_ms is, when admitted, the time from t until it frees capacity, and
-- when denied its own wait, as is retry_ms.
-- Limit i of check.lua's arguments as a spec (slots.lua), with its margin.
local function spec_of(i, key, margin)
  local base = 5 * i - 2
  return {
    key = key, kind = ARGV[base], a = tonumber(ARGV[base + 1]), b = tonumber(ARGV[base + 2]),
    c = tonumber(ARGV[base + 3]), margin = margin,
  }
end

local function reserve(now, id, wait)
  local n = #KEYS
  local specs = {}
  for i, key in ipairs(KEYS) do
    specs[i] = spec_of(i, key, tonumber(ARGV[5 * n + 3 + i]) or 0)
  end
  local r, err = reserve_slots(now, id, wait, specs, ARGV[6 * n + 4] == 'hold')
  if not r then return redis.error_reply(err) end
  local retry = 0
  if r.at < 0 then retry = -1 elseif not r.allowed then retry = ceil_ms(r.at - now) end
  local reply = {r.allowed and 1 or 0, retry, now}
  for i, f in ipairs(r.found) do
    local own = -1
    if f.at >= 0 then own = ceil_ms(f.at - now) end
    if r.allowed then
      local view, held, refunded = r.committed[i][1], r.committed[i][2], r.committed[i][3]
      for _, v in ipairs({1, view[1], ceil_ms(view[2]), 0, 0, held, refunded}) do reply[#reply + 1] = v end
    else
      local fits = (f.at >= 0 and f.at - now <= wait) and 1 or 0
      for _, v in ipairs({fits, f.remaining_now, math.max(own, 0), own, 0, 0, 0}) do reply[#reply + 1] = v end
    end
  end
  reply[#reply + 1] = r.allowed and r.at or 0
  return reply
end
