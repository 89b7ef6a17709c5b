-- callback_claim.lua claims due callback deliveries of one upstream under
-- a lease. The due set is both the queue and the lease: a claimed id's
-- score moves to the lease's end, so an id whose claimer died (kill -9)
-- is due again once its lease runs out, and is claimed again then. Each
-- claim counts an attempt (cba), and the attempt number is the claim's
-- fence: only the latest claimer may record an outcome
-- (callback_done.lua).
--
-- KEYS[1] -> the due set: job id -> µs when due (or its lease ends)
-- KEYS[2] -> the failed set: job id -> Unix seconds its callback failed
-- ARGV[1] -> now override, µs ("" = Redis TIME)
-- ARGV[2] -> lease, µs
-- ARGV[3] -> most ids to claim
-- ARGV[4] -> task key prefix
-- ARGV[5] -> most attempts (callbacks.retry.max_attempts)
--
-- Returns {wait, id, attempt, cbn, ...}: wait is µs until the earliest id
-- left in the set is due (a retry's backoff or a lease ending; 0 when one
-- is due already, -1 when the set is empty), then a triple per id claimed.
-- An id whose job is
-- gone (deleted past its retention), or not final (sent again by a retry
-- of the job: its next final state records a new delivery), leaves the set
-- unclaimed. One whose claimer died on its last attempt fails, with
-- "lease expired" as its last error.
local now = shaper_now(ARGV[1])
local lease, limit, T, most = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', shaper_int(now), 'LIMIT', 0, limit)
local out = {-1}
for _, id in ipairs(ids) do
  local task = T .. id
  local f = redis.call('HMGET', task, 'state', 'cbs', 'cba', 'cbn')
  if f[1] ~= 'completed' and f[1] ~= 'archived' or f[2] ~= 'pending' then
    redis.call('ZREM', KEYS[1], id)
  elseif tonumber(f[3] or '0') >= most then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HSET', task, 'cbs', 'failed', 'cbe', 'lease expired: the worker delivering it stopped')
    redis.call('ZADD', KEYS[2], math.floor(now / 1000000), id)
  else
    local attempt = redis.call('HINCRBY', task, 'cba', 1)
    redis.call('ZADD', KEYS[1], shaper_int(now + lease), id)
    out[#out + 1] = id
    out[#out + 1] = attempt
    out[#out + 1] = f[4] or '1'
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  out[1] = math.max(tonumber(first[2]) - now, 0)
end
return out
