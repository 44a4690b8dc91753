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

-- Waiting (reserve.lua, confirm.lua, cancel.lua). Beside tat, a bucket that
-- requests wait on keeps what is held, so that a late send shifts the
-- waiters behind it instead of reordering them, and give-backs in any order
-- leave no phantom slot:
--   key:held   the held reservations (reserved, not yet sent): ids by slot
--   key:need   id -> "need margin deadline tau mixed" of each held one
--              (mixed 1: a mixed request's, recorded as sent at its take)
--   key:sent   s: the tat of the real sends alone; e: tat as waiting left it
-- tat is then the chain: from s, each held reservation in slot order, at no
-- earlier than its slot nor than the one before allows with its margin
-- (gcra_walk). A tat other than e was moved by a check decided at once or a
-- refund (adjust.lua): s takes that move in, bounded by the new tat, and the
-- chain is walked again. A held reservation past its deadline and
-- HELD_GRACE was never sent (its request refused, its client or shim gone):
-- it drops out of the chain. So does one that a late send pushes past its
-- deadline (gcra_confirm): it is refused then, not at its slot.
local HELD_GRACE = 1000000

local function held_record(key, id)
  local r = redis.call('HGET', key .. ':need', id)
  if not r then return nil end
  local need, margin, deadline, tau, mixed = string.match(r, '(%S+) (%S+) (%S+) (%S+) ?(%S*)')
  return {
    need = tonumber(need), margin = tonumber(margin), deadline = tonumber(deadline), tau = tonumber(tau),
    mixed = mixed == '1',
  }
end

-- tat, and the real sends' tat s, taking in a move by anyone else.
local function gcra_load(key, now)
  local stored = tonumber(redis.call('GET', key))
  local sent = redis.call('HMGET', key .. ':sent', 's', 'e')
  local base, e = tonumber(sent[1]), tonumber(sent[2])
  local tat = stored or e or now
  if not base or not e then return {tat = tat, base = tat, moved = false} end
  if tat == e then return {tat = tat, base = base, moved = false} end
  if tat > e then
    base = math.min(math.max(base, now) + tat - e, tat)
  else
    -- Moved earlier (a refund, a lease given back): the real sends take the
    -- whole move, never below now unless they already were.
    base = math.max(base - (e - tat), math.min(base, now))
  end
  return {tat = tat, base = base, moved = true}
end

-- The chain's end from base, the held ids that dropped out, the time held
-- request `who` (if any, and still in the chain) may be sent at: its place
-- in the chain, shifted by whatever was late before it; and, if `refuse`
-- (after a send), the held ones it pushes past their deadlines, {id, place}
-- each, which drop out too (a mixed request's never: its take records it
-- sent, whatever is due).
local function gcra_walk(key, now, base, who, refuse)
  local acc, gone, due, pushed = base, {}, nil, {}
  local held = redis.call('ZRANGE', key .. ':held', 0, -1, 'WITHSCORES')
  for i = 1, #held, 2 do
    local id, slot = held[i], tonumber(held[i + 1])
    local r = held_record(key, id)
    if not r or r.deadline + HELD_GRACE < now then
      gone[#gone + 1] = id
    else
      local place = math.max(slot, acc + r.need + r.margin - r.tau)
      if refuse and not r.mixed and place > r.deadline then
        gone[#gone + 1] = id
        pushed[#pushed + 1] = {id, place}
      else
        if id == who then due = place end
        -- Still held, so not sent yet: at now at the earliest, so one
        -- behind a late one never goes first.
        acc = math.max(acc, place, now) + r.need
      end
    end
  end
  return acc, gone, due, pushed
end

local function gcra_drop(key, ids)
  for _, id in ipairs(ids) do
    redis.call('ZREM', key .. ':held', id)
    redis.call('HDEL', key .. ':need', id)
  end
end

-- Stores tat and s; every key lives until tat, and until the held
-- reservation's deadline (and grace) if it names one.
local function gcra_save(key, now, tat, base, deadline)
  redis.call('SET', key, tat, 'KEEPTTL')
  redis.call('HSET', key .. ':sent', 's', base, 'e', tat)
  local ms = ceil_ms(math.max(tat, deadline + HELD_GRACE, now) - now) + 1000
  for _, k in ipairs({key, key .. ':sent', key .. ':held', key .. ':need'}) do keep_ms(k, ms) end
end

-- The earliest t at or after now (and at or after every held slot: arrival
-- order) at which the bucket takes the request with margin to spare:
-- cost * interval <= tau and tat - t <= tau - cost * interval - margin (for
-- margin 0, check's rule). The partner's own bucket may see our requests up
-- to margin late; its tolerance is then margin smaller. Committed at t = now
-- it is sent at once (unless hold); else it is held until deadline, and tat
-- moves on from max(tat, t). A cost beyond the whole bucket never passes (-1).
local function gcra_reserve(key, now, id, interval, burst, cost, margin, deadline, hold)
  local tau = interval * burst
  local st = gcra_load(key, now)
  local tat = st.tat
  if st.moved then tat = gcra_walk(key, now, st.base) end
  local last = tonumber(redis.call('ZRANGE', key .. ':held', -1, -1, 'WITHSCORES')[2]) or now
  local need = cost * interval
  local at = -1
  if need <= tau then at = math.max(now, last, tat + need + margin - tau) end
  return {
    at = at,
    remaining_now = math.floor(math.max(now + tau - math.max(tat, now), 0) / interval),
    commit = function(t)
      local base, new_tat = st.base, 0
      if t <= now and not hold then
        base = math.max(base, now) + need
        new_tat = gcra_walk(key, now, base)
      else
        redis.call('ZADD', key .. ':held', t, id)
        redis.call('HSET', key .. ':need', id,
          string.format('%.0f %.0f %.0f %.0f %d', need, margin, deadline, tau, hold and 1 or 0))
        new_tat = math.max(tat, t) + need
      end
      local refunded = refunded_count(key)
      gcra_save(key, now, new_tat, base, deadline)
      keep_refunded(key, refunded, ceil_ms(new_tat - now) + 1000)
      return {math.floor(math.max(t + tau - new_tat, 0) / interval), new_tat - t}, new_tat, refunded
    end,
  }
end

-- At its slot (confirm.lua): the held request may be sent at its place in
-- the chain walked from the real sends: due = max(slot, end of those before
-- it + need + margin - tau), so it never goes before those ahead of it nor
-- closer than its margin allows to the last real send. Sent, s moves on
-- from max(s, now) and the chain is walked again, so a late send shifts
-- those behind it; the commit returns those it pushes past their deadlines
-- ({id, place} each), dropped from the chain, for their shims to refuse at
-- once. nil when id is not held (given back, or dropped past its deadline).
local function gcra_confirm(key, now, id)
  local r = held_record(key, id)
  if not r or not redis.call('ZSCORE', key .. ':held', id) then return nil end
  local st = gcra_load(key, now)
  local _, _, due = gcra_walk(key, now, st.base, id)
  if not due then return nil end
  return {
    due = due,
    commit = function()
      gcra_drop(key, {id})
      local base = math.max(st.base, now) + r.need
      local tat, gone, _, pushed = gcra_walk(key, now, base, nil, true)
      gcra_drop(key, gone)
      gcra_save(key, now, tat, base, 0)
      return pushed
    end,
  }
end

-- Cancellation (cancel.lua): a held reservation given back leaves the chain,
-- which is walked again: any give-backs, in any order, leave the state as if
-- they had never been made, with the reservations still held where they
-- are.
local function gcra_cancel(key, now, id)
  if not redis.call('ZSCORE', key .. ':held', id) then return end
  gcra_drop(key, {id})
  local st = gcra_load(key, now)
  local tat, gone = gcra_walk(key, now, st.base)
  gcra_drop(key, gone)
  gcra_save(key, now, tat, st.base, 0)
end
