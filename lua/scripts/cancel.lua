-- requires: common, fixed_window, sliding_window, gcra
-- cancel: give back what a held reservation took, once its client is gone.
-- Twin of policies/src/algorithm/cancel.rs.
--
-- Only what is provably safe goes back: the request's own log entries still
-- in the future, its fixed-window count while that window is still ahead and
-- still stored, and its GCRA charge while tat is still exactly what this
-- reservation set. Anything later requests may already build on stays.
--
-- KEYS[i]   the state key of limit i
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2]   the request id
-- ARGV[3]   the slot the request was reserved at (reserve.lua's t)
-- ARGV[6i-2 .. 6i+3]   limit i: its algorithm, its four numbers, and the
--     gcra tat the reservation set (its held_until), else 0
local now = clock(ARGV[1])
local id = ARGV[2]
local at = tonumber(ARGV[3])
for i, key in ipairs(KEYS) do
  local base = 6 * i - 2
  local kind = ARGV[base]
  local a, b, c = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  local held = tonumber(ARGV[base + 5])
  if kind == 'sliding_window' then
    sliding_window_cancel(key, now, id)
  elseif kind == 'fixed_window' then
    fixed_window_cancel(key, now, at, b)
  elseif kind == 'gcra' then
    gcra_cancel(key, held, a, c)
  end
end
return #KEYS
