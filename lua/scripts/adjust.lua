-- requires: common, gcra, calendar
-- adjust: charge or refund points once a request's true cost is known.
-- Twin of policies/src/algorithm/gcra.rs, adjust(), and for a points limit
-- on a calendar window of calendar.rs, adjust().
--
-- KEYS[i]   the state key of points limit i
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[4i-2 .. 4i+1]   limit i: its interval in microseconds (0: a calendar
--     window's counter, calendar.lua), the units to
--     charge (positive) or refund (negative), and from check.lua's reply the
--     time the request's charge held the bucket until and the bucket's refund
--     counter then (held_until, refunded)
--
-- Refunds since the check of charges made before this one moved it earlier,
-- by at most what the refund counter (key .. ':r') grew since. A refund
-- returns at most what the request's charge still holds: the part of it that
-- lies after now. What the bucket has refilled since the charge was never
-- the request's to give back, and returning it would let later requests
-- spend tokens the cap had already thrown away. A refund never fills a
-- bucket beyond full. Returns the number of keys changed.

-- A bucket's correction (gcra.rs, adjust()).
local function bucket_adjust(key, now, interval, delta, held_until, at_check)
  local stored = tonumber(redis.call('GET', key)) or now
  local tat = math.max(stored, now)
  local refunded = refunded_count(key)
  local new_tat = tat
  if delta >= 0 then
    new_tat = tat + delta * interval
  elseif refunded >= at_check then
    -- (A counter below the check's went with an idle bucket: nothing is left.)
    local until_ = held_until - (refunded - at_check)
    local change = math.min(-delta * interval, math.max(until_ - now, 0))
    new_tat = math.max(tat - change, now)
  end
  local ttl = ceil_ms(new_tat - now) + 1000
  redis.call('SET', key, new_tat)
  redis.call('PEXPIRE', key, ttl)
  if new_tat < tat then
    refunded = refunded + (tat - new_tat)
    redis.call('SET', key .. ':r', refunded)
  end
  keep_refunded(key, refunded, ttl)
end

local now = clock(ARGV[1])
for i, key in ipairs(KEYS) do
  local base = 4 * i - 2
  local interval, delta = tonumber(ARGV[base]), tonumber(ARGV[base + 1])
  local held_until, at_check = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  if interval == 0 then
    calendar_adjust(key, now, delta, held_until)
  else
    bucket_adjust(key, now, interval, delta, held_until, at_check)
  end
end
return #KEYS
