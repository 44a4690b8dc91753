-- requires: common
-- renew: keep the leases of a request still in flight. Twin of
-- policies/src/algorithm/queue.rs, renew().
--
-- KEYS[i]   the lease sets of the request's concurrency limits
-- ARGV[1]   the lease id
-- ARGV[2]   the time in microseconds, or "" for Redis TIME
-- ARGV[2i+1], ARGV[2i+2]   limit i's limit and lease length (µs), as release.lua
--
-- A live lease lasts another lease length from now. A lease already gone
-- (released, or reclaimed) or expired is not taken again: renewing never
-- admits. Returns how many leases it renewed.
local id = ARGV[1]
local now = clock(ARGV[2])
local renewed = 0
for i, key in ipairs(KEYS) do
  local lease = tonumber(ARGV[2 * i + 2])
  local expiry = tonumber(redis.call('ZSCORE', key, id))
  if expiry and expiry > now then
    redis.call('ZADD', key, 'XX', now + lease, id)
    keep_ms(key, ceil_ms(lease) + 1000)
    renewed = renewed + 1
  end
end
return renewed
