-- requires: common, queue
-- acquire: a request that may wait for a concurrency slot. Twin of
-- policies/src/algorithm/queue.rs, acquire().
--
-- KEYS[1]   the lease set
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2]   the request id (its lease, if it gets one)
-- ARGV[3], ARGV[4]   the limit and the lease length (µs)
-- ARGV[5]   the longest wait (µs)
-- ARGV[6]   the channel its shim listens on for the hand-over
--
-- A free slot with nobody waiting is taken at once. Otherwise the request
-- joins the queue, behind everyone already in it.
-- Returns {state, now, reclaimed, soonest}: state 1 holds the lease, 0 is
-- queued, -1 refused (released before it arrived); soonest as queue.lua's
-- soonest_expiry.
local key = KEYS[1]
local now = clock(ARGV[1])
local id = ARGV[2]
local limit, lease, wait = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local channel = ARGV[6]
local reclaimed = reclaim(key, now, limit, lease)
hand_over(key, now, limit, lease)
if tombstoned(key, now, id) then return {-1, now, reclaimed, -1} end
local q = key .. ':q'
if redis.call('ZCARD', key) < limit and redis.call('ZCARD', q) == 0 then
  redis.call('ZADD', key, now + lease, id)
  keep_ms(key, ceil_ms(lease) + 1000)
  return {1, now, reclaimed, -1}
end
enqueue(key, now, id, wait, channel, nil)
return {0, now, reclaimed, soonest_expiry(key, now)}
