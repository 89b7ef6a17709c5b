-- callback_retry.lua queues a failed callback delivery again, due now,
-- with its attempts counted from 0 (POST /v1/jobs/{id}/callback/retry),
-- and publishes the id on the due set's channel (see callback.lua).
--
-- KEYS[1] -> the due set
-- KEYS[2] -> the job's task hash
-- KEYS[3] -> the failed set
-- ARGV[1] -> now override, µs ("" = Redis TIME)
-- ARGV[2] -> job id
--
-- Returns the callback state it found ("" for a job without a callback, or
-- none yet): only "failed" was queued again.
local f = redis.call('HMGET', KEYS[2], 'cb', 'cbs')
if not f[1] or not f[2] then return '' end
if f[2] ~= 'failed' then return f[2] end
redis.call('ZADD', KEYS[1], shaper_int(shaper_now(ARGV[1])), ARGV[2])
redis.call('HSET', KEYS[2], 'cbs', 'pending', 'cba', 0)
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('PUBLISH', KEYS[1], ARGV[2])
return 'failed'
