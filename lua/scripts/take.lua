-- requires: common, fixed_window, sliding_window, gcra, slots, queue
-- take: a mixed waiting request (a concurrency limit and time-based limits)
-- at its time slot. Twin of policies/src/algorithm/queue.rs, take().
--
-- Its time limits were reserved at `at` (reserve.lua), without the
-- concurrency slot. Now it takes the slot if one is free and nobody waits.
-- Otherwise it gives back what of its time reservation is provably safe
-- (cancel.lua's rules) and queues for the slot with its time limits, which
-- the hand-over re-checks (queue.lua): a slot is never held idle while its
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
-- ARGV[8 + i]   the gcra tat time limit i's reservation set, else 0
--
-- Returns acquire.lua's reply.
local key = KEYS[1]
local now = clock(ARGV[1])
local id = ARGV[2]
local limit, lease, wait = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local channel, at, text = ARGV[6], tonumber(ARGV[7]), ARGV[8]
local reclaimed = reclaim(key, now, limit, lease)
hand_over(key, now, limit, lease)
local function give_back()
  for i, s in ipairs(parse_specs(text)) do
    if s.kind == 'sliding_window' then
      sliding_window_cancel(s.key, now, id)
    elseif s.kind == 'fixed_window' then
      fixed_window_cancel(s.key, now, at, s.b)
    elseif s.kind == 'gcra' then
      gcra_cancel(s.key, tonumber(ARGV[8 + i]), s.a, s.c)
    end
  end
end
if tombstoned(key, now, id) then
  give_back()
  return {-1, now, reclaimed, -1}
end
if redis.call('ZCARD', key) < limit and redis.call('ZCARD', key .. ':q') == 0 then
  redis.call('ZADD', key, now + lease, id)
  keep_ms(key, ceil_ms(lease) + 1000)
  return {1, now, reclaimed, -1}
end
give_back()
enqueue(key, now, id, wait, channel, text)
return {0, now, reclaimed, soonest_expiry(key, now)}
