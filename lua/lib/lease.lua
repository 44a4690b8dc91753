-- requires: common
-- lease: leased mode's calls' record, for lease.lua and lease_bucket.lua.
-- Twin of policies/src/algorithm/mod.rs, answered_call() and record_call().
--
-- The record is a hash beside the leased limit's state (its key .. ':l'),
-- one field per gateway: "seq window granted" of the gateway's last call.

-- The answer to a gateway's call seq if the record already has it: nothing
-- ({0, index, stop - now, 0}) when a later call of the gateway was recorded
-- (this one ran late); the answer it had, charged once, when it is the
-- recorded call (sent again after its answer was lost), with the time to
-- its window's end (windows of length long) and what is left now; else nil
-- (the call runs).
local function answered_call(calls, gateway, seq, index, long, now, left)
  local record = redis.call('HGET', calls, gateway)
  if not record then return nil end
  local s, w, g = string.match(record, '^(%d+) (%d+) (%d+)$')
  s, w, g = tonumber(s), tonumber(w), tonumber(g)
  if s and s > seq then return {0, index, (index + 1) * long - now, 0} end
  if s == seq then return {g, w, math.max((w + 1) * long - now, 0), left} end
  return nil
end

-- Records a gateway's call seq: it ran in window index and granted granted;
-- the record lives ms.
local function record_call(calls, gateway, seq, index, granted, ms)
  redis.call('HSET', calls, gateway, string.format('%d %d %d', seq, index, granted))
  redis.call('PEXPIRE', calls, ms)
end
