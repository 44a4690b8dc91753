-- requires: common, slots
-- queue: the fleet-wide FCFS queue of requests waiting for a concurrency
-- slot, and the hand-over that gives freed slots straight to them. Twin of
-- policies/src/algorithm/queue.rs.
--
-- Beside the lease set `key`, all under the check's hash tag, each with a TTL:
--   key:q   waiting ids scored by arrival (strictly increasing)
--   key:d   waiting ids scored by their deadline (µs)
--   key:w   a hash: waiting id -> the channel of the shim holding it
--   key:l   a hash: waiting id -> its time-based limits, for a request that
--           also waits on them (mixed; slots.lua's specs as text)
--   key:t   tombstones: ids released before their check arrived, scored by
--           expiry; no lease is ever granted to one (a release that overtook
--           its own check must leave no lease alive)
-- A waiter is served by giving it the lease (ZADD with its id) and
-- PUBLISHing its id on its shim's channel, in the same atomic call as the
-- release or reclaim that freed the slot: no polling, no slot left idle.
--
-- A mixed waiter (time limits too) is served only if its time limits admit
-- it now: they are charged and it gets the lease ("<id>"). Otherwise the
-- slot passes on to the next waiter, and the waiter leaves the queue with
-- its time slot t' reserved if t' lies before its deadline ("<id> <t'>
-- <delay>": its shim comes back at t'), or refused ("<id> -1"). A
-- concurrency slot is never held while its request waits for a time slot.

local function tombstoned(key, now, id)
  local until_ = tonumber(redis.call('ZSCORE', key .. ':t', id))
  return until_ ~= nil and until_ > now
end

-- Gives the free slots of key to the oldest live waiters; a waiter past its
-- deadline, or tombstoned, is dropped from the queue instead. Expired leases
-- must have been reclaimed first. Returns how many were served.
local function hand_over(key, now, limit, lease)
  local q, d, w, l = key .. ':q', key .. ':d', key .. ':w', key .. ':l'
  local served = 0
  while redis.call('ZCARD', key) < limit do
    local head = redis.call('ZRANGE', q, 0, 0)[1]
    if not head then break end
    local deadline = tonumber(redis.call('ZSCORE', d, head))
    local channel = redis.call('HGET', w, head)
    local specs = redis.call('HGET', l, head)
    redis.call('ZREM', q, head)
    redis.call('ZREM', d, head)
    redis.call('HDEL', w, head)
    redis.call('HDEL', l, head)
    if deadline and deadline > now and channel and not tombstoned(key, now, head) then
      local r = nil
      if specs then r = reserve_slots(now, head, deadline - now, parse_specs(specs)) end
      if not r or (r.allowed and r.at == now) then
        redis.call('ZADD', key, now + lease, head)
        keep_ms(key, ceil_ms(lease) + 1000)
        redis.call('PUBLISH', channel, head)
        served = served + 1
      elseif r.allowed then
        redis.call('PUBLISH', channel, head .. ' ' .. string.format('%.0f', r.at) .. ' '
          .. string.format('%.0f', r.at - now))
      else
        redis.call('PUBLISH', channel, head .. ' -1')
      end
    end
  end
  return served
end

-- Leases that expired go back: to waiters first. Returns how many expired.
local function reclaim(key, now, limit, lease)
  local reclaimed = redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if reclaimed > 0 then hand_over(key, now, limit, lease) end
  return reclaimed
end

-- Takes id out of the queue; true if it was there.
local function dequeue(key, id)
  redis.call('ZREM', key .. ':d', id)
  redis.call('HDEL', key .. ':w', id)
  redis.call('HDEL', key .. ':l', id)
  return redis.call('ZREM', key .. ':q', id) == 1
end

-- The time until the soonest live lease expires (µs), or -1 without leases
-- or without waiters: when a waiting shim should reclaim.
local function soonest_expiry(key, now)
  if redis.call('ZCARD', key .. ':q') == 0 then return -1 end
  local soonest = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
  if not soonest then return -1 end
  return math.max(soonest - now, 0)
end

-- Puts id at the back of the queue until now + wait; specs, if any, are a
-- mixed waiter's time limits (as text).
local function enqueue(key, now, id, wait, channel, specs)
  local q = key .. ':q'
  local seq = now
  local last = tonumber(redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')[2])
  if last and last >= seq then seq = last + 1 end
  redis.call('ZADD', q, seq, id)
  redis.call('ZADD', key .. ':d', now + wait, id)
  redis.call('HSET', key .. ':w', id, channel)
  local keys = {q, key .. ':d', key .. ':w'}
  if specs then
    redis.call('HSET', key .. ':l', id, specs)
    keys[#keys + 1] = key .. ':l'
  end
  for _, k in ipairs(keys) do keep_ms(k, ceil_ms(wait) + 1000) end
end
