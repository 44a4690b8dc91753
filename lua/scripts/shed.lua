-- shed: the utilization shedder's controller, fleet-wide. Twin of
-- policies/src/shed.rs, Shedder::observe().
--
-- One hash per policy holds the level (as %.17g text, so it reads back
-- exactly), when the current trouble began, and the last report's time.
-- Every gateway reports utilization here and reads back the same level.
--
-- KEYS[1]   the state hash
-- ARGV[1]   the time in milliseconds, or "" for Redis TIME
-- ARGV[2]   the utilization reported, 0 to 1
-- ARGV[3]   classes; ARGV[4] high; ARGV[5] low; ARGV[6] delay_ms;
-- ARGV[7]   ramp_ms; ARGV[8] recovery_ms
-- Returns {level as text, trouble_since or -1}.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local u = tonumber(ARGV[2])
local top = math.max(tonumber(ARGV[3]) - 1, 0)
local high, low = tonumber(ARGV[4]), tonumber(ARGV[5])
local delay, ramp, recovery = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])

local state = redis.call('HMGET', KEYS[1], 'level', 'since', 'last')
local level = math.min(math.max(tonumber(state[1]) or 0, 0), top)
local since = tonumber(state[2])
local last = tonumber(state[3])

local function reply()
  return {string.format('%.17g', level), since or -1}
end

-- A report older than the last changes nothing.
if last and now < last then return reply() end
last = last or now
-- A missing or NaN report only moves the clock (the shim refuses both).
if u and u == u then
  if u > high then
    since = since or now
    local from = math.max(last, since + delay)
    local rising = math.max(now - from, 0)
    level = math.min(level + rising * top / ramp, top)
  elseif u < low then
    since = nil
    level = math.max(level - (now - last) * top / recovery, 0)
  end
end

redis.call('HSET', KEYS[1], 'level', string.format('%.17g', level), 'last', now)
if since then redis.call('HSET', KEYS[1], 'since', since) else redis.call('HDEL', KEYS[1], 'since') end
-- Without reports for a whole recovery (and a minute), nothing is in trouble.
redis.call('PEXPIRE', KEYS[1], recovery + 60000)
return reply()
