-- upstream: record the partner's "slow down" (a 429 with Retry-After, a
-- RateLimit field with nothing left, ...). Twin of
-- policies/src/algorithm/pause.rs, record().
--
-- A pause only ever moves later: the key keeps the later of its stored end
-- and the new one, so a stale or shorter answer never shortens it. The key
-- lives as long as the pause, and a second.
--
-- KEYS[i]   the pause key of pause i
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[i+1] pause i's length in microseconds
-- Returns how many pauses moved later.
local now = clock(ARGV[1])
local moved = 0
for i, key in ipairs(KEYS) do
  local stored = tonumber(redis.call('GET', key)) or 0
  local wanted = now + tonumber(ARGV[i + 1])
  if wanted > stored then
    redis.call('SET', key, wanted, 'PX', ceil_ms(wanted - now) + 1000)
    moved = moved + 1
  end
end
return moved
