-- requires: common
-- gcra: the generic cell rate algorithm, for token buckets, leaky buckets,
-- intervals and points. Twin of policies/src/algorithm/gcra.rs.
--
-- The state is one time, the theoretical arrival time tat: when the bucket
-- would be full again. One unit refills every interval; the bucket holds burst
-- units, which take tau = interval * burst to refill. A request of cost units
-- moves tat on by cost * interval, and passes if then tat - now <= tau.
-- Beside tat, key .. ':r' counts the microseconds refunds have given back
-- (adjust.lua). A check replies it with held_until: refunds since of earlier
-- charges moved this one earlier, by at most what the counter grew. It
-- outlives its bucket by an hour, so a refund still in flight when the
-- bucket empties finds it.
local REFUNDED_GRACE_MS = 3600000

local function refunded_count(key)
  return tonumber(redis.call('GET', key .. ':r')) or 0
end

-- Keeps the refund counter, if any, an hour beyond the bucket's TTL of ms.
local function keep_refunded(key, refunded, ms)
  if refunded > 0 then redis.call('PEXPIRE', key .. ':r', ms + REFUNDED_GRACE_MS) end
end

local function gcra(key, now, interval, burst, cost)
  local tau = interval * burst
  local stored = tonumber(redis.call('GET', key)) or now
  local refunded = refunded_count(key)
  local tat = math.max(stored, now)
  local new_tat = tat + cost * interval
  local allowed = new_tat - now <= tau
  -- A cost beyond the whole bucket never passes: its wait is unknown (-1).
  local retry = 0
  if not allowed then
    if cost * interval > tau then retry = -1 else retry = new_tat - tau - now end
  end
  return {
    allowed = allowed,
    -- A charge after the fact can leave tat beyond now + tau: nothing remains.
    now = {math.floor(math.max(now + tau - tat, 0) / interval), tat - now},
    after = {math.floor(math.max(now + tau - new_tat, 0) / interval), new_tat - now},
    retry = retry,
    reclaimed = 0,
    -- What this request's charge holds until, for a later refund (adjust.lua).
    held_until = new_tat,
    refunded = refunded,
    commit = function()
      redis.call('SET', key, new_tat)
      -- Once tat has passed, the bucket is full: the key may go.
      redis.call('PEXPIRE', key, ceil_ms(new_tat - now) + 1000)
      keep_refunded(key, refunded, ceil_ms(new_tat - now) + 1000)
    end,
  }
end

-- Waiting (reserve.lua): the earliest t at or after now at which the bucket
-- takes the request with margin to spare: cost * interval <= tau and
-- tat - t <= tau - cost * interval - margin, on the stored tat (for margin 0,
-- check's rule). The partner's own bucket may see our requests up to margin
-- late; its tolerance is then margin smaller. Committed at t, tat moves on
-- from max(tat, t). A cost beyond the whole bucket never passes (-1).
local function gcra_reserve(key, now, interval, burst, cost, margin)
  local tau = interval * burst
  local stored = tonumber(redis.call('GET', key))
  local tat = stored or now
  local need = cost * interval
  local at = -1
  if need <= tau then at = math.max(now, tat + need + margin - tau) end
  return {
    at = at,
    remaining_now = math.floor(math.max(now + tau - math.max(tat, now), 0) / interval),
    commit = function(t)
      local new_tat = math.max(tat, t) + need
      local refunded = refunded_count(key)
      redis.call('SET', key, new_tat)
      redis.call('PEXPIRE', key, ceil_ms(new_tat - now) + 1000)
      keep_refunded(key, refunded, ceil_ms(new_tat - now) + 1000)
      return {math.floor(math.max(t + tau - new_tat, 0) / interval), new_tat - t}, new_tat, refunded
    end,
  }
end

-- Cancellation (cancel.lua): moves tat back by the request's charge only
-- while it is still exactly the tat this reservation set (the newest).
local function gcra_cancel(key, held_until, interval, cost)
  if tonumber(redis.call('GET', key)) == held_until then
    redis.call('SET', key, held_until - cost * interval, 'KEEPTTL')
  end
end
