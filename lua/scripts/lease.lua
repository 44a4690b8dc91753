-- requires: common, lease
-- lease: leased mode on one fixed_window. Twin of policies/src/algorithm/mod.rs,
-- lease_call(), and fixed_window.rs, give_back() and grant().
--
-- KEYS[1]   the fixed_window's state key
-- KEYS[2]   optional: the calls' record (a hash, one field per gateway:
--     "seq window granted" of its last call), for lost answers
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2], ARGV[3]   the limit and the window in microseconds
-- ARGV[4]   the tokens wanted
-- ARGV[5], ARGV[6]   a give-back: the window index of its grant and its
--     tokens, or "" and 0
-- ARGV[7], ARGV[8]   optional, with KEYS[2]: the gateway's id and the
--     call's sequence number. A call sent again after its answer was lost
--     carries the same numbers and gets the recorded answer, charged once;
--     a run of an older call than the recorded one does nothing.
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
local key, calls = KEYS[1], KEYS[2]
local limit, window, want = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local back_window, back = tonumber(ARGV[5]), tonumber(ARGV[6]) or 0
local gateway, seq = ARGV[7], tonumber(ARGV[8])
if not (calls and gateway and seq) then calls = nil end

local state = redis.call('HMGET', key, 'w', 'n')
local stored, count = tonumber(state[1]), tonumber(state[2]) or 0
local index = window_index(now, window)
local stop = (index + 1) * window

if calls then
  -- A call run late, or sent again: answered from the record.
  local left = 0
  if stored == index then left = math.max(limit - count, 0) elseif not stored or stored < index then left = limit end
  local answer = answered_call(calls, gateway, seq, index, window, now, left)
  if answer then return answer end
end

if back_window and back > 0 and stored == back_window then
  count = math.max(count - back, 0)
  redis.call('HSET', key, 'n', count)
end

local granted, left = 0, 0
if not (stored and stored > index) then
  if stored ~= index then count = 0 end
  granted = math.min(want, math.max(limit - count, 0))
  if granted > 0 then
    -- A new window: the calls' records of the last one are of no use.
    if calls and stored ~= index then redis.call('DEL', calls) end
    redis.call('HSET', key, 'w', index, 'n', count + granted)
    redis.call('PEXPIRE', key, ceil_ms(stop - now) + 1000)
  end
  left = math.max(limit - count - granted, 0)
end
if calls then record_call(calls, gateway, seq, index, granted, ceil_ms(stop - now) + 1000) end
return {granted, index, stop - now, left}
