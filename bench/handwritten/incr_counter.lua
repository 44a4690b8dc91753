-- S3 as commonly hand-written: a counter that starts with the first request.
-- KEYS[1]: the counter. ARGV[1]: the window in seconds. The caller compares
-- the result with its limit.
redis.call('SET', KEYS[1], 0, 'NX', 'EX', ARGV[1])
return redis.call('INCR', KEYS[1])
