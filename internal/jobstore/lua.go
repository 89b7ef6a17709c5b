package jobstore

import "github.com/shaperhq/shaper/internal/script"

// finishScript ends taken tasks of one queue, each as asynq's MarkAsComplete
// or Done (succeeded), Retry or Archive would, and keeps shaper's counters.
// An item whose task is not both in the active list and the lease set
// changes nothing: its lease ran out and it was recovered, or another
// caller finished it first.
//
//	KEYS[1] -> active list
//	KEYS[2] -> lease set
//	KEYS[3] -> completed set
//	KEYS[4] -> retry set
//	KEYS[5] -> archived set
//	KEYS[6] -> processed count of the day
//	KEYS[7] -> processed total
//	KEYS[8] -> failed count of the day
//	KEYS[9] -> failed total
//	KEYS[10] -> shaper's counter hash, fields "<state>:<lane>" (a failing
//	  retry counts retry, a deferring one deferred)
//	KEYS[11] -> shaper's partition backlog, a sorted set of partition -> tasks
//	KEYS[12] -> with tombstones (ARGV[9] > 0): the tombstone set (see
//	  trimLib); without, the task hashes start here
//	KEYS[11+g+i] -> the task hash of item i (from 1), g 1 with tombstones
//	KEYS[...] -> uniqueness lock keys, as the items name them
//	ARGV[1] -> score for the archived set: now, Unix seconds (see Score)
//	ARGV[2] -> when new daily stats keys expire, Unix seconds
//	ARGV[3..5] -> with a retry among the items: a hash whose field "sleep"
//	  says workers sleep ("" = none; in the queue's slot), and the channel
//	  and message that wake them
//	ARGV[6], ARGV[7] -> most tasks the completed and the archived set keep
//	  (0 = no bound); past it the lowest scores go, up to the number of
//	  items plus ARGV[8] per set
//	ARGV[9], ARGV[10] -> most tombstones kept (0 = none) and for how many
//	  seconds
//	ARGV[11] -> task key prefix
//	ARGV[12] -> side key prefixes deleted with a trimmed task, joined by
//	  newlines ("" = none; each in the queue's slot)
//	ARGV[13..17] -> records of deleted idempotency keys' tasks
//	  (Remembered.args): the bucket index key ("" = none; its buckets are
//	  built from it, in the queue's slot), window and span in seconds, the
//	  Lua pattern of such an ID, the cancel mark's prefix
//	then per item, 11 values:
//	  id, lane, partition ("" = none), outcome ("s" succeeded, "r" retry,
//	  "d" dead), encoded message to store, "1" when a result follows (else
//	  "0"), result, score in the completed set ("" = delete the task) or in
//	  the retry set, "1" when a retry is a failure (else "0"), index in KEYS
//	  of the uniqueness lock to release (0 = none), and a lease score the
//	  task's lease must not be later than ("" = any: a recovery's check)
//
// Returns one integer per item: 1 finished, 0 not active.
var finishScript = script.New(trimLib + `
local active, lease, completed, retry, archived = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local counts, pbacklog = KEYS[10], KEYS[11]
local now, stats_expire = ARGV[1], ARGV[2]

local function count(field, by)
  if redis.call('HINCRBY', counts, field, by) <= 0 then
    redis.call('HDEL', counts, field)
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
for b = 18, #ARGV, 11 do
  i = i + 1
  local id, lane, partition, outcome = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local msg, has_result, result, score = ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7]
  local failure, unique = ARGV[b + 8], tonumber(ARGV[b + 9])
  local lapsed = ARGV[b + 10]
  local task = KEYS[11 + g + i]
  -- A caller that could not decode the job knows no lane: the task's
  -- own, where shaper's enqueue wrote them. (Read only then: this runs
  -- once per finished job.)
  if lane == '' then
    local own = redis.call('HMGET', task, 'sl', 'sp')
    if own[1] then
      lane, partition = own[1], own[2] or ''
    end
  end
  -- ZSCORE first: LREM removes as it checks, so nothing changes unless the
  -- task is in both.
  local held = redis.call('ZSCORE', lease, id)
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
  else
    redis.call('ZREM', lease, id)
    count('active:' .. lane, -1)
    if has_result == '1' then
      redis.call('HSET', task, 'result', result)
    end
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
        redis.call('ZADD', completed, score, id)
        redis.call('HSET', task, 'msg', msg, 'state', 'completed')
        count('succeeded:' .. lane, 1)
      end
    elseif outcome == 'r' then
      redis.call('ZADD', retry, score, id)
      retried = true
      if failure == '1' then
        redis.call('HSET', task, 'msg', msg, 'state', 'retry')
        redis.call('HDEL', task, 'sd')
        count('retry:' .. lane, 1)
        processed = processed + 1
        failed = failed + 1
      else
        -- Handed back: shaper's sd mark tells it from a failure when it
        -- leaves the retry set (see Space.Enqueue).
        redis.call('HSET', task, 'msg', msg, 'state', 'retry', 'sd', '1')
        count('deferred:' .. lane, 1)
      end
    else
      redis.call('ZADD', archived, now, id)
      redis.call('HSET', task, 'msg', msg, 'state', 'archived')
      count('dead:' .. lane, 1)
      leave_backlog(partition)
      processed = processed + 1
      failed = failed + 1
    end
    out[i] = 1
  end
end
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
trim(completed, counts, 'succeeded', tonumber(ARGV[6]), budget, ARGV[11], sides, gone, rem)
trim(archived, counts, 'dead', tonumber(ARGV[7]), budget, ARGV[11], sides, gone, rem)
-- A retry's time is known to this caller only: workers that sleep learn
-- of it from a wake-up (see WakeOnRetry).
if retried and ARGV[3] ~= '' and redis.call('HDEL', ARGV[3], 'sleep') == 1 then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return out
`)

