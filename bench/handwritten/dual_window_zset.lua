-- S0 as commonly hand-written: two sorted sets, one per window.
-- KEYS[1], KEYS[2]: the windows' sets. ARGV: now (caller's clock, seconds as
-- a float), window1, limit1, window2, limit2 (seconds).
local now = tonumber(ARGV[1])
local remaining = {}
for i = 1, 2 do
  local key, window, limit = KEYS[i], tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  redis.call('ZREMRANGEBYSCORE', key, 0, now - window)
  local count = redis.call('ZCARD', key)
  if count < limit then
    redis.call('ZADD', key, now, now)
    count = count + 1
  end
  redis.call('EXPIRE', key, math.ceil(window))
  remaining[i] = limit - count
end
return remaining
