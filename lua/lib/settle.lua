-- requires: common, gcra
-- settle: a settlement (adjust.lua) applied once, and a refund that gives
-- back exactly its own charge's unused part. Twin of
-- policies/src/algorithm/settle.rs.
--
-- Settled ids: key .. ':s', a sorted set of the ids of the settlements
-- applied to the key, scored by when. The same settlement sent again finds
-- its id and changes nothing. An id is kept SETTLED_US.
--
-- The refund log: key .. ':g', a list of the bucket's refunds, oldest first,
-- each "counter end shift": the refund counter (gcra.lua, ':r') before it,
-- the end (on tat's axis) the charge it shrank had then, and the
-- microseconds it gave back. Charges lie on tat's axis in the order they
-- were made; a refund cuts the tail of its own charge and moves every later
-- charge earlier by as much, never an earlier one. So where a charge ends
-- now is where its check left it, less the logged refunds since of charges
-- that ended before it. refund.lua (a Cluster's charge-then-refund) logs
-- its refunds too. A refund the log does not hold (trimmed, or one whose
-- charge's end was not known) may have been of a charge before it or
-- after: the end is then kept as two bounds, and the refund takes the lower,
-- which can only under-refund.
local SETTLED_US = 3600000000
local LOG_MAX = 512

-- Whether settlement id was applied to key already; if not, records it.
-- An empty id (an older filter) is never recorded.
local function settled_before(key, now, id)
  if id == '' then return false end
  local ids = key .. ':s'
  if redis.call('ZSCORE', ids, id) then return true end
  redis.call('ZREMRANGEBYSCORE', ids, '-inf', now - SETTLED_US)
  redis.call('ZADD', ids, now, id)
  redis.call('PEXPIRE', ids, ceil_ms(SETTLED_US))
  return false
end

-- One entry of the refund log as numbers.
local function log_entry(entry)
  local c, e, s = string.match(entry, '^(%d+) (%d+) (%d+)$')
  return tonumber(c), tonumber(e), tonumber(s)
end

-- Where the charge a check left ending at held_until, with the refund
-- counter then at at_check, ends now; the counter is refunded now.
local function charge_end(key, held_until, at_check, refunded)
  local log = key .. ':g'
  -- The first entry at or after at_check: the counters rise.
  local first, past = 0, redis.call('LLEN', log)
  while first < past do
    local mid = math.floor((first + past) / 2)
    local c = log_entry(redis.call('LINDEX', log, mid))
    if c < at_check then first = mid + 1 else past = mid end
  end
  local low, high, at = held_until, held_until, at_check
  for _, entry in ipairs(redis.call('LRANGE', log, first, -1)) do
    local c, e, s = log_entry(entry)
    -- Refunds not logged, before this one.
    low = low - (c - at)
    if e < low then
      low, high = low - s, high - s
    elseif e < high then
      low = low - s
    end
    at = c + s
  end
  return low - (refunded - at)
end

-- Logs a refund of shift µs of the charge ending at ends, made with the
-- counter at refunded; kept as long as the counter (gcra.lua), the bucket's
-- TTL of ms and an hour.
local function log_refund(key, refunded, ends, shift, ms)
  local log = key .. ':g'
  -- (Lua writes a number by %.14g: a time in µs needs all its digits.)
  redis.call('RPUSH', log, string.format('%.0f %.0f %.0f', refunded, ends, shift))
  redis.call('LTRIM', log, -LOG_MAX, -1)
  redis.call('PEXPIRE', log, ms + REFUNDED_GRACE_MS)
end
