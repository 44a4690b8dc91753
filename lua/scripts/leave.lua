-- requires: common, queue
-- leave: a waiter whose wait ran out, or whose client went away, leaves the
-- queue. Twin of policies/src/algorithm/queue.rs, leave().
--
-- KEYS[1]   the lease set
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2]   the request id
-- ARGV[3], ARGV[4]   the limit and the lease length (µs)
--
-- If it was handed a slot meanwhile (the wake-up crossed its timeout), the
-- slot passes on to the next waiter. Returns 1 if it was still queued, 2 if
-- it passed a slot on, 0 if it was in neither.
local key = KEYS[1]
local now = clock(ARGV[1])
local id = ARGV[2]
local limit, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
if dequeue(key, id) then return 1 end
if redis.call('ZREM', key, id) == 1 then
  reclaim(key, now, limit, lease)
  hand_over(key, now, limit, lease)
  return 2
end
return 0
