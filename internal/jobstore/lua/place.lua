-- place.lua stores a job directly in a state it otherwise reaches only
-- through a worker (retrying, dead, succeeded), with the fields and
-- counters a job that got there by dispatch would have, for carrying jobs
-- over from another layout (package queue's MigrateLegacy). A retrying job
-- stays in its partition's backlog and comes due through the take script
-- like any other; a dead or succeeded one is out of it.
--
-- KEYS[1] -> task hash
-- KEYS[2] -> v
-- KEYS[3] -> counts
-- KEYS[4] -> pbacklog
-- KEYS[5] -> the state's asynq sorted set (retry, archived or completed)
-- ARGV[1] -> job id
-- ARGV[2] -> encoded asynq message
-- ARGV[3] -> lane
-- ARGV[4] -> fairness key
-- ARGV[5] -> partition
-- ARGV[6] -> costs
-- ARGV[7] -> asynq state ("retry", "archived" or "completed")
-- ARGV[8] -> counter state ("retry", "dead" or "succeeded")
-- ARGV[9] -> score in KEYS[5]
-- ARGV[10] -> "1" when a result follows
-- ARGV[11] -> result
-- ARGV[12] -> wake channel
-- ARGV[13] -> upstream name
--
-- Returns 0 if a job with this id exists (nothing changed), 1 if stored.
--
-- Needs optional.lua before it (see lua.go).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local id, lane, pk, state = ARGV[1], ARGV[3], ARGV[5], ARGV[7]
local seq = redis.call('HINCRBY', KEYS[2], 'seq', 1)
redis.call('HSET', KEYS[1], 'msg', ARGV[2], 'state', state, 'sl', lane, 'sf', ARGV[4], 'sq', seq)
set_optional(KEYS[1], pk, ARGV[6])
if ARGV[10] == '1' then
  redis.call('HSET', KEYS[1], 'result', ARGV[11])
end
redis.call('ZADD', KEYS[5], ARGV[9], id)
redis.call('HINCRBY', KEYS[3], ARGV[8] .. ':' .. lane, 1)
if state == 'retry' then
  if pk ~= '' then
    redis.call('ZINCRBY', KEYS[4], 1, pk)
  end
  -- A sleeping worker learns of it now rather than at its next poll.
  if redis.call('HDEL', KEYS[2], 'sleep') == 1 then
    redis.call('PUBLISH', ARGV[12], ARGV[13])
  end
end
return 1
