-- callback_done.lua records how one claimed callback delivery went.
--
-- KEYS[1] -> the due set
-- KEYS[2] -> the job's task hash
-- KEYS[3] -> the failed set: job id -> Unix seconds its callback failed
--    (members older than a week go at each failure, so it stays bounded)
-- ARGV[1] -> now override, µs ("" = Redis TIME)
-- ARGV[2] -> job id
-- ARGV[3] -> the attempt claimed (the fence)
-- ARGV[4] -> "1" delivered (a 2xx), "0" failed
-- ARGV[5] -> the attempt's error ("" when delivered)
-- ARGV[6] -> µs until the next attempt, when one is left
-- ARGV[7] -> most attempts
-- ARGV[8] -> the job's final state claimed (cbn, as the claim read it):
--    with ARGV[3] the fence, since a retried job's next final state
--    counts its attempts from 1 again
--
-- Returns 0 when the claim is no longer this caller's (its lease ran out
-- and it was claimed again, or the job moved on): nothing changed; else 1
-- delivered, 2 due again, 3 failed for good.
local now = shaper_now(ARGV[1])
local f = redis.call('HMGET', KEYS[2], 'cbs', 'cba', 'cbn')
if f[1] ~= 'pending' or f[2] ~= ARGV[3] or (f[3] or '1') ~= ARGV[8] or not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  return 0
end
if ARGV[4] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[2], 'cbs', 'delivered')
  redis.call('HDEL', KEYS[2], 'cbe')
  return 1
end
redis.call('HSET', KEYS[2], 'cbe', ARGV[5])
if tonumber(ARGV[3]) >= tonumber(ARGV[7]) then
  redis.call('ZREM', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[2], 'cbs', 'failed')
  local secs = math.floor(now / 1000000)
  redis.call('ZADD', KEYS[3], secs, ARGV[2])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', secs - 7 * 86400)
  return 3
end
redis.call('ZADD', KEYS[1], shaper_int(now + tonumber(ARGV[6])), ARGV[2])
return 2
