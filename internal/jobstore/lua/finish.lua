-- finish.lua ends taken tasks of one queue, each as asynq's MarkAsComplete
-- or Done (succeeded), Retry or Archive would, and keeps shaper's counters.
-- An item whose task is not both in the active list and the lease set
-- changes nothing: its lease ran out and it was recovered, or another
-- caller finished it first.
--
-- KEYS[1] -> active list
-- KEYS[2] -> lease set
-- KEYS[3] -> completed set
-- KEYS[4] -> retry set
-- KEYS[5] -> archived set
-- KEYS[6] -> processed count of the day
-- KEYS[7] -> processed total
-- KEYS[8] -> failed count of the day
-- KEYS[9] -> failed total
-- KEYS[10] -> shaper's counter hash, fields "<state>:<lane>" (a failing
--    retry counts retry, a deferring one deferred)
-- KEYS[11] -> shaper's partition backlog, a sorted set of partition -> tasks
-- KEYS[12] -> with tombstones (ARGV[9] > 0): the tombstone set (see
--    trim.lua); without, the task hashes start here
-- KEYS[11+g+i] -> the task hash of item i (from 1), g 1 with tombstones
-- KEYS[...] -> uniqueness lock keys, as the items name them
-- ARGV[1] -> score for the archived set: now, Unix seconds (see Score)
-- ARGV[2] -> when new daily stats keys expire, Unix seconds
-- ARGV[3..5] -> with a retry among the items: a hash whose field "sleep"
--    says workers sleep ("" = none; in the queue's slot), and the channel
--    and message that wake them
-- ARGV[6], ARGV[7] -> most tasks the completed and the archived set keep
--    (0 = no bound); past it the lowest scores go, up to the number of
--    items plus ARGV[8] per set
-- ARGV[9], ARGV[10] -> most tombstones kept (0 = none) and for how many
--    seconds
-- ARGV[11] -> task key prefix
-- ARGV[12] -> side key prefixes deleted with a trimmed task, joined by
--    newlines ("" = none; each in the queue's slot)
-- ARGV[13..17] -> records of deleted idempotency keys' tasks
--    (Remembered.args): the bucket index key ("" = none; its buckets are
--    built from it, in the queue's slot), window and span in seconds, the
--    Lua pattern of such an ID, the cancel mark's prefix
-- ARGV[18] -> the channel that announces jobs made final (see
--    AnnounceFinal; "" = none)
-- ARGV[19] -> index in KEYS of the upstream's callback due set (0 = none
--    declared: the set the task's cb field names)
--    then per item, 13 values:
--    id, lane, partition ("" = none), outcome ("s" succeeded, "r" retry,
--    "d" dead), encoded message to store, "1" when a result follows (else
--    "0"), result, score in the completed set ("" = delete the task) or in
--    the retry set, "1" when a retry is a failure (else "0"), index in KEYS
--    of the uniqueness lock to release (0 = none), and a lease score the
--    task's lease must not be later than ("" = any: a recovery's check),
--    a deferring retry's sd mark (what it waits for), and "1" when the job
--    has a callback (else "0"; an item without a lane reads it from the
--    task, as it does its lane)
--
-- Returns one integer per item: 1 finished, 0 not active.
--
-- A job with a callback that ends succeeded (kept) or dead has its
-- delivery recorded here too (callback.lua): only then is its cb field
-- read.
--
-- Needs remember.lua, trim.lua and callback.lua before it (see lua.go).
local active, lease, completed, retry, archived = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local counts, pbacklog = KEYS[10], KEYS[11]
local now, stats_expire = ARGV[1], ARGV[2]

-- The counters move once per call, by their sums (count_all, after the
-- items), and the completed set takes its members in one ZADD.
local deltas, kept, archiving = {}, {}, false
local function count(field, by)
  deltas[field] = (deltas[field] or 0) + by
end
local function count_all()
  for field, by in pairs(deltas) do
    if by ~= 0 and redis.call('HINCRBY', counts, field, by) <= 0 then
      redis.call('HDEL', counts, field)
    end
  end
  if #kept > 0 then
    redis.call('ZADD', completed, unpack(kept))
  end
end

local function leave_backlog(partition)
  if partition ~= '' then
    if tonumber(redis.call('ZINCRBY', pbacklog, -1, partition)) <= 0 then
      redis.call('ZREM', pbacklog, partition)
    end
  end
end

local function bump(day, total, n)
  if n > 0 then
    if redis.call('INCRBY', day, n) == n then
      redis.call('EXPIREAT', day, stats_expire)
    end
    redis.call('INCRBY', total, n)
  end
end

-- set_task writes a finished task's fields, and its result when one
-- follows, in one HSET (one command a job, not two); a task deleted on
-- finishing stores no result.
local function set_task(task, has_result, result, ...)
  if has_result == '1' then
    redis.call('HSET', task, 'result', result, ...)
  else
    redis.call('HSET', task, ...)
  end
end

local rem = remembering(ARGV[13], ARGV[14], ARGV[15], ARGV[16], ARGV[17])
local gone_max = tonumber(ARGV[9])
local g = 0
if gone_max > 0 then
  g = 1
end
local processed, failed = 0, 0
local out = {}
local i = 0
local retried = false
local due_key = KEYS[tonumber(ARGV[19])]
for b = 20, #ARGV, 13 do
  i = i + 1
  local id, lane, partition, outcome = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local msg, has_result, result, score = ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7]
  local failure, unique = ARGV[b + 8], tonumber(ARGV[b + 9])
  local lapsed, waits = ARGV[b + 10], ARGV[b + 11]
  local task = KEYS[11 + g + i]
  -- cb: the task's cb field once read (false: none), nil: not read.
  local cb
  if ARGV[b + 12] ~= '1' then cb = false end
  -- A caller that could not decode the job knows no lane: the task's
  -- own, where shaper's enqueue wrote them. (Read only then: this runs
  -- once per finished job.)
  if lane == '' then
    local own = redis.call('HMGET', task, 'sl', 'sp', 'cb')
    if own[1] then
      lane, partition = own[1], own[2] or ''
    end
    cb = own[3]
  end
  -- The due set of the job's callback (nil: none).
  local function due()
    if cb == nil then cb = redis.call('HGET', task, 'cb') end
    if cb then return due_key or cb end
  end
  -- A recovery reads the lease first: LREM removes as it checks, so
  -- nothing changes unless the task is in both. An ordinary finish takes
  -- the task off the active list, then its lease, and puts it back on
  -- the list if it held none (active, not leased: nothing can end it).
  local held = true
  if lapsed ~= '' then
    held = redis.call('ZSCORE', lease, id)
  end
  if not held or (lapsed ~= '' and tonumber(held) > tonumber(lapsed)) then
    -- (A recovery names the lease it saw run out: a task taken again
    -- since, under a new lease, is not the recovery's to end.)
    out[i] = 0
  elseif redis.call('LREM', active, 0, id) == 0 then
    -- Leased but not active: nothing can end it. A recovery drops the
    -- stray lease, which would otherwise be listed as lapsed for ever.
    if lapsed ~= '' then
      redis.call('ZREM', lease, id)
    end
    out[i] = 0
  elseif redis.call('ZREM', lease, id) == 0 then
    redis.call('LPUSH', active, id)
    out[i] = 0
  else
    count('active:' .. lane, -1)
    if outcome == 's' then
      processed = processed + 1
      leave_backlog(partition)
      if unique > 0 and redis.call('GET', KEYS[unique]) == id then
        redis.call('DEL', KEYS[unique])
      end
      if score == '' then
        -- Not kept at all: an idempotency key's task is remembered.
        if rem and string.find(id, rem.pattern) then
          remember(rem.key, id, 's', rem.window, rem.span)
        end
        redis.call('DEL', task)
      else
        kept[#kept + 1] = score
        kept[#kept + 1] = id
        set_task(task, has_result, result, 'msg', msg, 'state', 'completed')
        count('succeeded:' .. lane, 1)
        callback_due(task, id, due())
      end
    elseif outcome == 'r' then
      redis.call('ZADD', retry, score, id)
      retried = true
      if failure == '1' then
        set_task(task, has_result, result, 'msg', msg, 'state', 'retry')
        redis.call('HDEL', task, 'sd')
        count('retry:' .. lane, 1)
        processed = processed + 1
        failed = failed + 1
      else
        -- Handed back: shaper's sd mark (what it waits for) tells it from
        -- a failure, in the retry set and after (see flow.lua's
        -- waited_as); it goes when an attempt fails, the task dies or is
        -- retried (a cancel keeps it: see revive.lua).
        set_task(task, has_result, result, 'msg', msg, 'state', 'retry', 'sd', waits)
        count('deferred:' .. lane, 1)
      end
    else
      redis.call('ZADD', archived, now, id)
      archiving = true
      set_task(task, has_result, result, 'msg', msg, 'state', 'archived')
      redis.call('HDEL', task, 'sd')
      callback_due(task, id, due())
      count('dead:' .. lane, 1)
      leave_backlog(partition)
      processed = processed + 1
      failed = failed + 1
    end
    out[i] = 1
  end
end
count_all()
bump(KEYS[6], KEYS[7], processed)
bump(KEYS[8], KEYS[9], failed)
-- Bounded by count as well as age: the oldest go, a bounded few per call
-- (this call's items and a margin), so an excess (a lowered bound) goes
-- over the next calls without holding Redis for long in any one.
local gone = {key = KEYS[12], most = gone_max, ttl = tonumber(ARGV[10]), now = tonumber(now)}
if g == 0 then
  gone = nil
end
local budget = i + tonumber(ARGV[8])
local sides = side_prefixes(ARGV[12])
-- A set this call added nothing to is left to the retention sweep, which
-- holds it to its bound too.
if #kept > 0 then
  trim(completed, counts, 'succeeded', tonumber(ARGV[6]), budget, ARGV[11], sides, gone, rem)
end
if archiving then
  trim(archived, counts, 'dead', tonumber(ARGV[7]), budget, ARGV[11], sides, gone, rem)
end
-- A retry's time is known to this caller only: workers that sleep learn
-- of it from a wake-up (see WakeOnRetry).
if retried and ARGV[3] ~= '' and redis.call('HDEL', ARGV[3], 'sleep') == 1 then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
-- Jobs made final (succeeded, dead) are announced, every id of the call in
-- one message, one per line: long polls wake on it (see Finals), at one
-- command per call whoever waits.
if ARGV[18] ~= '' then
  local final, n = {}, 0
  for b = 20, #ARGV, 13 do
    n = n + 1
    if out[n] == 1 and ARGV[b + 3] ~= 'r' then
      final[#final + 1] = ARGV[b]
    end
  end
  if #final > 0 then
    redis.call('PUBLISH', ARGV[18], table.concat(final, '\n'))
  end
end
return out
