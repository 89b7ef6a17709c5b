-- trim.lua: a library for the scripts that count finished tasks and delete
-- them. Needs remember.lua before it. It defines:
--
--   tally(t, lane) -> the changes to lane's counts in the tally t: a list
--     of five numbers, for the states active, succeeded, retry, deferred
--     and dead, in that order (t lists its lanes, and maps each to its
--     list)
--   settle(counts, t) moves shaper's counter hash counts by the tally t:
--     one HINCRBY a field "<state>:<lane>" whose sum moved, the field
--     deleted once it reaches 0 or less (as when each change is applied in
--     turn: a count never goes below nothing)
--   sweeper(s) -> forget, entomb, trim, the functions that delete, bound
--     to the settings s = {prefix, sides, gone, rem, tally}; a script's
--     local functions are made anew on every call, so only a call that
--     deletes makes these:
--     s.prefix: the task key prefix; s.sides: side key prefixes (a list)
--     whose key the task id completes, deleted with the task; s.gone: the
--     tombstones, {key, most, ttl, at, before}, or nil for none (ttl in
--     whole seconds, at least 1; at is now as a score, before is "(" and
--     the score ttl before it, as strings: what Redis is given); s.rem: the
--     records of idempotency keys' tasks, {key, window, span, pattern,
--     cancel} (Remembered.args), or nil for none; s.tally: where deleted
--     tasks are counted out (the caller settles it)
--
--   forget(id, state) deletes one finished task's hash and side keys and
--     counts it out of state (2 succeeded, 5 dead: its place in a tally)
--     for the lane in its sl field; a task whose ID is an idempotency
--     key's gets a record (s.rem) instead of a tombstone, which serves a
--     read as well: then it returns true. A task whose callback is still
--     to be delivered (cbs pending) is kept, whatever its bound: it
--     returns "kept", and the caller leaves it in its set, so that the
--     delivery, which reads the task, is never lost to a trim; it goes at
--     a later trim, once delivered or failed for good
--   entomb(ids, budget) records deleted tasks in the tombstone set
--     s.gone.key, a sorted set of task id -> when it went, so that reading
--     one can tell "finished, no longer kept" from "never was". It is
--     itself bounded: at most s.gone.most members (the oldest go), none
--     older than s.gone.ttl seconds, and the key expires s.gone.ttl after
--     the last write; what one call removes is bounded by what it adds
--     plus budget.
--   trim(set, state, excess, budget) deletes the lowest-scored tasks of a
--     completed (state 2) or archived (5) set that holds excess past its
--     bound, at most budget of them; returns how many
local function tally(t, lane)
  local moved = t[lane]
  if not moved then
    moved = {0, 0, 0, 0, 0}
    t[lane] = moved
    t[#t + 1] = lane
  end
  return moved
end

local function settle(counts, t)
  for i = 1, #t do
    local lane = t[i]
    local moved = t[lane]
    for state = 1, 5 do
      local by = moved[state]
      if by ~= 0 then
        local field
        if state == 1 then
          field = 'active:' .. lane
        elseif state == 2 then
          field = 'succeeded:' .. lane
        elseif state == 3 then
          field = 'retry:' .. lane
        elseif state == 4 then
          field = 'deferred:' .. lane
        else
          field = 'dead:' .. lane
        end
        -- (A number argument costs Redis a formatting; these are the
        -- common ones.)
        if by == 1 then
          by = '1'
        elseif by == -1 then
          by = '-1'
        end
        if redis.call('HINCRBY', counts, field, by) <= 0 then
          redis.call('HDEL', counts, field)
        end
      end
    end
  end
end
local function sweeper(s)
  local function forget(id, state)
    local task = s.prefix .. id
    local f = redis.call('HMGET', task, 'sl', 'cbs')
    if f[2] == 'pending' then
      return 'kept'
    end
    local lane = f[1]
    local remembered = false
    local rem = s.rem
    if rem and string.find(id, rem.pattern) then
      local letter = 's'
      if state ~= 2 then
        letter = 'd'
        if rem.cancel ~= '' and redis.call('EXISTS', rem.cancel .. id) == 1 then
          letter = 'c'
        end
      end
      remember(rem.key, id, letter, rem.window, rem.span)
      remembered = true
    end
    local sides = s.sides
    if #sides == 0 then
      redis.call('DEL', task)
    elseif #sides == 1 then
      redis.call('DEL', task, sides[1] .. id)
    else
      local keys = {task}
      for _, p in ipairs(sides) do
        keys[#keys + 1] = p .. id
      end
      redis.call('DEL', unpack(keys))
    end
    if lane then
      local moved = tally(s.tally, lane)
      moved[state] = moved[state] - 1
    end
    return remembered
  end

  local function entomb(ids, budget)
    local gone = s.gone
    if not gone or #ids == 0 then
      return
    end
    local add = {}
    for _, id in ipairs(ids) do
      add[#add + 1] = gone.at
      add[#add + 1] = id
    end
    redis.call('ZADD', gone.key, unpack(add))
    local old = redis.call('ZCOUNT', gone.key, '-inf', gone.before)
    local over = redis.call('ZCARD', gone.key) - gone.most
    local drop = math.min(math.max(old, over), budget)
    if drop > 0 then
      local last = drop - 1
      if last == 0 then last = '0' end
      redis.call('ZREMRANGEBYRANK', gone.key, '0', last)
    end
    redis.call('EXPIRE', gone.key, gone.ttl)
  end

  local function trim(set, state, excess, budget)
    if excess <= 0 or budget <= 0 then
      return 0
    end
    -- (Number arguments cost Redis a formatting; 0 is the common one.)
    local last = math.min(excess, budget) - 1
    if last == 0 then last = '0' end
    local ids = redis.call('ZRANGE', set, '0', last)
    local tomb, kept = {}, {}
    for _, id in ipairs(ids) do
      local r = forget(id, state)
      if r == 'kept' then
        kept[#kept + 1] = id
      elseif not r then
        tomb[#tomb + 1] = id
      end
    end
    if #kept == 0 then
      last = #ids - 1
      if last == 0 then last = '0' end
      redis.call('ZREMRANGEBYRANK', set, '0', last)
    else
      local keep = {}
      for _, id in ipairs(kept) do keep[id] = true end
      for _, id in ipairs(ids) do
        if not keep[id] then redis.call('ZREM', set, id) end
      end
    end
    entomb(tomb, budget + #ids)
    return #ids - #kept
  end

  return forget, entomb, trim
end
