-- requires: common, rate
-- upstream: record the partner's "slow down" (a 429 with Retry-After, a
-- RateLimit field with nothing left, ...). Twin of
-- policies/src/algorithm/pause.rs, record(), and rate.rs, slow().
--
-- A pause only ever moves later: the key keeps the later of its stored end
-- and the new one, so a stale or shorter answer never shortens it. The key
-- lives as long as the pause, and a second.
--
-- A refusal may also lower the key's rate (rate.lua): only one that finds
-- the key running freely, not paused. Answers to calls already in flight
-- when the first refusal came back find the key paused and lower nothing
-- more. The rate key lives until the rate has climbed back, and a second.
--
-- KEYS[2i-1], KEYS[2i]   pause i's pause key and rate key
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[4i-2 .. 4i+1]   pause i: its length in microseconds, then the factor
--     a refusal multiplies the rate by (ppm; 0: the rate stays), the
--     microseconds it takes to climb back, and the lowest factor (ppm)
-- Returns {how many pauses moved later, how many rates were lowered}.
local now = clock(ARGV[1])
local moved, slowed = 0, 0
for i = 1, #KEYS / 2 do
  local key, rate_key = KEYS[2 * i - 1], KEYS[2 * i]
  local base = 4 * i - 2
  local decrease, recover, least = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  local stored = tonumber(redis.call('GET', key)) or 0
  if decrease > 0 and now >= stored then
    local f = math.max(least, math.floor(rate_factor(rate_key, now) * decrease / PPM))
    redis.call('HSET', rate_key, 'f', f, 't', now, 'r', recover)
    redis.call('PEXPIRE', rate_key, ceil_ms(math.ceil((PPM - f) * recover / PPM)) + 1000)
    slowed = slowed + 1
  end
  local wanted = now + tonumber(ARGV[base])
  if wanted > stored then
    redis.call('SET', key, wanted, 'PX', ceil_ms(wanted - now) + 1000)
    moved = moved + 1
  end
end
return {moved, slowed}
