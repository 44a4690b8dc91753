-- Helpers for every script. A file names the helpers it uses on its first
-- line (`-- requires: common, gcra`); the shim puts them, and what they
-- require in turn, before the script's main part (host-shim/src/scripts.rs).

-- Microseconds to milliseconds, rounded up.
local function ceil_ms(us)
  return math.ceil(us / 1000)
end

-- The index of the aligned window that holds now. Division in doubles may
-- land one off, so the result is checked against now.
local function window_index(now, window)
  local index = math.floor(now / window)
  if index * window > now then
    index = index - 1
  elseif (index + 1) * window <= now then
    index = index + 1
  end
  return index
end

-- The time: Redis TIME in microseconds, or ARGV[1] when the shim runs in its
-- test mode and sent one.
local function clock(explicit)
  local now = tonumber(explicit)
  if now then return now end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Sets key's TTL to at least ms: a reservation ahead of now may already
-- need the key longer than the charge at hand does.
local function keep_ms(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
