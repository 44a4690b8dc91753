-- gcra: the generic cell rate algorithm, for token buckets, leaky buckets,
-- intervals and points. Twin of policies/src/algorithm/gcra.rs.
--
-- The state is one time, the theoretical arrival time tat: when the bucket
-- would be full again. One unit refills every interval; the bucket holds burst
-- units, which take tau = interval * burst to refill. A request of cost units
-- moves tat on by cost * interval, and passes if then tat - now <= tau.
local function gcra(key, now, interval, burst, cost)
  local tau = interval * burst
  local stored = tonumber(redis.call('GET', key)) or now
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
    commit = function()
      redis.call('SET', key, new_tat)
      -- Once tat has passed, the bucket is full: the key may go.
      redis.call('PEXPIRE', key, ceil_ms(new_tat - now) + 1000)
    end,
  }
end
