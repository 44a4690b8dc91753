-- requires: common
-- lease: leased mode on one fixed_window. Twin of policies/src/algorithm/mod.rs,
-- lease(), and fixed_window.rs, give_back() and grant().
--
-- KEYS[1]   the fixed_window's state key
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2], ARGV[3]   the limit and the window in microseconds
-- ARGV[4]   the tokens wanted
-- ARGV[5], ARGV[6]   a give-back: the window index of its grant and its
--     tokens, or "" and 0
--
-- The give-back goes first: tokens a gateway never spent go back only into
-- the window they were granted from, while it is the stored one, and the
-- count never goes below 0 (a window that has ended keeps its count; the
-- next one starts at 0 whatever it says). Then up to `want` tokens of now's
-- window, charged at once: the count goes up by the grant before any of it
-- is spent, so the window never admits more than its limit.
--
-- Returns {granted, window index, microseconds to the window's end, remaining}.
local now = clock(ARGV[1])
local key = KEYS[1]
local limit, window, want = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local back_window, back = tonumber(ARGV[5]), tonumber(ARGV[6]) or 0

local state = redis.call('HMGET', key, 'w', 'n')
local stored, count = tonumber(state[1]), tonumber(state[2]) or 0
if back_window and back > 0 and stored == back_window then
  count = math.max(count - back, 0)
  redis.call('HSET', key, 'n', count)
end

local index = window_index(now, window)
local stop = (index + 1) * window
if stored and stored > index then
  return {0, index, stop - now, 0}
end
if stored ~= index then count = 0 end
local granted = math.min(want, math.max(limit - count, 0))
if granted > 0 then
  redis.call('HSET', key, 'w', index, 'n', count + granted)
  redis.call('PEXPIRE', key, ceil_ms(stop - now) + 1000)
end
return {granted, index, stop - now, math.max(limit - count - granted, 0)}
