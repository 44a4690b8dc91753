-- requires: common
-- counter: the answer of one window's counter, for fixed_window, first_hit
-- and calendar. Twin of policies/src/algorithm/counter.rs.
--
-- The window, named `name` in the hash's `field`, has counted `count` of
-- `limit` and ends `reset` from now. A request of `cost` passes while count
-- plus cost is at most limit (a cost above the limit never passes); it
-- waits for the window's end. Admitted, the count goes up by its cost and
-- the key lives until the window's end, plus a second; refused, too, when
-- the check counts refusals (check.lua's 'count_refused'): the count then
-- passes the limit, and the window refuses every cost until its end.
local function counter(key, field, name, count, limit, cost, reset)
  local allowed = count + cost <= limit
  return {
    allowed = allowed,
    now = {math.max(limit - count, 0), reset},
    after = {math.max(limit - count - cost, 0), reset},
    retry = allowed and 0 or reset,
    reclaimed = 0,
    commit = function()
      redis.call('HSET', key, field, name, 'n', count + cost)
      redis.call('PEXPIRE', key, ceil_ms(reset) + 1000)
    end,
  }
end
