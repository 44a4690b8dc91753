-- requires: common, slots
-- cancel: give back what a held reservation took, once its client is gone
-- or its shim refuses it. Twin of policies/src/algorithm/cancel.rs.
--
-- A held request was never sent, so all of it goes back (slots.lua's
-- cancel_slots): its log entries, its fixed-window count while that window
-- is still stored, and its place in a bucket's chain of held reservations,
-- which the reservations still held keep. Give-backs in any order leave
-- the state as if they had never been made.
--
-- KEYS[i]   the state key of limit i
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2]   the request id
-- ARGV[3]   the slot the request was reserved at (reserve.lua's t)
-- ARGV[5i-1 .. 5i+3]   limit i: its algorithm and its four numbers
local now = clock(ARGV[1])
local specs = {}
for i, key in ipairs(KEYS) do
  local base = 5 * i - 1
  specs[i] = {key = key, kind = ARGV[base], a = tonumber(ARGV[base + 1]), b = tonumber(ARGV[base + 2])}
end
cancel_slots(now, ARGV[2], tonumber(ARGV[3]), specs)
return #KEYS
