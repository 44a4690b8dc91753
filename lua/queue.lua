-- queue: the fleet-wide FCFS queue of requests waiting for a concurrency
-- slot, and the hand-over that gives freed slots straight to them. Twin of
-- policies/src/algorithm/queue.rs.
--
-- Beside the lease set `key`, all under the check's hash tag, each with a TTL:
--   key:q   waiting ids scored by arrival (strictly increasing)
--   key:d   waiting ids scored by their deadline (µs)
--   key:w   a hash: waiting id -> the channel of the shim holding it
--   key:t   tombstones: ids released before their check arrived, scored by
--           expiry; no lease is ever granted to one (a release that overtook
--           its own check must leave no lease alive)
-- A waiter is served by giving it the lease (ZADD with its id) and
-- PUBLISHing its id on its shim's channel, in the same atomic call as the
-- release or reclaim that freed the slot: no polling, no slot left idle.

local function tombstoned(key, now, id)
  local until_ = tonumber(redis.call('ZSCORE', key .. ':t', id))
  return until_ ~= nil and until_ > now
end

-- Gives the free slots of key to the oldest live waiters; a waiter past its
-- deadline, or tombstoned, is dropped from the queue instead. Expired leases
-- must have been reclaimed first. Returns how many were served.
local function hand_over(key, now, limit, lease)
  local q, d, w = key .. ':q', key .. ':d', key .. ':w'
  local served = 0
  while redis.call('ZCARD', key) < limit do
    local head = redis.call('ZRANGE', q, 0, 0)[1]
    if not head then break end
    local deadline = tonumber(redis.call('ZSCORE', d, head))
    local channel = redis.call('HGET', w, head)
    redis.call('ZREM', q, head)
    redis.call('ZREM', d, head)
    redis.call('HDEL', w, head)
    if deadline and deadline > now and channel and not tombstoned(key, now, head) then
      redis.call('ZADD', key, now + lease, head)
      keep_ms(key, ceil_ms(lease) + 1000)
      redis.call('PUBLISH', channel, head)
      served = served + 1
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
