-- requires: common, lease
-- lease_bucket: leased mode on one token or leaky bucket (GCRA, one token
-- per request). Twin of policies/src/algorithm/mod.rs, lease_bucket_call(),
-- and gcra.rs, lease_give_back() and lease_grant().
--
-- KEYS[1]   the bucket's state key (its tat); beside it, KEYS[1] .. ':h'
--     holds its horizon: the latest end of a lease period a lease was
--     charged at
-- KEYS[2]   optional: the calls' record (lease.lua, the lib)
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2], ARGV[3]   the microseconds per token and the burst
-- ARGV[4]   the lease period in microseconds (the policy's leased.ttl)
-- ARGV[5]   the tokens wanted
-- ARGV[6], ARGV[7], ARGV[8]   a give-back: the period index of its leases,
--     the tokens never spent and the tokens of that period the gateway held
--     charged; or "", 0, 0
-- ARGV[9], ARGV[10]   optional, with KEYS[2]: the gateway's id and the
--     call's sequence number (as in lease.lua)
--
-- A lease belongs to the period, aligned to the epoch, it is granted in.
-- It is granted only out of the tokens the bucket holds now, and charged as
-- if all were spent at its period's end: tat moves to
-- max(tat, end) + granted * interval, and the gateway spends none from the
-- end on. Spent earlier than charged, they can only lower the bucket's true
-- arrival time; they were all in the bucket at the grant. So the bucket
-- never admits beyond its burst, whatever the interleaving.
--
-- The give-back goes first. It takes back at most tokens * interval, and at
-- most end + charged * interval - max(horizon, now): the period's leases of
-- this gateway moved the true tat to at least end + charged * interval, and
-- every charge since was made no later than max(horizon, now). Only for a
-- period that has begun and ended less than a period ago; never below now.
--
-- Returns {granted, period index, microseconds to its end, remaining}.
local now = clock(ARGV[1])
local key, calls = KEYS[1], KEYS[2]
local interval, burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local period, want = tonumber(ARGV[4]), tonumber(ARGV[5])
local back_window, back, charged = tonumber(ARGV[6]), tonumber(ARGV[7]) or 0, tonumber(ARGV[8]) or 0
local gateway, seq = ARGV[9], tonumber(ARGV[10])
if not (calls and gateway and seq) then calls = nil end

local tau = interval * burst
local index = window_index(now, period)
local stop = (index + 1) * period
local stored = tonumber(redis.call('GET', key))

if calls then
  -- A call run late, or sent again: answered from the record.
  local left = math.floor(math.max(now + tau - math.max(stored or now, now), 0) / interval)
  local answer = answered_call(calls, gateway, seq, index, period, now, left)
  if answer then return answer end
end

local horizon = tonumber(redis.call('GET', key .. ':h')) or 0
if back_window and back > 0 and back_window <= index then
  local ends = (back_window + 1) * period
  local reach = ends + math.max(charged, back) * interval - math.max(horizon, now)
  local taken = math.min(back * interval, math.max(reach, 0))
  if now < ends + period and stored and stored > now and taken > 0 then
    stored = math.max(stored - taken, now)
    redis.call('SET', key, stored, 'KEEPTTL')
  end
end

local tat = math.max(stored or now, now)
local granted = math.min(want, math.floor(math.max(now + tau - tat, 0) / interval))
if granted > 0 then
  tat = math.max(tat, stop) + granted * interval
  redis.call('SET', key, tat, 'PX', ceil_ms(tat - now) + 1000)
  horizon = math.max(horizon, stop)
  redis.call('SET', key .. ':h', horizon, 'PX', ceil_ms(horizon - now) + 1000)
end
if calls then record_call(calls, gateway, seq, index, granted, ceil_ms(stop + period - now) + 1000) end
return {granted, index, stop - now, math.floor(math.max(now + tau - tat, 0) / interval)}
