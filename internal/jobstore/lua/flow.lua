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
--     one that would go next (see take.lua); but a key or lane that
--     waited on the calendar comes back at the time it left with
--     (kept_start)
--   kept_start(sp, kept, ms, t0) -> the virtual times at which members ms
--     join a set (f, or a key's lanes) whose virtual time is t0 (nil:
--     it is empty; then the least time in kept is, else 0): each at t0,
--     but a member kept in the sorted set named kept (kv: keys, which
--     left with their lanes on the calendar; kl:FK: key FK's lanes, which
--     left for the calendar; take.lua) at the time it left with, within
--     two (of virtual time: sends at weight 1) of t0, so that waiting for
--     its partitions loses it its place no more than it gives it the
--     service others had meanwhile; kept forgets them
--   push(sp, id, lane, fk, pk, seq, t) puts job id into its flow
--     LANE|FK|PK at FIFO place seq (its partition ready at t, µs, unless it
--     already waits) as asynq's aggregating task
--   waited_as(tk, sd) -> the counter ("deferred:" or "retry:") a job
--     leaving asynq's retry set was counted in, by its sd field (set:
--     handed back); the mark stays, saying the last error is a hand-back's
local function space(our, group, task, v, f, cal, groups)
  return {our = our, group = group, task = task, v = v, f = f, cal = cal, groups = groups}
end

local function kept_start(sp, kept, ms, t0)
  local k = sp.our .. kept
  local out = {}
  local was = {}
  if redis.call('EXISTS', k) == 1 then
    was = redis.call('ZMSCORE', k, unpack(ms))
    if t0 == nil then
      -- The set is empty: those waiting on the calendar are the
      -- rotation's time.
      local r = redis.call('ZRANGE', k, '0', '0', 'WITHSCORES')
      t0 = tonumber(r[2])
    end
    redis.call('ZREM', k, unpack(ms))
  end
  for i = 1, #ms do
    local t = t0 or 0
    if was[i] then
      t = tonumber(was[i])
      if t0 then t = math.min(math.max(t, t0 - 2), t0 + 2) end
    end
    out[i] = t
  end
  return out
end

-- The lowest score of set key, nil when it is empty.
local function lowest(key)
  local r = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #r == 0 then return nil end
  return tonumber(r[2])
end

local function activate_lane(sp, fk, lane)
  local lk = sp.our .. 'l:' .. fk
  if redis.call('ZSCORE', lk, lane) == false then
    redis.call('ZADD', lk, kept_start(sp, 'kl:' .. fk, {lane}, lowest(lk))[1], lane)
    redis.call('ZREM', sp.cal, lane .. '|' .. fk)
  end
  if redis.call('ZSCORE', sp.f, fk) == false then
    redis.call('ZADD', sp.f, kept_start(sp, 'kv', {fk}, lowest(sp.f))[1], fk)
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
