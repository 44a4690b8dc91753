-- adjust: charge or refund points once a request's true cost is known.
-- Twin of policies/src/algorithm/gcra.rs, adjust().
--
-- KEYS[i]   the gcra key of points limit i
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2i], ARGV[2i+1]   limit i: its interval in microseconds, and the
--                        units to charge (positive) or refund (negative)
-- A refund never fills a bucket beyond full. Returns the number of keys changed.
local now = clock(ARGV[1])
for i, key in ipairs(KEYS) do
  local interval, delta = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local stored = tonumber(redis.call('GET', key)) or now
  local tat = math.max(stored, now)
  local change = math.abs(delta) * interval
  local new_tat
  if delta >= 0 then new_tat = tat + change else new_tat = math.max(tat - change, now) end
  redis.call('SET', key, new_tat)
  redis.call('PEXPIRE', key, ceil_ms(new_tat - now) + 1000)
end
return #KEYS
