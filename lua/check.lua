-- check.lua: decide every limit of one request at once, all or nothing.
--
-- Phase 1 checks every limit and changes nothing but the removal of expired
-- entries. Only if every limit allows the request does phase 2 charge all of
-- them. A request that one limit denies consumes nothing from any other.
--
-- KEYS[i]   the state key of limit i
-- ARGV[1]   the time in microseconds, or "" to read Redis TIME. The shim sends
--           a time only when it runs with --test-time.
-- ARGV[2]   a request id unique to this request, so that two requests in the
--           same microsecond are two entries
-- ARGV[3i], ARGV[3i+1], ARGV[3i+2]   limit i: its type, limit, window in microseconds
--
-- Returns {allowed, retry_after_ms, then for each limit i:
--          allowed_i, remaining_i, reset_ms_i, retry_after_ms_i}.
--
-- sliding_window: an exact log. A sorted set holds one member per admitted
-- request, scored by its time in microseconds. An entry admitted at s counts
-- while now < s + window, so over any interval one window long at most
-- `limit` requests are admitted. Cost: O(log n + expired entries).

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local id = ARGV[2]

local function ceil_ms(us)
  return math.ceil(us / 1000)
end

-- Phase 1: check.
local allowed = 1
local retry_after = 0
local results = {}
for i, key in ipairs(KEYS) do
  local kind, limit, window = ARGV[3 * i], tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  if kind ~= 'sliding_window' then
    return redis.error_reply('unknown limit type ' .. tostring(kind))
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]
  if count < limit then
    -- After this request, capacity next frees when the oldest entry expires.
    local reset = oldest and (tonumber(oldest) + window - now) or window
    -- remaining assumes the charge; phase 2 gives it back if another limit denies.
    results[i] = {1, limit - count - 1, ceil_ms(reset), 0}
  else
    -- The request fits once all but limit - 1 entries have expired: when the
    -- entry at rank count - limit (0-based, oldest first) does.
    local blocker = redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')[2]
    local wait = ceil_ms(tonumber(blocker) + window - now)
    results[i] = {0, 0, ceil_ms(tonumber(oldest) + window - now), wait}
    allowed = 0
    if wait > retry_after then retry_after = wait end
  end
end

-- Phase 2: commit, only if every limit allowed.
if allowed == 0 then
  for _, r in ipairs(results) do
    if r[1] == 1 then r[2] = r[2] + 1 end
  end
else
  for i, key in ipairs(KEYS) do
    local window = tonumber(ARGV[3 * i + 2])
    redis.call('ZADD', key, now, id)
    -- The newest entry lives one window; the key may go a second after it.
    redis.call('PEXPIRE', key, ceil_ms(window) + 1000)
  end
end

local reply = {allowed, retry_after}
for _, r in ipairs(results) do
  for _, v in ipairs(r) do reply[#reply + 1] = v end
end
return reply
