-- requires: common, queue
-- reclaim: a waiting shim's timer at the soonest lease expiry it was told
-- about, so a crashed holder's slot reaches the queue without new traffic.
-- Twin of policies/src/algorithm/queue.rs, reclaim().
--
-- KEYS[1]   the lease set
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2], ARGV[3]   the limit and the lease length (µs)
--
-- Returns {reclaimed, soonest}: soonest as queue.lua's soonest_expiry, for
-- the next timer (-1: none needed).
local key = KEYS[1]
local now = clock(ARGV[1])
local limit, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
local reclaimed = reclaim(key, now, limit, lease)
-- A slot may also be free without an expiry (a refund on a cluster).
hand_over(key, now, limit, lease)
return {reclaimed, soonest_expiry(key, now)}
