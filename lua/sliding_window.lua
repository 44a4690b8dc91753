-- sliding_window: an exact log. Twin of policies/src/algorithm/sliding_window.rs.
--
-- A sorted set holds one member per admitted request (its unique id), scored
-- by its time. An entry admitted at s counts while now < s + window, so over
-- any interval one window long at most limit requests are admitted.
-- Cost: O(log n + expired entries).
local function sliding_window(key, now, id, limit, window)
  -- Entries at or before now - window have expired.
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  local oldest = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
  local allowed = count < limit
  -- Without this request, capacity next frees when the oldest entry expires.
  local reset_now = oldest and (oldest + window - now) or 0
  local reset_after = oldest and (oldest + window - now) or window
  -- The request fits once all but limit - 1 entries have expired: when the
  -- entry at rank count - limit (oldest first) does.
  local retry = 0
  if not allowed then
    retry = tonumber(redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')[2]) + window - now
  end
  return {
    allowed = allowed,
    now = {math.max(limit - count, 0), reset_now},
    after = {math.max(limit - count - 1, 0), reset_after},
    retry = retry,
    reclaimed = 0,
    commit = function()
      redis.call('ZADD', key, now, id)
      -- The newest entry lives one window; the key may go a second after it.
      redis.call('PEXPIRE', key, ceil_ms(window) + 1000)
    end,
  }
end
