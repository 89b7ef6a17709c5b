-- call_turn.lua books a proxied call's send slot in its turn of fair share
-- between fairness keys: the same share the take gives jobs (take.lua), so
-- a tenant's calls and jobs together get its share of the upstream while
-- the other tenants wait, with jobs or with calls.
--
-- A call's key (the fairness key a job of its tenant and partition would
-- have) has a virtual time: its start in f while it has jobs waiting (then
-- its jobs and calls share it), else its place in cq while its calls wait,
-- else the least-served key's that waits (idling earns no credit), and
-- never more than two of its sends ahead of that one.
-- A key with calls waiting is marked in cw (until when) and cq (its
-- virtual time), so that other keys' calls yield to it as to one with
-- jobs. A call books only when its key is not ahead of the least-served
-- other waiting key by more than one of its own sends (1/weight), or when
-- the upstream has a slot free now that nobody took (work-conserving);
-- each booking moves its key on by 1/weight, as the take does for a job,
-- and, when the key has jobs waiting, its lane within the key by 1/lane
-- weight (the lane's start in l:FK, or the calls' own lane time in cv,
-- field FK|LANE). A call is not held back by its own key's jobs: the take
-- yields to it when its lane is not ahead of the lane it would serve
-- (calls.lua); cl:FK marks the lanes of a key's waiting calls. A call books only a slot within the lookahead (the
-- take's horizon and a margin, so that a call in its turn finds a slot
-- the take has not booked): it never books far ahead, so a change of
-- limits drains it as it drains jobs.
-- A call whose partition is tighter than the upstream waits for its
-- partition, not for the upstream: it marks the partition with its key
-- and virtual time (a call mark, partmarks.lua), and not its key, so that
-- the take leaves the partition's next slot to it while the job's key is
-- ahead of the call's (take.lua), and holds no other partition's jobs
-- back; a call of a key ahead of another key waiting for that partition
-- (a call's mark, or a job mark, which the take leaves for the keys
-- whose jobs wait beside the calls) leaves the slot to it. After it
-- books, a call whose partition will hold its key's next call so marks
-- the partition, not the key. A key with neither jobs nor a mark starts
-- level with the least-served key waiting in the rotation, or, with
-- none, with the least of those whose lanes wait on the calendar (kv,
-- take.lua), and keeps within two of its sends of the least-served; its
-- time within a partition likewise against the keys marked there.
-- Since a waiting call has booked nothing, a key's waiting calls stand in
-- a line (ln:FK: call id -> µs it joined; ld: FK|id -> µs its place
-- lapses unless it comes back), so that a call knows the calls of its
-- key ahead of it: a call whose slot, after one send of theirs each, lies
-- beyond its wait is refused at once rather than once it finds out.
--
-- Admission: a call may pay its key's admission first, in the same
-- script call (tokenbucket's AdmitLua): a call admission refuses books
-- nothing, leaves no mark and stands in no line. Each admission bucket is
-- read once per batch, with the upstream bucket's TATs, and written once,
-- at the end; a script call that raises writes none, since none of its
-- calls gets an answer.
--
-- KEYS[1] -> f (fairness keys with jobs -> virtual start)
-- KEYS[2] -> cq (keys with calls waiting -> virtual time)
-- KEYS[3] -> cw (keys with calls waiting -> µs until their mark lapses)
-- KEYS[4] -> cv (FK|LANE -> the calls' virtual time in a lane without jobs)
-- KEYS[5..4+m] -> the admission buckets the batch's calls pay (m of them)
-- KEYS[5+m..] -> the upstream bucket's BookingKeys
-- ARGV[1] -> how many calls to book, in order (a replica's concurrent
--   calls share one script call)
-- ARGV[2] -> our prefix P:s:{Q}: (the lanes' zsets l:FK, the lines ln:FK
--   and ld, the calls' lanes cl:FK)
-- ARGV[3] -> lookahead µs: the latest slot to book
-- ARGV[4] -> µs a call's mark outlives this attempt
-- ARGV[5] -> w; ARGV[6..5+2w] -> w × (fairness key, weight) (others weigh 1)
-- then m; when m > 0, admission's now override ("" = Redis TIME), its
--   buckets' interval µs and capacity
-- then s, the count of the bucket's BookingArgs, and them
-- then for each call in turn, A below (its length follows from its
--   counts):
-- A[1] -> now override in µs ("" = Redis TIME)
-- A[2] -> the call's remaining wait µs
-- A[3] -> lease id ("" = none)
-- A[4] -> the call's fairness key
-- A[5] -> the call's lane
-- A[6] -> the lane's weight
-- A[7] -> the call's id (its place in its key's line)
-- A[8] -> the index among KEYS[5..4+m] of the admission bucket the call
--   pays (0: none); when not 0, A[9] -> the tokens it pays
-- then the partition's limits as PartitionArgs, the partition, c, c ×
--   (cost name, amount)
--
-- The bucket (its dynamic limits, block, TATs) and the partitions' TATs
-- are read once per batch and kept as the calls book, each call deciding
-- on the state the calls before it left; what changed is written once,
-- at the end (or before a call on another clock reads it again: then on
-- that clock).
--
-- Returns one reply per call, in order: {ok, wait, reason, refused, now, prev_1, next_1, ..., prev_n,
-- next_n, then prev and next of each partition limit (none when an
-- operator's override replaced them)}: booked (ok 1), wait is the µs from
-- now to the slot; not booked (ok 0), the call comes back in wait µs (reason 1 a
-- limit, 2 a block, 3 concurrency, 4 its partition, 5 stale limits, 6 its turn), or when
-- refused is 1 its slot (as estimated) lies beyond its wait, and wait is
-- by how much; refused by admission (ok 2), wait is the bucket's level as
-- tb_admit answered it.
local K_F, K_CQ, K_CW, K_CV = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local P, la, stale = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local weights = {}
local nw = tonumber(ARGV[5])
for i = 1, nw do
  weights[ARGV[4 + 2 * i]] = tonumber(ARGV[5 + 2 * i])
end
local function weight(k) return weights[k] or 1 end
local at = 6 + 2 * nw
-- Admission's buckets, KEYS[5..4+M], and where their state is.
local M = tonumber(ARGV[at])
local adm_clock, adm_iv, adm_cap
if M > 0 then
  adm_clock, adm_iv, adm_cap = ARGV[at + 1], tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  at = at + 4
else
  at = at + 1
end
-- The bucket's args start at SA, its keys at KB.
local SA, KB = at + 1, 5 + M
local n = tonumber(ARGV[SA + 4])
at = SA + tonumber(ARGV[at])
-- One reading of Redis's clock for the whole batch.
local clock
local function call_now(override)
  if override ~= '' then return tonumber(override) end
  if not clock then clock = shaper_now('') end
  return clock
end

-- The bucket, open for the batch on one clock (bk_now); leaky's library
-- keeps the partitions' TATs read so far with it. Admission's
-- buckets are read with the bucket's TATs when it first opens
-- (adm_tat[i]: TAT, nil for none), and those that admitted a call
-- written at the end.
local bk, bk_now
local adm_tat, adm_kept
-- Writes what the batch booked on the bucket and the partitions.
local function flush()
  if not bk then return end
  leaky_commit(bk, bk_now)
  bk = nil
end
-- The bucket on the clock now, opened once per batch.
local function bucket(now)
  if bk and bk_now == now then return bk end
  flush()
  if M > 0 and not adm_tat then
    local _, vals
    bk, _, vals = leaky_open(KEYS, KB, ARGV, SA, now, {unpack(KEYS, 5, 4 + M)})
    adm_tat, adm_kept = {}, {}
    for i = 1, M do adm_tat[i] = tonumber(vals[i]) end
  else
    bk = leaky_open(KEYS, KB, ARGV, SA, now)
  end
  bk_now = now
  return bk
end
-- What a call without costs or partition limits reads for them: shared,
-- never written, so that such a call builds no table of its own.
local NONE = {}
local NO_PART = {lim = NONE, tat = NONE, key = NONE}

-- Books the slot (and the partition's, whose TATs are answered unless
-- an operator's override replaced its limits) and returns the reply.
local function book(b, part, over, slot, now, why, costs, lease)
  local out = {1, slot - now, why, 0, now}
  local lim, pl = b.lim, part.lim
  for i = 1, n do
    out[4 + 2 * i], out[5 + 2 * i] = lim[i].tat, 0
  end
  local base = 5 + 2 * n
  if not over then
    for j = 1, #pl do
      out[base + 2 * j - 1], out[base + 2 * j] = part.tat[j], 0
    end
  end
  leaky_book(b, slot, costs, lease)
  leaky_partition_book(part, slot, costs)
  for i = 1, n do out[5 + 2 * i] = lim[i].tat end
  if not over then
    for j = 1, #pl do out[base + 2 * j] = part.tat[j] end
  end
  return out
end

-- Keys a call alone with room found empty (f, cq, and each ln:FK; and,
-- for a call in a limited partition, kv, cpw and jpw: keys whose jobs or
-- calls wait for their partitions), so that the next such call of the
-- batch asks only about the others: a call that takes the full turn
-- (which may write them) forgets them all.
local f_empty, cq_empty, ln_empty, pw_empty = false, false, {}, false
local ask = {}
local function none_exist(k_ln, parted)
  local k = 0
  if not f_empty then k = k + 1; ask[k] = K_F end
  if not cq_empty then k = k + 1; ask[k] = K_CQ end
  if not ln_empty[k_ln] then k = k + 1; ask[k] = k_ln end
  if parted and not pw_empty then
    k = k + 1; ask[k] = P .. 'kv'
    k = k + 1; ask[k] = P .. 'cpw'
    k = k + 1; ask[k] = P .. 'jpw'
  end
  if k > 0 and redis.call('EXISTS', unpack(ask, 1, k)) > 0 then return false end
  f_empty, cq_empty, ln_empty[k_ln] = true, true, true
  if parted then pw_empty = true end
  return true
end

-- Marks of calls whose replica stopped coming back (it died, or the
-- caller left) lapse: keys' (cw, with their place in cq), and the
-- partitions' (partmarks.lua) of calls and of the jobs beside them.
local function lapse(now, parted)
  local gone = redis.call('ZRANGEBYSCORE', K_CW, '-inf', now, 'LIMIT', 0, 64)
  if #gone > 0 then
    redis.call('ZREM', K_CW, unpack(gone))
    redis.call('ZREM', K_CQ, unpack(gone))
  end
  -- (Only a call in a limited partition reads them: the others leave
  -- them be.)
  if parted then
    part_lapse(P, now, false)
    part_lapse(P, now, true)
  end
end

-- The least virtual time of the live marks on partition pk of keys but fk
-- (of calls, and of the jobs beside them), nil if none.
local function part_least(pk, fk, now)
  local least
  for _, jobs in ipairs({false, true}) do
    for _, m in ipairs(part_marks(P, pk, now, jobs)) do
      if m[1] ~= fk and (least == nil or m[2] < least) then least = m[2] end
    end
  end
  return least
end

-- key_time: call key fk's virtual time s (below), having lapsed the
-- marks; and what it read for it: its start in f (infs) and place in cq
-- (live), if any, and the others waiting (the first members of f and cq
-- but fk, key -> virtual time), the least of them, and the least of
-- those with calls. pk: the call's partition where it is limited (else
-- nil): then the keys that wait for it (partition marks) count too.
local function key_time(now, fk, pk)
  lapse(now, pk ~= nil)
  local others = {}
  local least, least_call
  local function read(key, jobs)
    local r = redis.call('ZRANGE', key, 0, 15, 'WITHSCORES')
    for i = 1, #r, 2 do
      local k, sc = r[i], tonumber(r[i + 1])
      if not jobs then
        -- A key with jobs too is where its jobs are.
        local js = redis.call('ZSCORE', K_F, k)
        if js then sc = tonumber(js) end
      end
      if k ~= fk then
        if others[k] == nil or sc < others[k] then others[k] = sc end
        if least == nil or sc < least then least = sc end
        if not jobs and (least_call == nil or sc < least_call) then least_call = sc end
      end
    end
  end
  read(K_F, true)
  read(K_CQ, false)
  local infs = redis.call('ZSCORE', K_F, fk)
  local live = redis.call('ZSCORE', K_CQ, fk)
  -- (Its place in the rotation while its calls wait for their
  -- partition, kept with the partition's mark.)
  local pv = pk and redis.call('ZSCORE', P .. 'cr', pk .. '\n' .. fk)
  local s
  if infs then
    s = tonumber(infs)
  elseif live or pv then
    -- Its calls wait still (for the upstream, or for their partition):
    -- its place holds (the later of the two).
    s = tonumber(live or pv)
    if live and pv and tonumber(pv) > s then s = tonumber(pv) end
  elseif least then
    s = least
  else
    -- Nobody waits in the rotation: level with the least of the keys
    -- whose lanes wait on the calendar for their partitions (kv, whose
    -- virtual times they come back at), else 0.
    local r = redis.call('ZRANGE', P .. 'kv', 0, 0, 'WITHSCORES')
    s = tonumber(r[2] or '0')
  end
  -- A key is never more than two of its sends ahead of the least-served
  -- one: the gate of turn keeps it within one while others wait, so a
  -- lead beyond is service while nobody else waited, or virtual times
  -- that started again (the take's restart at 0 when no key waits): no
  -- penalty.
  local q = 1 / weight(fk)
  if least and s > least + 2 * q then s = least + 2 * q end
  return s, infs, live, others, least, least_call
end

-- The marks' keys live a minute past the lookahead and the marks' lapse,
-- and past the wait they were made for.
local ttl = math.ceil((stale + la) / 1000) + 60000

-- part_time: key fk's virtual time within partition pk (partmarks.lua):
-- its mark's, else the least of the others marked there, else 0; never
-- more than two of its sends ahead of that least; and the least (nil:
-- nobody else is marked there).
local function part_time(pk, fk, q, now)
  local l = part_least(pk, fk, now)
  local v = redis.call('ZSCORE', P .. 'cp:' .. pk, fk)
  v = tonumber(v or l or 0)
  if l and v > l + 2 * q then v = l + 2 * q end
  return v, l
end

-- mark_part: the mark of key fk on partition pk (partmarks.lua) at
-- virtual time pv within it and s in the rotation, until µs, for a call
-- that comes back in wait µs.
local function mark_part(pk, fk, pv, s, until_, wait)
  -- (The next call of the batch alone with room asks again.)
  pw_empty = false
  part_mark(P, false, pk, fk, pv, until_, ttl + math.ceil(wait / 1000), s)
end

-- Where the next call's arguments start, once a turn has read its own.
local next_at

-- Room: a slot within ROOM µs of now, so the upstream is not what holds
-- calls back. At a pace whose spacing is shorter (over 1,000 sends a
-- second) the calls of one batch, on one clock, book one after the other
-- within it; at a slower pace only a slot free now is room.
local ROOM = 1000

-- One call's turn, its arguments (A) at ARGV[at] (the body is not
-- indented, to keep its history readable).
local function turn(at)
local now = call_now(ARGV[at])
local remaining = tonumber(ARGV[at + 1])
local lease, fk, lane = ARGV[at + 2], ARGV[at + 3], ARGV[at + 4]
local lweight = tonumber(ARGV[at + 5])
local id = ARGV[at + 6]
local adm = tonumber(ARGV[at + 7])
local adm_cost
if adm > 0 then
  adm_cost = tonumber(ARGV[at + 8])
  at = at + 9
else
  at = at + 8
end
local plim = NONE
if ARGV[at] == '0' then
  at = at + 1
else
  plim, at = leaky_limits(ARGV, at)
end
local pk = ARGV[at]
local costs = NONE
local nc = tonumber(ARGV[at + 1])
if nc > 0 then
  costs = {}
  for i = 1, nc do
    costs[ARGV[at + 2 * i]] = tonumber(ARGV[at + 1 + 2 * i])
  end
end
next_at = at + 2 + 2 * nc
local b = bucket(now)

-- Admission first: a call it refuses leaves no trace.
if adm > 0 then
  local level, tat = tb_admit(adm_tat[adm], call_now(adm_clock), adm_iv, adm_cap, adm_cost)
  if not tat then return {2, level, 0, 0, now} end
  adm_tat[adm], adm_kept[adm] = tat, true
end

local over = leaky_partition_override(b, pk)
if over then plim = over end
if pk == '' then plim = NONE end

-- The partition's own limits first, as the take does: a call they hold
-- back past the upstream's own next slot for it does not compete for the
-- upstream's slots, so it leaves no key's mark, but its partition's: it
-- waits for the partition's slots, beside the jobs and calls of other
-- keys that wait for them. One they hold back no further
-- than that takes its turn as any call (the take books a partition's
-- jobs up to the upstream's slots ahead: a call that waited for its
-- partition to be free now would never get a turn beside them).
local part = NO_PART
local slot, why = leaky_earliest(b, costs, now)
-- pm: the call's partition, where it is limited (its marks are the
-- partition's, partmarks.lua).
local pm
if #plim > 0 then
  part = leaky_partition(b, pk, plim, now)
  pm = pk
  local pslot = leaky_partition_earliest(part, costs, now)
  if pslot > now and pslot > slot then
    if pslot - now > remaining then return {0, pslot - now - remaining, 4, 1, now} end
    -- It waits for its partition, not for the upstream: it marks the
    -- partition (with its key's virtual time), so that the take leaves
    -- the partition's next slot to it while its key is behind the jobs'
    -- (take.lua), and holds no other partition's jobs back.
    local s = key_time(now, fk, pm)
    mark_part(pk, fk, part_time(pk, fk, 1 / weight(fk), now), s, pslot + stale, pslot - now)
    return {0, pslot - now, 4, 0, now}
  end
end
local K_LN = P .. 'ln:' .. fk

-- Alone with room: no key waits with jobs (f is empty) or with calls (cq
-- is empty: no marks), and no call of this key stands in line (ln:FK is
-- empty; so this one does not). Nobody's turn is at stake, so the call
-- books the slot without the line, the marks or their lapse scans, and
-- its key's virtual time does not move: service while the upstream had
-- room and nobody waited earns no penalty (a key that starts to wait
-- starts at the least-served one's time). A slot further ahead is
-- contention, even with nobody marked yet (callers that each hold a
-- booked slot): that takes the way below, which marks it, so that keys
-- take turns.
if slot - now < ROOM and none_exist(K_LN, pm ~= nil) and
    (lease == '' or not leaky_lease_wait(b, lease, now)) then
  return book(b, part, over, slot, now, why, costs, lease)
end
f_empty, cq_empty, pw_empty = false, false, false
if next(ln_empty) then ln_empty = {} end

-- One send's spacing at the bucket's pace of requests (or of this call's
-- costs, without a request limit).
local spacing = 0
for _, l in ipairs(b.lim) do
  local c = 1
  if l.cost ~= '' then c = costs[l.cost] or 0 end
  if l.interval * c > spacing then spacing = l.interval * c end
end
local K_LD = P .. 'ld'

-- The calls of this key ahead of this one in its line, those that still
-- come back: each takes one send before this call's.
local lapsed = redis.call('ZRANGEBYSCORE', K_LD, '-inf', now, 'LIMIT', 0, 64)
for _, m in ipairs(lapsed) do
  local bar = string.find(m, '|', 1, true)
  redis.call('ZREM', P .. 'ln:' .. string.sub(m, 1, bar - 1), string.sub(m, bar + 1))
end
if #lapsed > 0 then redis.call('ZREM', K_LD, unpack(lapsed)) end
local joined = redis.call('ZSCORE', K_LN, id)
local before
if joined then
  before = redis.call('ZCOUNT', K_LN, '-inf', '(' .. joined)
else
  before = redis.call('ZCARD', K_LN)
end
local function leave()
  if joined then
    redis.call('ZREM', K_LN, id)
    redis.call('ZREM', K_LD, fk .. '|' .. id)
  end
end
local inline = slot - now + before * spacing
if inline > remaining then
  leave()
  return {0, inline - remaining, why, 1, now}
end

local s, infs, live, others, least, least_call = key_time(now, fk, pm)
local q = 1 / weight(fk)
-- reply: the call comes back in wait µs, its key marked as waiting until
-- then and stale µs more.
local K_CL = P .. 'cl:' .. fk
local function marks(until_, pttl)
  redis.call('ZADD', K_CQ, s, fk)
  redis.call('ZADD', K_CW, 'GT', until_, fk)
  redis.call('ZADD', K_CL, 'GT', until_, lane)
  redis.call('PEXPIRE', K_CQ, pttl)
  redis.call('PEXPIRE', K_CW, pttl)
  redis.call('PEXPIRE', K_CL, pttl)
end
local function reply(wait, reason)
  marks(now + wait + stale, ttl + math.ceil(wait / 1000))
  -- Its place in the line holds while it comes back.
  if not joined then redis.call('ZADD', K_LN, now, id) end
  redis.call('ZADD', K_LD, now + wait + stale, fk .. '|' .. id)
  local pttl = ttl + math.ceil(wait / 1000)
  redis.call('PEXPIRE', K_LN, pttl)
  redis.call('PEXPIRE', K_LD, pttl)
  return {0, wait, reason, 0, now}
end

-- Ahead of a key whose calls wait for this call's partition: the
-- partition's slot is that call's (it comes back for it now), and this
-- one waits for the partition's next, as a call its partition holds.
local pv, pleast
if pm then pv, pleast = part_time(pk, fk, q, now) end
if pleast and pleast < pv - q - 1e-9 then
  local wait = ROOM
  for j, l in ipairs(plim) do
    local c = 1
    if l.cost ~= '' then c = costs[l.cost] or 0 end
    if l.interval * c > wait then wait = l.interval * c end
  end
  if slot - now + wait > remaining then
    leave()
    return {0, slot - now + wait - remaining, 4, 1, now}
  end
  mark_part(pk, fk, pv, s, now + wait + stale, wait)
  return {0, wait, 4, 0, now}
end

-- Ahead of a key whose calls wait, or (unless the upstream has a slot
-- free now that no job took) of one whose jobs wait.
local ahead = (least_call and s > least_call + q + 1e-9) or (least and s > least + q + 1e-9 and slot > now)
if ahead then
  -- Not this key's turn: the others' sends until it is, at the bucket's
  -- pace of requests (or of this call's costs, without a request limit).
  local sends = before
  for k, sc in pairs(others) do
    if sc < s - q then sends = sends + (s - q - sc) * weight(k) end
  end
  local est = slot - now + math.ceil(sends * spacing)
  if est > remaining then
    leave()
    return {0, est - remaining, 6, 1, now}
  end
  return reply(math.min(math.max(math.ceil(sends * spacing / 2), 2000), 50000), 6)
end
if slot - now > la then
  return reply(slot - now - la, why)
end
if lease ~= '' then
  local lw = leaky_lease_wait(b, lease, now)
  if lw then return reply(math.min(lw, 10000), 3) end
end
leave()
local out = book(b, part, over, slot, now, why, costs, lease)

-- The key's turn is spent, as a job's would be.
local ns = s + q
if infs then
  redis.call('ZADD', K_F, 'XX', ns, fk)
  -- And its lane within the key: the lane's own start while the key has
  -- jobs of that lane, else the calls' lane time (cv, FK|LANE), never
  -- behind the key's lane virtual time.
  local lk = P .. 'l:' .. fk
  local ls = redis.call('ZSCORE', lk, lane)
  if ls then
    redis.call('ZADD', lk, 'XX', tonumber(ls) + 1 / lweight, lane)
  else
    -- (The lanes' virtual time is their lowest start; the calls' lane is
    -- held within two of its sends of it, as keys are above.)
    local lm = redis.call('ZRANGE', lk, 0, 0, 'WITHSCORES')
    local lv = tonumber(lm[2] or '0')
    local lt = tonumber(redis.call('HGET', K_CV, fk .. '|' .. lane) or '0')
    lt = math.min(math.max(lt, lv), lv + 2 / lweight)
    redis.call('HSET', K_CV, fk .. '|' .. lane, lt + 1 / lweight)
  end
end
-- Its mark stays until the slot and a moment after: a key whose callers
-- call again once answered waits still, and the take keeps yielding to
-- it while it is behind. Unless the slot was room, nobody else waits,
-- with jobs or calls, and none of its own calls stands in line: then its
-- mark goes, so that its next call is alone with room (above) again.
s = ns
local alone = slot - now < ROOM and not infs and next(others) == nil and redis.call('EXISTS', K_LN) == 0
if alone then
  redis.call('ZREM', K_CQ, fk)
  redis.call('ZREM', K_CW, fk)
elseif infs then
  redis.call('PEXPIRE', K_CV, 600000)
end
local pnext = pm and leaky_partition_earliest(part, costs, now)
if pm and pnext > math.max(now, leaky_earliest(b, costs, now)) then
  -- Its partition, now booked, holds the key's next call past the
  -- upstream's own next slot: that call will wait for the partition,
  -- so the mark is the partition's (a key's mark would hold every
  -- partition's jobs back while it is behind), with the key's virtual
  -- time, which keys whose jobs or calls wait for the partition compare
  -- theirs with. Its place in cq, if it has one still, moves with it.
  mark_part(pk, fk, pv + q, s, pnext + stale, pnext - now)
  if live and not alone then redis.call('ZADD', K_CQ, 'XX', s, fk) end
  return out
end
if alone then return out end
marks(slot + stale, ttl)
return out
end

local replies = {}
for i = 1, tonumber(ARGV[1]) do
  -- A call that raises (a Redis error) ends the script with no reply for
  -- anyone, so nothing is sent; what the calls before it booked (their
  -- leases are written as they book) is written with its TTLs first, and
  -- no admission they paid.
  local ok, r = pcall(turn, at)
  if not ok then
    flush()
    error(r)
  end
  replies[i] = r
  at = next_at
end
flush()
if adm_kept then
  local adm_now = call_now(adm_clock)
  for i in pairs(adm_kept) do tb_keep(KEYS[4 + i], adm_tat[i], adm_now, adm_iv) end
end
return replies
