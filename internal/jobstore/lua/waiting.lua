-- waiting.lua records a proxied call waiting for its slot, on Redis's
-- clock: it drops the calls whose wait has ended, adds this one until the
-- end of its wait, and keeps the set a little past the longest wait.
--
-- KEYS[1] -> the upstream's waiting set: call id -> end of its wait, µs
-- ARGV[1] -> now override, µs ("" = Redis TIME)
-- ARGV[2] -> call id
-- ARGV[3] -> the call's wait, µs
-- ARGV[4] -> how long the set is kept after this write, ms
--
-- Returns the count of calls waiting, this one included.
local now = shaper_now(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', shaper_int(now))
redis.call('ZADD', KEYS[1], shaper_int(now + tonumber(ARGV[3])), ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return redis.call('ZCARD', KEYS[1])
