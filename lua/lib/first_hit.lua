-- requires: common, counter
-- first_hit: a fixed_window with start: first_hit. A window starts at the
-- first request a key counts once its last window ended, and lasts window
-- from there. Twin of policies/src/algorithm/first_hit.rs.
--
-- State: a hash with the window's start `s` and its count `n`. The window
-- of now is the stored one while now < s + window; past its end (or with
-- none stored) a window would start at now, and starts only if the request
-- is counted. A request of cost passes while the count plus cost is at
-- most limit (counter.lua); every view resets at the window's end, which is
-- also the key's expiry (plus a second). A clock stepped back keeps the
-- stored window until its end.
local function first_hit(key, now, limit, window, cost)
  local state = redis.call('HMGET', key, 's', 'n')
  local start, count = tonumber(state[1]), tonumber(state[2]) or 0
  if not start or now >= start + window then start, count = now, 0 end
  return counter(key, 's', start, count, limit, cost, start + window - now)
end
