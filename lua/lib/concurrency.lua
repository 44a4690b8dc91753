-- requires: common, queue
-- concurrency: leases. Twin of policies/src/algorithm/concurrency.rs.
--
-- A sorted set holds one member per request in flight (its lease id), scored
-- by when its lease expires. A request passes while fewer than limit leases
-- are live. The stream's end releases its lease (release.lua); a lease whose
-- holder died expires after lease and is reclaimed (check.lua does it before
-- phase 1: reclaimed of them), and counted; a slot reclaimed goes to the
-- oldest waiter first (queue.lua). An id released before its check arrived
-- (a tombstone) never takes a lease.
local function concurrency(key, now, id, limit, lease, reclaimed)
  local count = redis.call('ZCARD', key)
  local soonest = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
  local allowed = count < limit and not tombstoned(key, now, id)
  return {
    allowed = allowed,
    now = {math.max(limit - count, 0), soonest and (soonest - now) or 0},
    after = {math.max(limit - count - 1, 0), soonest and (soonest - now) or lease},
    -- Nobody knows when a lease will be released (-1).
    retry = allowed and 0 or -1,
    reclaimed = reclaimed,
    commit = function()
      redis.call('ZADD', key, now + lease, id)
      -- Every lease of this key has the same length: the newest lasts longest.
      redis.call('PEXPIRE', key, ceil_ms(lease) + 1000)
    end,
  }
end
