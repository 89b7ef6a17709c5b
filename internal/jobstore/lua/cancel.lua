-- cancel.lua archives a job that is waiting (in a flow, scheduled or
-- retrying), marking it dead; the mark that says "cancelled" is the
-- caller's. A job in any other state is left alone.
--
-- KEYS[1] -> task hash
-- KEYS[2] -> counts
-- KEYS[3] -> pbacklog
-- KEYS[4] -> asynq scheduled
-- KEYS[5] -> asynq retry
-- KEYS[6] -> asynq archived
-- KEYS[7] -> asynq groups
-- KEYS[8] -> the upstream's callback due set (see callback.lua)
-- ARGV[1] -> now override
-- ARGV[2] -> asynq group prefix
-- ARGV[3] -> id
-- ARGV[4] -> the channel that announces jobs made final ("" = none)
--
-- Returns the state the job was in ("" if there is no such job). A job with
-- a callback has its delivery recorded (callback.lua, needed before it).
local f = redis.call('HMGET', KEYS[1], 'state', 'group', 'sl', 'sp', 'sd', 'cb')
local state = f[1]
if not state then return '' end
local from
if state == 'aggregating' then
  redis.call('ZREM', ARGV[2] .. f[2], ARGV[3])
  if redis.call('EXISTS', ARGV[2] .. f[2]) == 0 then
    redis.call('SREM', KEYS[7], f[2])
  end
  from = 'pending:'
elseif state == 'scheduled' then
  redis.call('ZREM', KEYS[4], ARGV[3])
  from = 'scheduled:'
elseif state == 'retry' then
  redis.call('ZREM', KEYS[5], ARGV[3])
  from = 'retry:'
  if f[5] then
    from = 'deferred:'
  end
else
  return state
end
local now = shaper_now(ARGV[1])
redis.call('ZADD', KEYS[6], math.floor(now / 1000000), ARGV[3])
redis.call('HSET', KEYS[1], 'state', 'archived')
callback_due(KEYS[1], ARGV[3], f[6] and KEYS[8])
redis.call('HDEL', KEYS[1], 'group')
local lane = f[3] or ''
local n = redis.call('HINCRBY', KEYS[2], from .. lane, -1)
if n <= 0 then redis.call('HDEL', KEYS[2], from .. lane) end
redis.call('HINCRBY', KEYS[2], 'dead:' .. lane, 1)
local pk = f[4] or ''
if pk ~= '' then
  if tonumber(redis.call('ZINCRBY', KEYS[3], -1, pk)) <= 0 then
    redis.call('ZREM', KEYS[3], pk)
  end
end
-- Cancelled is final: long polls wake on it (see Finals).
if ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], ARGV[3])
end
return state
