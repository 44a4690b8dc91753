-- requires: common, gcra, calendar, queue, settle
-- refund: take back what check.lua charged for one request, when another
-- Redis Cluster slot denied the same request (charge-then-refund: a charge,
-- not a reservation, which in these scripts means a waiting slot).
-- Twin of policies/src/algorithm/refund.rs (buckets and calendar counters).
--
-- KEYS[i]   the state key of limit i, as in check.lua
-- ARGV[1]   the time check.lua charged at (its reply's `now`)
-- ARGV[2]   the request id
-- ARGV[5i-2 .. 5i+2]   limit i, as in check.lua
-- ARGV[5n+2i+1 .. 5n+2i+2]   for limit i of n, from check.lua's reply: the
--     time its charge held the bucket until and the bucket's refund counter
--     then (held_until, refunded; 0 0 for none). A bucket's refund is logged
--     with where that charge ends (settle.lua), so that a later settlement
--     knows it was a refund of a charge after its own, or before.
--
-- Between the charge and the refund other requests saw the charge, so some
-- may have been denied: a refund can under-admit for that moment, never over-admit.
local charged = tonumber(ARGV[1])
local id = ARGV[2]
local held = 5 * #KEYS + 2
for i, key in ipairs(KEYS) do
  local base = 5 * i - 2
  local kind = ARGV[base]
  local a, b, c = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  if kind == 'calendar' then
    calendar_refund(key, charged, b, c, tonumber(ARGV[base + 4]))
  elseif kind == 'sliding_window' then
    redis.call('ZREM', key, id)
  elseif kind == 'concurrency' then
    -- The slot goes to the oldest waiter, if any (queue.lua), at Redis's
    -- time: a hand-over may charge a waiter's time limits.
    if redis.call('ZREM', key, id) == 1 then hand_over(key, clock(''), a, b) end
  elseif kind == 'gcra' then
    local tat = tonumber(redis.call('GET', key))
    if tat then
      local shift = c * a
      local ttl = math.max(ceil_ms(tat - shift - charged), 0) + 1000
      redis.call('SET', key, tat - shift)
      redis.call('PEXPIRE', key, ttl)
      -- Charges made since moved earlier: the refund counter says by how
      -- much (adjust.lua), and the log where this charge ended.
      local refunded = refunded_count(key)
      local held_until = tonumber(ARGV[held + 2 * i - 1]) or 0
      local at_check = tonumber(ARGV[held + 2 * i]) or 0
      if held_until > 0 and refunded >= at_check then
        log_refund(key, refunded, charge_end(key, held_until, at_check, refunded), shift, ttl)
      end
      refunded = refunded + shift
      redis.call('SET', key .. ':r', refunded)
      keep_refunded(key, refunded, ttl)
    end
  else
    -- fixed_window and sliding_approx count in the window of the charge.
    local index = window_index(charged, b)
    local w = tonumber(redis.call('HGET', key, 'w'))
    if kind == 'fixed_window' and w == index then
      redis.call('HINCRBY', key, 'n', -1)
    elseif kind == 'sliding_approx' and w == index then
      redis.call('HINCRBY', key, 'c', -1)
    elseif kind == 'sliding_approx' and w == index + 1 then
      redis.call('HINCRBY', key, 'p', -1)
    end
  end
end
return #KEYS
