-- requires: common, queue
-- release: end a request's leases. Twin of policies/src/algorithm/queue.rs, release().
--
-- KEYS[i]   the lease sets of the request's concurrency limits
-- ARGV[1]   the lease id
-- ARGV[2]   the time in microseconds, or "" for Redis TIME
-- ARGV[2i+1], ARGV[2i+2]   limit i's limit and lease length (µs)
--
-- The freed slot goes straight to the oldest live waiter (queue.lua). A
-- request still queued leaves the queue. The id is tombstoned for one lease
-- length: a check for it that arrives after its release (a client reset
-- while the check was slow) takes no lease.
-- Returns how many leases it ended; a second release of the same lease ends none.
local id = ARGV[1]
local now = clock(ARGV[2])
local released = 0
for i, key in ipairs(KEYS) do
  local limit, lease = tonumber(ARGV[2 * i + 1]), tonumber(ARGV[2 * i + 2])
  released = released + redis.call('ZREM', key, id)
  dequeue(key, id)
  local t = key .. ':t'
  redis.call('ZREMRANGEBYSCORE', t, '-inf', now)
  redis.call('ZADD', t, now + lease, id)
  keep_ms(t, ceil_ms(lease) + 1000)
  reclaim(key, now, limit, lease)
  hand_over(key, now, limit, lease)
end
return released
