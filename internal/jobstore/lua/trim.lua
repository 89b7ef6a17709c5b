-- trim.lua: a library for the scripts that delete finished tasks. Needs
-- remember.lua before it. It defines:
--
--   side_prefixes(s) -> the prefixes in s, one a line
--   remembering(key, window, span, pattern, cancel) -> nil when key is "",
--     else the record settings rem = {key, window, span, pattern, cancel}
--     (Remembered.args)
--   forget(id, counts, state, prefix, sides, rem) deletes one finished
--     task's hash and side keys and counts it out of <state>:<lane> in the
--     counter hash, by the lane in its sl field; a task whose ID is an
--     idempotency key's gets a record (rem) instead of a tombstone, which
--     serves a read as well: then it returns true. A task whose callback
--     is still to be delivered (cbs pending) is kept, whatever its bound:
--     it returns "kept", and the caller leaves it in its set, so that the
--     delivery, which reads the task, is never lost to a trim; it goes at
--     a later trim, once delivered or failed for good
--   entomb(gone, ids, budget) records deleted tasks in the tombstone set
--     gone.key, a sorted set of task id -> when it went, so that reading
--     one can tell "finished, no longer kept" from "never was". It is
--     itself bounded: at most gone.most members (the oldest go), none
--     older than gone.ttl seconds, and the key expires gone.ttl after the
--     last write; what one call removes is bounded by what it adds plus
--     budget. gone = {key, most, ttl, now} or nil for no tombstones.
--   trim(set, counts, state, most, budget, prefix, sides, gone, rem)
--     deletes the lowest-scored tasks of a completed or archived set past
--     its bound most, at most budget of them; returns how many
local function side_prefixes(s)
  local out = {}
  for p in string.gmatch(s, '[^\n]+') do
    out[#out + 1] = p
  end
  return out
end

-- rem is nil or {key, window, span, pattern, cancel} (Remembered.args):
-- forget records an idempotency key's task there and returns true, so it
-- needs no tombstone.
local function forget(id, counts, state, prefix, sides, rem)
  local task = prefix .. id
  local f = redis.call('HMGET', task, 'sl', 'cbs')
  if f[2] == 'pending' then
    return 'kept'
  end
  local lane = f[1]
  local remembered = false
  if rem and string.find(id, rem.pattern) then
    local letter = 's'
    if state ~= 'succeeded' then
      letter = 'd'
      if rem.cancel ~= '' and redis.call('EXISTS', rem.cancel .. id) == 1 then
        letter = 'c'
      end
    end
    remember(rem.key, id, letter, rem.window, rem.span)
    remembered = true
  end
  redis.call('DEL', task)
  for _, p in ipairs(sides) do
    redis.call('DEL', p .. id)
  end
  if lane then
    local field = state .. ':' .. lane
    if redis.call('HINCRBY', counts, field, -1) <= 0 then
      redis.call('HDEL', counts, field)
    end
  end
  return remembered
end

local function remembering(key, window, span, pattern, cancel)
  if key == '' then
    return nil
  end
  return {key = key, window = tonumber(window), span = tonumber(span), pattern = pattern, cancel = cancel}
end

local function entomb(gone, ids, budget)
  if not gone or #ids == 0 then
    return
  end
  for _, id in ipairs(ids) do
    redis.call('ZADD', gone.key, gone.now, id)
  end
  local old = redis.call('ZCOUNT', gone.key, '-inf', '(' .. (gone.now - gone.ttl))
  local over = redis.call('ZCARD', gone.key) - gone.most
  local drop = math.min(math.max(old, over), budget)
  if drop > 0 then
    redis.call('ZREMRANGEBYRANK', gone.key, 0, drop - 1)
  end
  redis.call('EXPIRE', gone.key, math.max(1, math.ceil(gone.ttl)))
end

local function trim(set, counts, state, most, budget, prefix, sides, gone, rem)
  if most <= 0 or budget <= 0 then
    return 0
  end
  local excess = redis.call('ZCARD', set) - most
  if excess <= 0 then
    return 0
  end
  local ids = redis.call('ZRANGE', set, 0, math.min(excess, budget) - 1)
  local tomb, kept = {}, {}
  for _, id in ipairs(ids) do
    local r = forget(id, counts, state, prefix, sides, rem)
    if r == 'kept' then
      kept[#kept + 1] = id
    elseif not r then
      tomb[#tomb + 1] = id
    end
  end
  if #kept == 0 then
    redis.call('ZREMRANGEBYRANK', set, 0, #ids - 1)
  else
    local keep = {}
    for _, id in ipairs(kept) do keep[id] = true end
    for _, id in ipairs(ids) do
      if not keep[id] then redis.call('ZREM', set, id) end
    end
  end
  entomb(gone, tomb, budget + #ids)
  return #ids - #kept
end
