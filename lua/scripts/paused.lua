-- requires: common
-- paused: how much longer the partner's pauses hold (upstream feedback),
-- for a request held until its slot. Twin of policies/src/algorithm/pause.rs,
-- check() (its retry).
--
-- KEYS[i]   pause keys
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- Returns the longest time left, in microseconds; 0 when none holds.
local now = clock(ARGV[1])
local left = 0
for _, key in ipairs(KEYS) do
  local untl = tonumber(redis.call('GET', key)) or 0
  left = math.max(left, untl - now)
end
return left