// extendScript moves the lease of tasks that still hold one; ZADD XX
// leaves out a task whose lease already went, so it is not resurrected.
//
//	KEYS[1] -> lease set
//	ARGV[1] -> new lease end, Unix seconds
//	ARGV[2..] -> task ids
//
// Returns how many of the tasks still held a lease.
var extendScript = script.New(`
local held = 0
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], ARGV[i])
    held = held + 1
  end
end
return held
`)

// expiredScript lists tasks whose lease has run out, oldest lease first. A
// lease naming a task whose hash is gone can never be finished; it is
// dropped (with its active list entry) so it does not fill every later
// page. (One whose task is not in the active list is dropped by the
// recovery's Finish.)
//
//	KEYS[1] -> lease set
//	KEYS[2] -> active list
//	ARGV[1] -> now, Unix seconds
//	ARGV[2] -> most leases to look at
//	ARGV[3] -> task key prefix (the task hashes share the queue's slot)
//
// Returns {id, msg, sl, sp} per task, sl and sp "" when unset.
var expiredScript = script.New(`
local out = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  local v = redis.call('HMGET', ARGV[3] .. id, 'msg', 'sl', 'sp')
  if v[1] then
    out[#out + 1] = {id, v[1], v[2] or '', v[3] or ''}
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('LREM', KEYS[2], 0, id)
  end
end
return out
`)

// deleteExpiredScript deletes finished tasks whose time in the completed or
// archived set is up, and counts them out of shaper's counters by the lane
// in each task's sl field.
//
//	KEYS[1] -> completed or archived set
//	KEYS[2] -> shaper's counter hash
//	ARGV[1] -> cutoff, Unix seconds: scores at or below it go
//	ARGV[2] -> most tasks to delete
//	ARGV[3] -> task key prefix (the task hashes share the queue's slot)
//	ARGV[4] -> counter state of the set: "succeeded" or "dead"
//	ARGV[5] -> now, Unix seconds
//	ARGV[6], ARGV[7] -> as the finish script's ARGV[9], ARGV[10]; with
//	  tombstones, KEYS[3] is their set
//	ARGV[8] -> as the finish script's ARGV[12]
//	ARGV[9] -> most tasks the set keeps (0 = no bound): past it, the
//	  lowest scores go too, within ARGV[2] in all
//	ARGV[10..14] -> as the finish script's ARGV[13..17]
//
// Returns how many tasks it deleted.
var deleteExpiredScript = script.New(trimLib + `
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local gone = nil
if tonumber(ARGV[6]) > 0 then
  gone = {key = KEYS[3], most = tonumber(ARGV[6]), ttl = tonumber(ARGV[7]), now = tonumber(ARGV[5])}
end
local sides = side_prefixes(ARGV[8])
local rem = remembering(ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[14])
local tomb = {}
for _, id in ipairs(ids) do
  if not forget(id, KEYS[2], ARGV[4], ARGV[3], sides, rem) then
    tomb[#tomb + 1] = id
  end
  redis.call('ZREM', KEYS[1], id)
end
entomb(gone, tomb, #ids)
-- Then the count bound, within the same limit: an upstream that finishes
-- nothing more still comes down to it.
local trimmed = trim(KEYS[1], KEYS[2], ARGV[4], tonumber(ARGV[9]), tonumber(ARGV[2]) - #ids, ARGV[3], sides, gone, rem)
return #ids + trimmed
`)

// trimLib is Lua shared by the scripts that delete finished tasks.
//
// forget deletes one finished task's hash and side keys and counts it out
// of <state>:<lane> in the counter hash, by the lane in its sl field; a
// task whose ID is an idempotency key's gets a record (see Remembered)
// instead of a tombstone, which serves a read as well.
//
// entomb records deleted tasks in the tombstone set gone.key, a sorted set
// of task id -> when it went, so that reading one can tell "finished, no
// longer kept" from "never was". It is itself bounded: at most gone.most
// members (the oldest go), none older than gone.ttl seconds, and the key
// expires gone.ttl after the last write; what one call removes is bounded
// by what it adds plus the same margin.
//
// trim deletes the lowest-scored tasks of a completed or archived set past
// its bound most, at most budget of them.
const trimLib = RememberLua + `
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
  local lane = redis.call('HGET', task, 'sl')
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
  local tomb = {}
  for _, id in ipairs(ids) do
    if not forget(id, counts, state, prefix, sides, rem) then
      tomb[#tomb + 1] = id
    end
  end
  redis.call('ZREMRANGEBYRANK', set, 0, #ids - 1)
  entomb(gone, tomb, budget + #ids)
  return #ids
end
`
