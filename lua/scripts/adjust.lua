-- requires: common, gcra, calendar, settle
-- adjust: charge or refund points once a request's true cost is known, once.
-- Twin of policies/src/algorithm/mod.rs, adjust(): for a bucket
-- gcra.rs, adjust(), and for a points limit on a calendar window
-- calendar.rs, adjust().
--
-- KEYS[i]   the state key of points limit i
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2]   the settlement's id (settle.lua), or "" for none
-- ARGV[4i-1 .. 4i+2]   limit i: its interval in microseconds (0: a calendar
--     window's counter, calendar.lua), the units to
--     charge (positive) or refund (negative), and from check.lua's reply the
--     time the request's charge held the bucket until and the bucket's refund
--     counter then (held_until, refunded)
--
-- A settlement whose id a key has seen changes nothing there (settle.lua).
-- A refund returns at most what the request's charge still holds: the part
-- of it that lies after now, where the refunds since of the charges before
-- it have moved it (settle.lua's log). What the bucket has refilled since the
-- charge was never the request's to give back, and returning it would let
-- later requests spend tokens the cap had already thrown away. A refund never
-- fills a bucket beyond full. Returns, per key, the units charged (positive)
-- or given back (negative).

-- A bucket's correction (gcra.rs, adjust()): the units it moved.
local function bucket_adjust(key, now, interval, delta, held_until, at_check)
  local stored = tonumber(redis.call('GET', key)) or now
  local tat = math.max(stored, now)
  local refunded = refunded_count(key)
  local new_tat = tat
  local ends = 0
  if delta >= 0 then
    new_tat = tat + delta * interval
  elseif refunded >= at_check then
    -- (A counter below the check's went with an idle bucket: nothing is left.)
    ends = charge_end(key, held_until, at_check, refunded)
    local change = math.min(-delta * interval, math.max(ends - now, 0))
    new_tat = math.max(tat - change, now)
  end
  local ttl = ceil_ms(new_tat - now) + 1000
  redis.call('SET', key, new_tat)
  redis.call('PEXPIRE', key, ttl)
  if new_tat < tat then
    log_refund(key, refunded, ends, tat - new_tat, ttl)
    refunded = refunded + (tat - new_tat)
    redis.call('SET', key .. ':r', refunded)
  end
  keep_refunded(key, refunded, ttl)
  if delta >= 0 then return delta end
  return -math.floor((tat - new_tat) / interval)
end

local now = clock(ARGV[1])
local id = ARGV[2]
local moved = {}
for i, key in ipairs(KEYS) do
  local base = 4 * i - 1
  local interval, delta = tonumber(ARGV[base]), tonumber(ARGV[base + 1])
  local held_until, at_check = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  if settled_before(key, now, id) then
    moved[i] = 0
  elseif interval == 0 then
    moved[i] = calendar_adjust(key, now, delta, held_until)
  else
    moved[i] = bucket_adjust(key, now, interval, delta, held_until, at_check)
  end
end
return moved
