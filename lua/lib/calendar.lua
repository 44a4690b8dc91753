-- requires: common, counter
-- calendar: one counter per calendar window, for fixed_window (cost 1) and
-- points (the request's cost) on a calendar. Twin of
-- policies/src/algorithm/calendar.rs.
--
-- Redis has no zone rules: the shim passes the ends of two consecutive
-- windows, e1 < e2, placed around its own clock, and a window is named by
-- its end. The window of now is e1 if now < e1, else e2 if now < e2: Redis's
-- clock may differ from the shim's by up to half a window and both still
-- name every window alike. Beyond both ends (the clocks differ by more) the
-- limit denies, its wait unknown (-1).
--
-- A request of cost passes while the window's count plus cost is at most
-- limit. State: a hash with the window's end `w` and its count `n`. It holds
-- one window and never goes back to an older one: a stored window newer
-- than now's (Redis's clock stepped back) admits nothing until now's ends.
local function calendar_window(now, e1, e2)
  if now < e1 then return e1 end
  if now < e2 then return e2 end
  return nil
end

local function calendar(key, now, limit, cost, e1, e2)
  local stop = calendar_window(now, e1, e2)
  local function denied(wait)
    local view = {0, math.max(wait, 0)}
    return {allowed = false, now = view, after = view, retry = wait, reclaimed = 0, commit = function() end}
  end
  if not stop then return denied(-1) end
  local reset = stop - now
  local state = redis.call('HMGET', key, 'w', 'n')
  local stored = tonumber(state[1])
  if stored and stored > stop then return denied(reset) end
  local count = 0
  if stored == stop then count = tonumber(state[2]) end
  local f = counter(key, 'w', stop, count, limit, cost, reset)
  -- A correction (adjust.lua) goes to the window the request was charged in.
  f.held_until, f.refunded = stop, 0
  return f
end

-- refund.lua: takes back a charge of cost made at `charged`, while its
-- window is still the stored one.
local function calendar_refund(key, charged, cost, e1, e2)
  local stop = calendar_window(charged, e1, e2)
  if stop and tonumber(redis.call('HGET', key, 'w')) == stop then
    local n = tonumber(redis.call('HGET', key, 'n')) or 0
    redis.call('HSET', key, 'n', math.max(n - cost, 0))
  end
end

-- adjust.lua: charges delta more (or refunds, when negative) into the
-- window the request was charged in (`window`, its end), while that window
-- is still the stored one and has not ended. A correction after its window
-- is dropped: the next window's budget is not the request's. The count
-- never goes below 0. Returns the units it moved.
local function calendar_adjust(key, now, delta, window)
  local state = redis.call('HMGET', key, 'w', 'n')
  if tonumber(state[1]) == window and now < window then
    local count = tonumber(state[2]) or 0
    local new = math.max(count + delta, 0)
    redis.call('HSET', key, 'n', new)
    return new - count
  end
  return 0
end
