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
--     one that would go next (see take.lua); but a key whose lanes waited
--     on the calendar comes back at the time it left with (key_start)
--   key_start(sp, fks, tf) -> the virtual times at which keys fks join f,
--     whose virtual time is tf (nil: f is empty): each key's at tf, but a
--     key kept in kv (it left the rotation with its lanes on the calendar,
--     take.lua) at the time it left with, within two sends of tf, so
--     that waiting for its partitions loses it its place no more than it
--     gives it the service others had meanwhile; kv forgets them
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

local function key_start(sp, fks, tf)
  local kv = sp.our .. 'kv'
  local out = {}
  local kept = {}
  if redis.call('EXISTS', kv) == 1 then
    kept = redis.call('ZMSCORE', kv, unpack(fks))
    redis.call('ZREM', kv, unpack(fks))
  end
  for i = 1, #fks do
    local t = tf or 0
    if kept[i] then
      t = tonumber(kept[i])
      if tf then t = math.min(math.max(t, tf - 2), tf + 2) end
    end
    out[i] = t
  end
  return out
end

local function activate_lane(sp, fk, lane)
  local lk = sp.our .. 'l:' .. fk
  if redis.call('ZSCORE', lk, lane) == false then
    redis.call('ZADD', lk, virtual_time(lk), lane)
    redis.call('ZREM', sp.cal, lane .. '|' .. fk)
  end
  if redis.call('ZSCORE', sp.f, fk) == false then
    local r = redis.call('ZRANGE', sp.f, 0, 0, 'WITHSCORES')
    local tf
    if #r > 0 then tf = tonumber(r[2]) end
    redis.call('ZADD', sp.f, key_start(sp, {fk}, tf)[1], fk)
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
