-- adjust: charge or refund points once a request's true cost is known.
-- Twin of policies/src/algorithm/gcra.rs, adjust().
--
-- KEYS[i]   the gcra key of points limit i
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[3i-1], ARGV[3i], ARGV[3i+1]   limit i: its interval in microseconds,
--     the units to charge (positive) or refund (negative), and held_until: the
--     time the request's own charge held the bucket until (check.lua's reply)
--
-- A refund returns at most what the request's charge still holds: the part
-- of it that lies after now. What the bucket has refilled since the charge
-- was never the request's to give back, and returning it would let later
-- requests spend tokens the cap had already thrown away. A refund never
-- fills a bucket beyond full. Returns the number of keys changed.
local now = clock(ARGV[1])
for i, key in ipairs(KEYS) do
  local base = 3 * i - 1
  local interval, delta, held_until = tonumber(ARGV[base]), tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local stored = tonumber(redis.call('GET', key)) or now
  local tat = math.max(stored, now)
  local new_tat
  if delta >= 0 then
    new_tat = tat + delta * interval
  else
    local change = math.min(-delta * interval, math.max(held_until - now, 0))
    new_tat = math.max(tat - change, now)
  end
  redis.call('SET', key, new_tat)
  redis.call('PEXPIRE', key, ceil_ms(new_tat - now) + 1000)
end
return #KEYS
