-- rate: the rate the partner's refusals taught us, fleet-wide. Twin of
-- policies/src/algorithm/rate.rs.
--
-- A pause is not a rate: when it ends, a policy that overstates the
-- partner's limits sends too much again. One hash per policy and key,
-- <tag>:rate, holds a factor on the rate of its time limits: f parts per
-- million of the policy's own, set at t by a refusal (upstream.lua),
-- climbing back linearly from then by the whole rate every r microseconds.
--
-- A check of a policy that reads upstream feedback carries the key as one
-- more limit, which scales every limit of its check before they decide
-- (apply_rates) and charges nothing. Concurrency limits keep their size.
local PPM = 1000000

-- The factor at now, in parts per million of the policy's rate.
local function rate_factor(key, now)
  local v = redis.call('HMGET', key, 'f', 't', 'r')
  local f, t, r = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
  if not (f and t and r) or r <= 0 then return PPM end
  return math.min(PPM, f + math.floor(math.max(now - t, 0) * PPM / r))
end

-- A limit spec at factor f: a window admits floor(limit * f), at least 1; a
-- bucket refills f times as fast and holds f times its burst, at least the
-- request's cost. Other limits are unchanged.
local function scale(s, f)
  if f >= PPM then return end
  if s.kind == 'fixed_window' or s.kind == 'first_hit' or s.kind == 'sliding_window' or s.kind == 'sliding_approx' then
    s.a = math.max(1, math.floor(s.a * f / PPM))
  elseif s.kind == 'gcra' then
    s.a = math.ceil(s.a * PPM / f)
    s.b = math.max(s.c, math.max(1, math.floor(s.b * f / PPM)))
  end
end

-- Scales the specs of every check that carries a rate key. Its tag is the
-- key without 'rate' (sluice:{<policy>:<key>}:), which every key of its
-- check starts with and no other does (a tag holds no braces inside).
local function apply_rates(specs, now)
  for _, r in ipairs(specs) do
    if r.kind == 'rate' then
      local f = rate_factor(r.key, now)
      local tag = string.sub(r.key, 1, #r.key - 4)
      for _, s in ipairs(specs) do
        if s.kind ~= 'rate' and string.sub(s.key, 1, #tag) == tag then scale(s, f) end
      end
    end
  end
end

-- As a limit of its check: always allows; its remaining is the factor.
local function rate(key, now)
  local view = {rate_factor(key, now), 0}
  return {allowed = true, now = view, after = view, retry = 0, reclaimed = 0, commit = function() end}
end

-- The waiting path (slots.lua): admits at once; its remaining is the factor.
local function rate_reserve(key, now)
  local f = rate_factor(key, now)
  return {at = now, remaining_now = f, commit = function(t) return {f, 0}, nil end}
end
