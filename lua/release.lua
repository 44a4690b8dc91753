-- release: end a request's leases. Twin of policies/src/algorithm/concurrency.rs, release().
--
-- KEYS[i]   the lease sets of the request's concurrency limits
-- ARGV[1]   the lease id
-- Returns how many leases it ended; a second release of the same lease ends none.
local released = 0
for _, key in ipairs(KEYS) do
  released = released + redis.call('ZREM', key, ARGV[1])
end
return released
