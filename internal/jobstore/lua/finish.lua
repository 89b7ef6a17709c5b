-- finish.lua ends taken tasks of one queue, each as asynq's MarkAsComplete
-- or Done (succeeded), Retry or Archive would, and keeps shaper's counters.
-- An item whose task is not both in the active list and the lease set
-- changes nothing: its lease ran out and it was recovered, or another
-- caller finished it first.
--
-- A call sends only what its items need, and what they share once (every
-- key and argument costs Redis about 1,500 instructions): ARGV[1], the
-- call's shape, is a sum of flags (finScore ... in store.go) saying which
-- optional keys, arguments and item fields follow.
--
-- KEYS[1] -> active list
-- KEYS[2] -> lease set
-- KEYS[3] -> shaper's counter hash, fields "<state>:<lane>" (a failing
--    retry counts retry, a deferring one deferred)
-- KEYS[4] -> processed count of the day
-- KEYS[5] -> processed total
-- then, each when its flag is set, in this order:
--    the completed set (KEPT), the retry set (RETRY), the archived set
--    (DEAD), the failed count of the day and the failed total (FAILED),
--    shaper's partition backlog, a sorted set of partition -> tasks
--    (BACKLOG), the tombstone set (GONE, see trim.lua), the upstream's
--    callback due set (DUE: else a delivery goes to the set the task's cb
--    field names)
-- then the task hash of each item, in order
-- then uniqueness lock keys, as the items name them
--
-- ARGV[1] -> the shape
-- ARGV[2] -> what only a new day or a deletion needs, joined by newlines:
--    when a new daily stats key expires (Unix seconds); how many tasks
--    past its bound each set may lose beyond the number of items; most
--    tombstones kept (0 = none), for how many seconds, the score of a new
--    one (now) and "(" and the score of the oldest kept; the task key
--    prefix; records of deleted idempotency keys' tasks
--    (Remembered.args): the bucket index key ("" = none; its buckets are
--    built from it, in the queue's slot), window and span in seconds, the
--    Lua pattern of such an ID, the cancel mark's prefix; and last the
--    side key prefixes deleted with a trimmed task, one a line (each in
--    the queue's slot)
-- then, each when its flag is set, in this order:
--    the kind of every item (not KIND, see below), the score of every
--    item (not SCORE, when KEPT or RETRY), the lane of every item (not
--    LANE), the channel that announces jobs made final (FINAL, see
--    AnnounceFinal), the most tasks the completed set keeps (KEPT; 0 = no
--    bound), the most the archived set keeps and the score for it, now
--    (DEAD), a hash whose field "sleep" says workers sleep, in the
--    queue's slot, and the channel and message that wake them (WAKE)
-- then per item: its id; its encoded message to store; then, each when
--    its flag is set, in this order: its kind (KIND), a letter: "a" and a
--    sum of its outcome (0 succeeded, 1 a deferring retry, 2 a failing
--    retry, 3 dead), 4 when a result follows and 8 when the job has a
--    callback; score in the completed set ("" = delete the task) or in
--    the retry set (SCORE); result (RESULT, "" when none follows); lane
--    (LANE; "" = read the task's, as its partition and its callback);
--    partition (PARTITION, "" = none); index in KEYS of the uniqueness
--    lock to release (UNIQUE, "" = none); a lease score the task's lease
--    must not be later than (LAPSED, "" = any: a recovery's check); a
--    deferring retry's sd mark, what it waits for (WAITS)
--
-- Returns the items not active, by their place (from 1), in order: those
-- it finished are all the others (most calls return an empty list).
--
-- A job with a callback that ends succeeded (kept) or dead has its
-- delivery recorded here too (callback.lua): only then is its cb field
-- read.
--
-- Needs remember.lua, trim.lua and callback.lua before it (see lua.go).
-- A global costs a table lookup on every read; these are read often.
local KEYS, ARGV, call, byte, tonumber = KEYS, ARGV, redis.call, string.byte, tonumber
local shape = tonumber(ARGV[1])
-- The flags, in store.go's order (a script's local functions are made
-- anew on every call, so none tests them).
local SCORE, RESULT, LANE = shape % 2 >= 1, shape % 4 >= 2, shape % 8 >= 4
local PARTITION, UNIQUE, LAPSED = shape % 16 >= 8, shape % 32 >= 16, shape % 64 >= 32
local WAITS, KIND, KEPT = shape % 128 >= 64, shape % 256 >= 128, shape % 512 >= 256
local RETRY, WAKE, DEAD = shape % 1024 >= 512, shape % 2048 >= 1024, shape % 4096 >= 2048
local FAILED, BACKLOG, GONE = shape % 8192 >= 4096, shape % 16384 >= 8192, shape % 32768 >= 16384
local DUE, FINAL = shape % 65536 >= 32768, shape >= 65536

local active, lease, counts = KEYS[1], KEYS[2], KEYS[3]
local k = 5
local completed, retry, archived, failed_day, failed_total, pbacklog, gone_key, due_key
if KEPT then k = k + 1; completed = KEYS[k] end
if RETRY then k = k + 1; retry = KEYS[k] end
if DEAD then k = k + 1; archived = KEYS[k] end
if FAILED then failed_day, failed_total = KEYS[k + 1], KEYS[k + 2]; k = k + 2 end
if BACKLOG then k = k + 1; pbacklog = KEYS[k] end
if GONE then k = k + 1; gone_key = KEYS[k] end
if DUE then k = k + 1; due_key = KEYS[k] end

local a = 2
local call_kind, call_score, call_lane, final_channel, kept_most, dead_most, now, sleep_key, wake_channel, wake_message
if not KIND then a = a + 1; call_kind = byte(ARGV[a]) - 97 end
call_score = ''
if not SCORE and (KEPT or RETRY) then a = a + 1; call_score = ARGV[a] end
if not LANE then a = a + 1; call_lane = ARGV[a] end
if FINAL then a = a + 1; final_channel = ARGV[a] end
if KEPT then a = a + 1; kept_most = ARGV[a] end
if DEAD then dead_most, now = ARGV[a + 1], ARGV[a + 2]; a = a + 2 end
if WAKE then sleep_key, wake_channel, wake_message = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]; a = a + 3 end
local stride = 2
if KIND then stride = stride + 1 end
if SCORE then stride = stride + 1 end
if RESULT then stride = stride + 1 end
if LANE then stride = stride + 1 end
if PARTITION then stride = stride + 1 end
if UNIQUE then stride = stride + 1 end
if LAPSED then stride = stride + 1 end
if WAITS then stride = stride + 1 end

-- The counters move once per call, by their sums (see settle), deleted
-- tasks' included.
local moves = {}

-- ARGV[2], read when a call needs it: a new day's stats key, or a
-- deletion.
local set
local function settings()
  if set then
    return set
  end
  local expire, margin, gone_most, gone_ttl, gone_at, gone_before, prefix, rk, window, span, pattern, cancel, sides =
    string.match(ARGV[2], '^([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)\n' ..
      '([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)\n(.*)$')
  set = {expire = expire, margin = tonumber(margin), prefix = prefix, sides = {}, tally = moves}
  for p in string.gmatch(sides, '[^\n]+') do
    set.sides[#set.sides + 1] = p
  end
  if gone_key and tonumber(gone_most) > 0 then
    set.gone = {key = gone_key, most = tonumber(gone_most), ttl = gone_ttl, at = gone_at, before = gone_before}
  end
  if rk ~= '' then
    set.rem = {key = rk, window = tonumber(window), span = tonumber(span), pattern = pattern, cancel = cancel}
  end
  return set
end

-- set_task writes a finished task's fields, and its result when one
-- follows, in one HSET (one command a job, not two); a task deleted on
-- finishing stores no result.
local function set_task(task, result, ...)
  if result then
    call('HSET', task, 'result', result, ...)
  else
    call('HSET', task, ...)
  end
end

local kept, final, missed = {}, {}, {}
local processed, failed, retried, archiving = 0, 0, false, false
-- left: partition -> jobs of it made final here, off its backlog in one
-- ZINCRBY each after the loop (the -fair case finishes several of a
-- partition in one call).
local left = {}
local n = 0
for b = a + 1, #ARGV, stride do
  n = n + 1
  local id, msg = ARGV[b], ARGV[b + 1]
  local kind, score, result, lane, partition, unique, lapsed, waits = call_kind, call_score, false, call_lane, '', '', '', nil
  local c = b + 2
  if KIND then kind = byte(ARGV[c]) - 97; c = c + 1 end
  if SCORE then score = ARGV[c]; c = c + 1 end
  if RESULT then
    if kind % 8 >= 4 then result = ARGV[c] end
    c = c + 1
  end
  if LANE then lane = ARGV[c]; c = c + 1 end
  if PARTITION then partition = ARGV[c]; c = c + 1 end
  if UNIQUE then unique = ARGV[c]; c = c + 1 end
  if LAPSED then lapsed = ARGV[c]; c = c + 1 end
  if WAITS then waits = ARGV[c] end
  local outcome = kind % 4
  local task = KEYS[k + n]
  -- cb: the task's cb field once read (false: none), nil: not read.
  local cb = false
  if kind >= 8 then cb = nil end
  -- A caller that could not decode the job knows no lane: the task's
  -- own, where shaper's enqueue wrote them. (Read only then: this runs
  -- once per finished job.)
  if lane == '' then
    local own = call('HMGET', task, 'sl', 'sp', 'cb')
    if own[1] then
      lane, partition = own[1], own[2] or ''
    end
    cb = own[3]
  end
  -- A recovery reads the lease first: LREM removes as it checks, so
  -- nothing changes unless the task is in both. An ordinary finish takes
  -- the task off the active list, then its lease, and puts it back on
  -- the list if it held none (active, not leased: nothing can end it).
  -- The take pushes on the left, and jobs end about in the order they
  -- were taken, so the LREM looks from the right and stops at the task
  -- (a task is on the list once): a few entries, not every job in
  -- flight.
  local held = true
  if lapsed ~= '' then
    held = call('ZSCORE', lease, id)
  end
  if not held or (lapsed ~= '' and tonumber(held) > tonumber(lapsed)) then
    -- (A recovery names the lease it saw run out: a task taken again
    -- since, under a new lease, is not the recovery's to end.)
    missed[#missed + 1] = n
  elseif call('LREM', active, '-1', id) == 0 then
    -- Leased but not active: nothing can end it. A recovery drops the
    -- stray lease, which would otherwise be listed as lapsed for ever.
    if lapsed ~= '' then
      call('ZREM', lease, id)
    end
    missed[#missed + 1] = n
  elseif call('ZREM', lease, id) == 0 then
    call('LPUSH', active, id)
    missed[#missed + 1] = n
  else
    -- (Counted as tally's list says: active, succeeded, retry,
    -- deferred, dead.)
    local moved = tally(moves, lane)
    moved[1] = moved[1] - 1
    if outcome == 0 then
      processed = processed + 1
      if partition ~= '' then left[partition] = (left[partition] or 0) + 1 end
      if unique ~= '' then
        local lock = KEYS[tonumber(unique)]
        if call('GET', lock) == id then
          call('DEL', lock)
        end
      end
      if score == '' then
        -- Not kept at all: an idempotency key's task is remembered.
        local rem = settings().rem
        if rem and string.find(id, rem.pattern) then
          remember(rem.key, id, 's', rem.window, rem.span)
        end
        call('DEL', task)
      else
        kept[#kept + 1] = score
        kept[#kept + 1] = id
        if cb == nil then cb = call('HGET', task, 'cb') end
        if cb then
          set_task(task, result, 'msg', msg, 'state', 'completed', 'cbs', 'pending', 'cba', '0')
          callback_started(task, id, due_key or cb)
        else
          set_task(task, result, 'msg', msg, 'state', 'completed')
        end
        moved[2] = moved[2] + 1
      end
      final[#final + 1] = id
    elseif outcome ~= 3 then
      call('ZADD', retry, score, id)
      retried = true
      if outcome == 2 then
        set_task(task, result, 'msg', msg, 'state', 'retry')
        call('HDEL', task, 'sd')
        moved[3] = moved[3] + 1
        processed = processed + 1
        failed = failed + 1
      else
        -- Handed back: shaper's sd mark (what it waits for) tells it from
        -- a failure, in the retry set and after (see flow.lua's
        -- waited_as); it goes when an attempt fails, the task dies or is
        -- retried (a cancel keeps it: see revive.lua).
        set_task(task, result, 'msg', msg, 'state', 'retry', 'sd', waits)
        moved[4] = moved[4] + 1
      end
    else
      call('ZADD', archived, now, id)
      archiving = true
      if cb == nil then cb = call('HGET', task, 'cb') end
      if cb then
        set_task(task, result, 'msg', msg, 'state', 'archived', 'cbs', 'pending', 'cba', '0')
        callback_started(task, id, due_key or cb)
      else
        set_task(task, result, 'msg', msg, 'state', 'archived')
      end
      call('HDEL', task, 'sd')
      moved[5] = moved[5] + 1
      if partition ~= '' then left[partition] = (left[partition] or 0) + 1 end
      processed = processed + 1
      failed = failed + 1
      final[#final + 1] = id
    end
  end
end
if #kept > 0 then
  call('ZADD', completed, unpack(kept))
end
for p, c in pairs(left) do
  local by = '-1'
  if c > 1 then by = string.format('%d', -c) end
  if tonumber(call('ZINCRBY', pbacklog, by, p)) <= 0 then
    call('ZREM', pbacklog, p)
  end
end

-- Bounded by count as well as age: the oldest go, a bounded few per call
-- (this call's items and a margin), so an excess (a lowered bound) goes
-- over the next calls without holding Redis for long in any one. A set
-- this call added nothing to is left to the retention sweep, which holds
-- it to its bound too; one within its bound costs a ZCARD.
local trim
local function over(set, state, most)
  most = tonumber(most)
  if most > 0 then
    local excess = call('ZCARD', set) - most
    if excess > 0 then
      if not trim then
        local _
        _, _, trim = sweeper(settings())
      end
      trim(set, state, excess, n + settings().margin)
    end
  end
end
if #kept > 0 then
  over(completed, 2, kept_most)
end
if archiving then
  over(archived, 5, dead_most)
end
settle(counts, moves)

-- asynq's stats: processed and failed, of the day (from its first
-- count, for as long as asynq keeps them) and in all.
local function bump(day, total, by)
  local arg = by
  if by == 1 then arg = '1' end
  if call('INCRBY', day, arg) == by then
    call('EXPIREAT', day, settings().expire)
  end
  call('INCRBY', total, arg)
end
if processed > 0 then
  bump(KEYS[4], KEYS[5], processed)
end
if failed > 0 then
  bump(failed_day, failed_total, failed)
end
-- A retry's time is known to this caller only: workers that sleep learn
-- of it from a wake-up (see WakeOnRetry).
if retried and WAKE and call('HDEL', sleep_key, 'sleep') == 1 then
  call('PUBLISH', wake_channel, wake_message)
end
-- Jobs made final (succeeded, dead) are announced, every id of the call in
-- one message, one per line: long polls wake on it (see Finals), at one
-- command per call whoever waits.
if FINAL and #final > 0 then
  if #final == 1 then
    call('PUBLISH', final_channel, final[1])
  else
    call('PUBLISH', final_channel, table.concat(final, '\n'))
  end
end
return missed
