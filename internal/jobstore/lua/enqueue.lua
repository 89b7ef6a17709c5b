-- enqueue.lua stores a job and makes it ready, or schedules it.
--
-- KEYS[1] -> task hash
-- KEYS[2] -> v
-- KEYS[3] -> f
-- KEYS[4] -> cal
-- KEYS[5] -> counts
-- KEYS[6] -> pbacklog
-- KEYS[7] -> asynq scheduled
-- KEYS[8] -> asynq groups set
-- ARGV[1] -> now override
-- ARGV[2] -> encoded asynq message
-- ARGV[3] -> lane
-- ARGV[4] -> fairness key
-- ARGV[5] -> partition
-- ARGV[6] -> costs
-- ARGV[7] -> process at, Unix seconds ("" = now)
-- ARGV[8] -> our prefix
-- ARGV[9] -> asynq group prefix
-- ARGV[10] -> asynq task prefix
-- ARGV[11] -> wake channel
-- ARGV[12] -> upstream name
-- ARGV[13] -> for an idempotency key's job, the upstream's records of
--    dropped ones (Remembered.Key; its buckets are built from it,
--    in the same slot); "" = none
-- ARGV[14] -> for a job with a callback, the upstream's callback due set,
--    kept in the task's cb field for the script that makes it final
--    (callback.lua); "" or absent = none
-- KEYS[9], KEYS[10] -> optional, to learn whether a job stored ready is held
--    back: the leaky block hash and asynq's paused key
--
-- Returns 0 if a job with this id exists (nothing changed), 1 if stored
-- ready, 2 if stored scheduled, 3 if stored ready but held back (with
-- KEYS[9..10]: the upstream is blocked or paused through asynq, or the
-- job's partition is parked); 4, 5 or 6 if the job with this id finished
-- and was dropped, and a record of it is still kept (nothing changed):
-- it succeeded, died or was cancelled.
--
-- Needs remember.lua, optional.lua, count.lua and flow.lua before it (see
-- lua.go).
local P, G, T = ARGV[8], ARGV[9], ARGV[10]
local K_V, K_F, K_CAL, K_GROUPS = KEYS[2], KEYS[3], KEYS[4], KEYS[8]
local sp = space(P, G, T, K_V, K_F, K_CAL, K_GROUPS)

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if ARGV[13] and ARGV[13] ~= '' then
  -- An idempotency key outlives its job: the check is here, with the
  -- store, so two repeats at once cannot both miss it.
  local final = recall(ARGV[13], string.sub(KEYS[1], #T + 1))
  if final then
    return ({s = 4, d = 5, c = 6})[final] or 5
  end
end
local now = shaper_now(ARGV[1])
local lane, fk, pk = ARGV[3], ARGV[4], ARGV[5]
local id = string.sub(KEYS[1], #T + 1)
local seq = redis.call('HINCRBY', K_V, 'seq', 1)
redis.call('HSET', KEYS[1], 'msg', ARGV[2], 'sl', lane, 'sf', fk, 'sq', seq)
set_optional(KEYS[1], pk, ARGV[6])
if ARGV[14] and ARGV[14] ~= '' then
  redis.call('HSET', KEYS[1], 'cb', ARGV[14])
end
if pk ~= '' then
  redis.call('ZINCRBY', KEYS[6], 1, pk)
end
local out = 1
if ARGV[7] ~= '' and tonumber(ARGV[7]) * 1000000 > now then
  redis.call('HSET', KEYS[1], 'state', 'scheduled')
  redis.call('ZADD', KEYS[7], ARGV[7], id)
  count(KEYS[5], 'scheduled:' .. lane, 1)
  out = 2
else
  push(sp, id, lane, fk, pk, seq, now)
  count(KEYS[5], 'pending:' .. lane, 1)
  if KEYS[10] then
    -- (Parked: its flow is in pk, as status counts it.)
    local parked = false
    if pk ~= '' then parked = redis.call('ZSCORE', P .. 'pk', lane .. '|' .. fk .. '|' .. pk) end
    if tonumber(redis.call('HGET', KEYS[9], 'until') or '0') > now or redis.call('EXISTS', KEYS[10]) == 1
        or (parked and tonumber(parked) > now) then
      out = 3
    end
  end
end
if redis.call('HDEL', K_V, 'sleep') == 1 then
  redis.call('PUBLISH', ARGV[11], ARGV[12])
end
return out
