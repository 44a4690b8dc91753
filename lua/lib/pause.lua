-- pause: the partner's own "slow down", fleet-wide. Twin of
-- policies/src/algorithm/pause.rs.
--
-- One key per policy and key holds the time until which the partner asked us
-- to stop (upstream feedback, lua/scripts/upstream.lua). A check of a policy that
-- reads upstream feedback carries it as one more limit: decided at once, it
-- refuses until then; waiting, its slot is the pause's end, so a reservation
-- never falls inside a pause. It charges nothing.
local function pause(key, now)
  local untl = tonumber(redis.call('GET', key)) or 0
  local allowed = now >= untl
  local view = {allowed and 1 or 0, math.max(untl - now, 0)}
  return {
    allowed = allowed,
    now = view,
    after = view,
    retry = math.max(untl - now, 0),
    reclaimed = 0,
    commit = function() end,
  }
end

-- The waiting path (slots.lua): the slot is the pause's end.
local function pause_reserve(key, now)
  local untl = tonumber(redis.call('GET', key)) or 0
  return {
    at = math.max(untl, now),
    remaining_now = (now >= untl) and 1 or 0,
    commit = function(t) return {1, 0}, nil end,
  }
end
