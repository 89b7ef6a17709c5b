-- flow.lua: a library for the scripts that put jobs into an upstream's
-- flows. Needs count.lua before it. Every function takes what it touches
-- as parameters; sp is the upstream's space as a script builds it (see
-- space below):
--
--   space(our, group, task, v, f, cal, groups) -> sp = {our = our prefix
--     "P:s:{Q}:", group = asynq's group prefix, task = asynq's task prefix,
--     v, f, cal, groups = the keys of those names (see lua.go)}
--   activate_lane(sp, fk, lane) puts lane of fairness key fk, and fk, back
--     in the rotation at the current virtual time, off the calendar: a set's
--     virtual time is its lowest score (that of the member that goes next;
--     0 for an empty set), so a member that comes back goes level with the
--     one that would go next (see take.lua)
--   push(sp, id, lane, fk, pk, seq, t) puts job id into its flow
--     LANE|FK|PK at FIFO place seq (its partition ready at t, µs, unless it
--     already waits) as asynq's aggregating task
--   waited_as(tk, sd) -> the counter ("deferred:" or "retry:") a job
--     leaving asynq's retry set was counted in, by its sd field (set:
--     handed back); the mark stays, saying the last error is a hand-back's
local function space(our, group, task, v, f, cal, groups)
  return {our = our, group = group, task = task, v = v, f = f, cal = cal, groups = groups}
end

local function virtual_time(key)
  local r = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #r == 0 then return 0 end
  return tonumber(r[2])
end

local function activate_lane(sp, fk, lane)
  local lk = sp.our .. 'l:' .. fk
  if redis.call('ZSCORE', lk, lane) == false then
    redis.call('ZADD', lk, virtual_time(lk), lane)
    redis.call('ZREM', sp.cal, lane .. '|' .. fk)
  end
  if redis.call('ZSCORE', sp.f, fk) == false then
    redis.call('ZADD', sp.f, virtual_time(sp.f), fk)
  end
end

local function push(sp, id, lane, fk, pk, seq, t)
  local g = lane .. '|' .. fk .. '|' .. pk
  redis.call('ZADD', sp.group .. g, seq, id)
  redis.call('SADD', sp.groups, g)
  redis.call('HSET', sp.task .. id, 'state', 'aggregating', 'group', g)
  redis.call('ZADD', sp.our .. 'r:' .. lane .. '|' .. fk, 'NX', t, pk)
  activate_lane(sp, fk, lane)
end

local function waited_as(tk, sd)
  if sd then
    return 'deferred:'
  end
  return 'retry:'
end
