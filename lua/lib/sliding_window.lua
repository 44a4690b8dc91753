-- requires: common
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
  local allowed = count < limit
  -- The request fits once all but limit - 1 entries have expired: when the
  -- entry at rank count - limit (oldest first) does.
  local retry = 0
  if not allowed then
    retry = tonumber(redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')[2]) + window - now
  end
  local f = {
    allowed = allowed,
    now = {math.max(limit - count, 0), 0},
    after = {math.max(limit - count - 1, 0), window},
    retry = retry,
    reclaimed = 0,
    commit = function()
      redis.call('ZADD', key, now, id)
      -- The newest entry lives one window; the key may go a second after it.
      -- A reservation further ahead (reserve.lua) may already need longer.
      keep_ms(key, ceil_ms(window) + 1000)
    end,
  }
  -- The reset, read before any commit and only when the reply shows it
  -- (check.lua's views): without this request, capacity next frees when the
  -- oldest entry expires.
  f.reset = function()
    local oldest = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
    if oldest then
      f.now[2] = oldest + window - now
      f.after[2] = oldest + window - now
    end
  end
  return f
end

-- Waiting (reserve.lua): the earliest t at or after now, and at or after the
-- newest entry (reservations keep arrival order), at which fewer than limit
-- entries lie in (t - span, t], span = window + margin. Entries may be in the
-- future: they count. With t at or after every entry, that holds once the
-- entry at rank count - limit (oldest first) is at or before t - span.
local function sliding_window_reserve(key, now, id, limit, window, margin)
  local span = window + margin
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - span)
  local count = redis.call('ZCARD', key)
  local at = now
  local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  if newest and newest > at then at = newest end
  if count >= limit then
    local s = tonumber(redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')[2])
    at = math.max(at, s + span)
  end
  return {
    at = at,
    remaining_now = math.max(limit - count, 0),
    commit = function(t)
      local counting = redis.call('ZCOUNT', key, '(' .. string.format('%.0f', t - span), '+inf')
      local oldest = tonumber(redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%.0f', t - span), '+inf',
        'WITHSCORES', 'LIMIT', 0, 1)[2])
      redis.call('ZADD', key, t, id)
      keep_ms(key, ceil_ms(t + span - now) + 1000)
      return {math.max(limit - counting - 1, 0), (oldest or t) + span - t}
    end,
  }
end

-- At its slot (confirm.lua): the held request may be sent while fewer than
-- limit other entries lie in (now - span, now]; a request that woke late
-- may find entries sent since (or moved there late) in its way, and waits
-- until enough of them leave. Sent, its entry moves to now, where the
-- partner sees it. nil when its entry is gone (given back or expired).
local function sliding_window_confirm(key, now, id, limit, window, margin)
  local span = window + margin
  local score = tonumber(redis.call('ZSCORE', key, id))
  if not score then return nil end
  if score > now then return {due = score, commit = function() end} end
  local lo, hi = '(' .. string.format('%.0f', now - span), string.format('%.0f', now)
  local entries = redis.call('ZRANGEBYSCORE', key, lo, hi, 'WITHSCORES')
  local others = {}
  for i = 1, #entries, 2 do
    if entries[i] ~= id then others[#others + 1] = tonumber(entries[i + 1]) end
  end
  local due = now
  if #others >= limit then due = others[#others - limit + 1] + span end
  return {
    due = due,
    commit = function()
      redis.call('ZADD', key, now, id)
      keep_ms(key, ceil_ms(span) + 1000)
    end,
  }
end

-- Cancellation (cancel.lua): removes the request's entry; it was never sent.
local function sliding_window_cancel(key, now, id)
  redis.call('ZREM', key, id)
end
