-- requires: common, fixed_window, sliding_window, gcra, slots, queue
-- take: a mixed waiting request (a concurrency limit and time-based limits)
-- at its time slot. Twin of policies/src/algorithm/queue.rs, take().
--
-- Its time limits were reserved at `at` (reserve.lua), without the
-- concurrency slot. Now it takes the slot if one is free and nobody waits,
-- and its time reservation is recorded as sent. Otherwise it gives its time
-- reservation back (cancel.lua) and queues for the slot with its time
-- limits, which the hand-over re-checks (queue.lua): a slot is never held idle while its
-- request waits for a time slot.
--
-- KEYS[1]   the lease set; KEYS[1 + i] the state key of time limit i
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2]   the request id (its lease, if it gets one)
-- ARGV[3], ARGV[4]   the limit and the lease length (µs)
-- ARGV[5]   how much longer it may wait (µs)
-- ARGV[6]   the channel its shim listens on
-- ARGV[7]   the slot its time limits were reserved at
-- ARGV[8]   its time limits as slots.lua's specs text
-- ARGV[8 + i]   unused (the gcra tat each time limit's reservation set)
--
-- Returns acquire.lua's reply.
local key = KEYS[1]
local now = clock(ARGV[1])
local id = ARGV[2]
local limit, lease, wait = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local channel, at, text = ARGV[6], tonumber(ARGV[7]), ARGV[8]
local reclaimed = reclaim(key, now, limit, lease)
hand_over(key, now, limit, lease)
local specs = parse_specs(text)
local function give_back()
  cancel_slots(now, id, at, specs)
end
if tombstoned(key, now, id) then
  give_back()
  return {-1, now, reclaimed, -1}
end
if redis.call('ZCARD', key) < limit and redis.call('ZCARD', key .. ':q') == 0 then
  local c = confirm_slots(now, id, at, specs)
  if c.gone then
    -- Its time reservation was dropped (past its deadline): a send now
    -- would go uncounted. Refused.
    give_back()
    return {-1, now, reclaimed, -1}
  end
  redis.call('ZADD', key, now + lease, id)
  keep_ms(key, ceil_ms(lease) + 1000)
  -- Sent now: its time reservation is a send (its gap is the margin's).
  for _, f in ipairs(c.found) do f.commit() end
  return {1, now, reclaimed, -1}
end
give_back()
enqueue(key, now, id, wait, channel, text)
return {0, now, reclaimed, soonest_expiry(key, now)}
