-- S4a as commonly hand-written: tokens and the last refill time in two keys.
-- KEYS[1]: tokens, KEYS[2]: timestamp. ARGV: rate (tokens per second),
-- capacity, now (caller's clock, seconds), requested.
local rate, capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, requested = tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl = math.floor(capacity / rate * 2)
local last_tokens = tonumber(redis.call('GET', KEYS[1])) or capacity
local last_refreshed = tonumber(redis.call('GET', KEYS[2])) or 0
local filled = math.min(capacity, last_tokens + math.max(0, now - last_refreshed) * rate)
local allowed = filled >= requested
local tokens = filled
if allowed then tokens = filled - requested end
redis.call('SETEX', KEYS[1], ttl, tokens)
redis.call('SETEX', KEYS[2], ttl, now)
return {allowed and 1 or 0, tokens}
