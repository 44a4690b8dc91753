-- requires: common, counter, fixed_window, first_hit, sliding_window, sliding_approx, gcra, calendar, pause, rate, queue, concurrency, reserve
-- check: decide every limit of one request at once, all or nothing.
-- Twin of policies/src/algorithm/mod.rs, check().
--
-- Phase 1 checks every limit and changes nothing but expired entries. Only if
-- every limit allows the request does phase 2 charge all of them: a request
-- that one limit denies consumes nothing from any other (unless refusals
-- are counted, ARGV[5n+5]: then every window is charged whatever it said).
--
-- KEYS[i]   the state key of limit i
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2]   the request id: a log entry, and the lease id
-- ARGV[5i-2 .. 5i+2]   limit i: its algorithm and four numbers (Algorithm::script_args)
-- ARGV[5n+3]   optional, n limits: the longest wait in microseconds; above 0
--     the request takes the waiting path (reserve.lua), with its margins after
-- ARGV[5n+4]   optional, not waiting: 'no_reset_when_admitted' (wire::Views)
--     when the caller reads no reset of an admitted request: it is 0 then,
--     and a sliding window skips the lookup of its oldest entry
-- ARGV[5n+5]   optional: 'count_refused' (wire::COUNT_REFUSED, the RLS
--     face's `charge: every_hit`): a refused request is charged as an
--     admitted one, each window counting its cost past its limit. Only
--     windows take it (the shim refuses it beside any other kind)
--
-- Returns {allowed, retry_after_ms, now, then for each limit i:
--          allowed_i, remaining_i, reset_ms_i, retry_after_ms_i, reclaimed_i,
--          held_until_i, refunded_i},
-- a retry of -1 meaning unknown; now is the time it charged at, for refund.lua;
-- held_until_i and refunded_i, for an admitted gcra limit, the time its charge
-- holds until and the bucket's refund counter then (for adjust.lua), else 0.
local now = clock(ARGV[1])
local id = ARGV[2]
local wait = tonumber(ARGV[5 * #KEYS + 3]) or 0
if wait > 0 then return reserve(now, id, wait) end

-- The partner's refusals scale the limits of their check (rate.lua). The
-- specs are built only when a check carries a rate: the hot path reads ARGV.
local specs = nil
for i = 1, #KEYS do
  if ARGV[5 * i - 2] == 'rate' then specs = {} break end
end
if specs then
  for i, key in ipairs(KEYS) do specs[i] = spec_of(i, key, 0) end
  apply_rates(specs, now)
end

-- Expired leases go back first, to waiters first (queue.lua). A hand-over
-- may charge a mixed waiter's time limits, which phase 1 must then see.
local reclaimed = {}
for i, key in ipairs(KEYS) do
  local base = 5 * i - 2
  if ARGV[base] == 'concurrency' then
    reclaimed[i] = reclaim(key, now, tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]))
  end
end

-- Phase 1: check.
local found = {}
local allowed = true
for i, key in ipairs(KEYS) do
  local base = 5 * i - 2
  local kind = ARGV[base]
  local a, b, c
  if specs then
    a, b, c = specs[i].a, specs[i].b, specs[i].c
  else
    a, b, c = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  end
  local f
  if kind == 'fixed_window' then
    f = fixed_window(key, now, a, b, c)
  elseif kind == 'sliding_window' then
    f = sliding_window(key, now, id, a, b)
  elseif kind == 'sliding_approx' then
    f = sliding_approx(key, now, a, b)
  elseif kind == 'gcra' then
    f = gcra(key, now, a, b, c)
  elseif kind == 'calendar' then
    f = calendar(key, now, a, b, c, tonumber(ARGV[base + 4]))
  elseif kind == 'first_hit' then
    f = first_hit(key, now, a, b, c)
  elseif kind == 'concurrency' then
    f = concurrency(key, now, id, a, b, reclaimed[i])
  elseif kind == 'pause' then
    f = pause(key, now)
  elseif kind == 'rate' then
    f = rate(key, now)
  else
    return redis.error_reply('unknown algorithm ' .. tostring(kind))
  end
  found[i] = f
  if not f.allowed then allowed = false end
end

-- The views the reply shows, read before the commit: an admitted request's
-- reset only when the caller reads it.
local no_reset = ARGV[5 * #KEYS + 4] == 'no_reset_when_admitted'
if not (allowed and no_reset) then
  for _, f in ipairs(found) do
    if f.reset then f.reset() end
  end
end

-- Phase 2: commit, only if every limit allowed, or whatever they said
-- when refusals are counted.
local charged = allowed or ARGV[5 * #KEYS + 5] == 'count_refused'
if charged then
  for _, f in ipairs(found) do f.commit() end
end

local retry_after = 0
for _, f in ipairs(found) do
  if not f.allowed then
    if f.retry < 0 or retry_after < 0 then
      retry_after = -1
    else
      retry_after = math.max(retry_after, ceil_ms(f.retry))
    end
  end
end

local reply = {allowed and 1 or 0, retry_after, now}
for _, f in ipairs(found) do
  local view = charged and f.after or f.now
  local retry = f.retry
  if retry > 0 then retry = ceil_ms(retry) end
  local held = (allowed and f.held_until) or 0
  local refunded = (allowed and f.refunded) or 0
  local reset = (allowed and no_reset) and 0 or ceil_ms(view[2])
  for _, v in ipairs({f.allowed and 1 or 0, view[1], reset, retry, f.reclaimed, held, refunded}) do
    reply[#reply + 1] = v
  end
end
return reply
