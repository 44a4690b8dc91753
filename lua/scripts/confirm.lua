-- requires: common, slots
-- confirm: a held request at its slot, before the shim lets it go. Twin of
-- policies/src/algorithm/confirm.rs.
--
-- Its send is checked against what was really sent on each key meanwhile
-- (slots.lua's confirm_slots): if every limit lets it go now, the send is
-- recorded at now; if one that woke late is in its way, nothing changes and
-- the reply says how long to wait (the shim sleeps that long and confirms
-- again). A late send thus shifts those behind it by its lateness, in
-- order, and the gap between two sends is never under the interval. A
-- send that pushes held requests past their deadlines drops them from the
-- chain and names them, each with the wait it would have had, so that they
-- are refused at once (not at their slots): in the reply, and PUBLISHed as
-- "<id> <wait_us>" on PUSHED, the channel every shim listens on, for the
-- shim that holds each. A request no longer held (given back, or dropped
-- past its deadline) has the rest of its reservation given back.
--
-- KEYS[i]   the state key of limit i
-- ARGV[1]   the time in microseconds, or "" for Redis TIME
-- ARGV[2]   the request id
-- ARGV[3]   the slot it was reserved at
-- ARGV[5i-1 .. 5i+3]   limit i: its algorithm, three numbers, its margin
--
-- Returns {state, wait_us, now, pushed}: 1 sent, 0 wait wait_us more, -1 not
-- held; pushed = {{id, wait_us}, ...}, the held requests the send pushed
-- past their deadlines (empty unless sent).
local PUSHED = 'sluice:pushed'
local now = clock(ARGV[1])
local id = ARGV[2]
local at = tonumber(ARGV[3])
local specs = {}
for i, key in ipairs(KEYS) do
  local base = 5 * i - 1
  specs[i] = {
    key = key, kind = ARGV[base], a = tonumber(ARGV[base + 1]), b = tonumber(ARGV[base + 2]),
    c = tonumber(ARGV[base + 3]), margin = tonumber(ARGV[base + 4]),
  }
end
local c = confirm_slots(now, id, at, specs)
if c.gone then
  cancel_slots(now, id, at, specs)
  return {-1, 0, now, {}}
end
if c.due > now then return {0, c.due - now, now, {}} end
local pushed = {}
for _, f in ipairs(c.found) do
  for _, p in ipairs(f.commit() or {}) do
    local wait = math.max(p[2] - now, 0)
    pushed[#pushed + 1] = {p[1], wait}
    redis.call('PUBLISH', PUSHED, p[1] .. ' ' .. string.format('%.0f', wait))
  end
end
return {1, 0, now, pushed}
