-- forward.lua: a library for the take. Needs count.lua and flow.lua before
-- it.
--
--   forward_due(sp, scheduled, retry, counts, now, due) -> firsts: with
--     due, moves jobs of asynq's scheduled and retry sets (keys) that are
--     due at now (µs) into their flows, at their old FIFO place, counting
--     them pending in the counter hash counts; and brings the calendar's
--     lanes whose time came back into the rotation. At most 200 of each set
--     and of the calendar per call: the rest comes due at the next take.
--     Each set's first member is read before anything of it is moved, so a
--     set with nothing due costs one read, and when none of the three
--     exists one EXISTS answers for all (where the calendar alone does,
--     it and the EXISTS answer for the due sets); firsts = {scheduled, retry, cal}
--     holds each set's lowest score as it stands after the call (false:
--     empty; nil: not known, because something of it moved, or, without
--     due, it was not read), which the take needs for its answer, and
--     seen, activate_lanes' (nil: no lane came back)
--   due_firsts(scheduled, retry, cal) -> firsts as forward_due's, without
--     moving anything
--   first_score(key) -> the lowest score of a sorted set, false if empty
--   activate_lanes(sp, ms) -> seen: activate_lane (flow.lua) for each
--     calendar entry LANE|FK of the list ms, taken off the calendar; seen
--     maps each key's lanes' set that was empty to the members it holds
--     now, all at score 0 (forward_due's firsts.seen; a set whose lanes
--     come back at other times is not in it); keys and lanes come back at
--     kept_start's times (flow.lua)
local function first_score(key)
  local r = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')
  if #r == 0 then
    return false
  end
  return tonumber(r[2])
end

-- activate_lanes(sp, ms) is activate_lane for each calendar entry
-- LANE|FK of ms (already off the calendar), in a few calls, not a few per
-- entry: a member that joins a set at its virtual time leaves that time as
-- it was, so each set's is read once, and one ZADD NX per set adds those
-- not in it, all at that time. (The lanes calendared together are those of
-- a partitioned upstream whose partitions were all parked at one take:
-- several keys' at once.)
local function activate_lanes(sp, ms)
  local lanes, fks = {}, {}
  for _, m in ipairs(ms) do
    local bar = string.find(m, '|', 1, true)
    local lane, fk = string.sub(m, 1, bar - 1), string.sub(m, bar + 1)
    local ls = lanes[fk]
    if not ls then
      ls = {}
      lanes[fk] = ls
      fks[#fks + 1] = fk
    end
    ls[#ls + 1] = lane
  end
  -- seen: the lanes' sets that were empty, each -> the members it now
  -- holds, at score 0 (so the take need not read them).
  local seen = {}
  local z, tf = {}, first_score(sp.f)
  local ts = kept_start(sp, 'kv', fks, tf or nil)
  for i, fk in ipairs(fks) do
    local lk = sp.our .. 'l:' .. fk
    local t = first_score(lk)
    local ls = lanes[fk]
    local tl = kept_start(sp, 'kl:' .. fk, ls, t or nil)
    local zl = {}
    local zero = true
    for j, lane in ipairs(ls) do
      zl[2 * j - 1], zl[2 * j] = tl[j], lane
      if tl[j] ~= 0 then zero = false end
    end
    if not t and zero then seen[lk] = ls end
    redis.call('ZADD', lk, 'NX', unpack(zl))
    z[2 * i - 1], z[2 * i] = ts[i], fk
  end
  redis.call('ZADD', sp.f, 'NX', unpack(z))
  return seen
end

local function due_firsts(scheduled, retry, cal)
  if redis.call('EXISTS', scheduled, retry, cal) == 0 then
    return {scheduled = false, retry = false, cal = false}
  end
  return {scheduled = first_score(scheduled), retry = first_score(retry), cal = first_score(cal)}
end

local function forward_due(sp, scheduled, retry, counts, now, due)
  local firsts = {}
  -- cal1: the calendar's first score (false: empty) as read; nil: to be
  -- read (below).
  local cal1
  if due then
    local n = redis.call('EXISTS', scheduled, retry, sp.cal)
    if n == 0 then
      return {scheduled = false, retry = false, cal = false}
    end
    -- The calendar is read first: where it is the one that exists (a
    -- partitioned upstream's, whose lanes wait on it), the due sets,
    -- empty, are not read.
    cal1 = first_score(sp.cal)
    if cal1 then n = n - 1 end
    local sets = {scheduled, retry}
    if n == 0 then
      sets = {}
      firsts[1], firsts[2] = false, false
    end
    local now_s = now / 1000000
    for z, set in ipairs(sets) do
      local first = first_score(set)
      if first and first <= now_s then
        first = nil
        local ids = redis.call('ZRANGEBYSCORE', set, '-inf', now_s, 'LIMIT', '0', '200')
        -- (A push may take its lane off the calendar: it is read after.)
        cal1 = nil
        for _, id in ipairs(ids) do
          redis.call('ZREM', set, id)
          local f = redis.call('HMGET', sp.task .. id, 'sl', 'sf', 'sp', 'sq', 'sd')
          if f[1] then
            local from = 'scheduled:'
            if set == retry then from = waited_as(sp.task .. id, f[5]) end
            push(sp, id, f[1], f[2] or '', f[3] or '', tonumber(f[4] or '0'), now)
            count(counts, from .. f[1], -1)
            count(counts, 'pending:' .. f[1], 1)
          end
        end
      end
      firsts[z] = first
    end
  end
  local first, seen = cal1, nil
  if first == nil then first = first_score(sp.cal) end
  if first and first <= now then
    first = nil
    local ms = redis.call('ZRANGEBYSCORE', sp.cal, '-inf', now, 'LIMIT', '0', '200')
    redis.call('ZREM', sp.cal, unpack(ms))
    seen = activate_lanes(sp, ms)
  end
  return {scheduled = firsts[1], retry = firsts[2], cal = first, seen = seen}
end
