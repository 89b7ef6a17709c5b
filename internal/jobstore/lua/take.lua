-- take.lua takes up to N ready jobs whose send slots fall within the
-- lookahead, booking each slot in the upstream's limits and the job's
-- partition's limits at once, and moves each job to asynq's active state.
-- Before that it moves due scheduled and retrying jobs into their flows and
-- brings calendar entries that came due back into the rotation
-- (forward.lua).
--
-- Which job goes next: the fairness key with the lowest virtual start
-- (start-time fair queuing, each send advancing it by 1/weight), within it
-- the lane with the lowest virtual start (by lane weight), within that the
-- partition that can send earliest, within that the oldest job. The
-- upstream's own slots are booked up to the lookahead ahead; a partition's
-- job is taken only once its partition can send now, so a partition never
-- holds the upstream idle. A lane whose every partition must wait goes on
-- the calendar until its earliest one can send.
--
-- KEYS[1] -> v
-- KEYS[2] -> f
-- KEYS[3] -> cal
-- KEYS[4] -> counts
-- KEYS[5] -> asynq scheduled
-- KEYS[6] -> asynq retry
-- KEYS[7] -> asynq active
-- KEYS[8] -> asynq lease
-- KEYS[9] -> asynq groups set
-- KEYS[10] -> asynq's paused key
-- KEYS[11..] -> the upstream bucket's keys (leaky.Bucket.BookingKeys)
-- ARGV[1] -> now override
-- ARGV[2] -> max jobs
-- ARGV[3] -> lookahead µs
-- ARGV[4] -> asynq lease seconds
-- ARGV[5] -> our prefix
-- ARGV[6] -> asynq group prefix
-- ARGV[7] -> asynq task prefix
-- ARGV[8] -> wait µs to answer while the queue is paused through asynq
-- ARGV[9..] -> the bucket's (leaky.Bucket.BookingArgs), then the partition
--    limits (leaky.Bucket.PartitionArgs), then o, o × (partition, its
--    limits as PartitionArgs): overrides; then w, w × (fairness key,
--    weight); then x, x × (lane, weight)
--
-- A queue paused through asynq (Inspector.PauseQueue) gives no job: the
-- take answers a block (reason 2) with a wait of ARGV[8], since asynq's
-- unpause announces nothing.
--
-- Returns {now, wait, reason, next, expired, id_1, msg_1, slot_1, ...}:
-- wait (µs, -1 none) is how long until the upstream itself can send again
-- when it stopped the take (reason 1 a limit, 2 a block or asynq's pause,
-- 3 concurrency);
-- next (µs from now, -1 none) is when something else comes due (a
-- scheduled job, a parked lane, a lease), 0 when the take stopped at its
-- bound on parks or steps before examining every flow; expired is 1 when
-- some active job's lease has run out; slot_i is the µs from now until
-- job i's slot.
--
-- Needs gcra's library, leaky's booking library (leaky.BookingLua), flow.lua
-- and forward.lua before it (see lua.go).
local P, G, T = ARGV[5], ARGV[6], ARGV[7]
local K_V, K_F, K_CAL, K_GROUPS = KEYS[1], KEYS[2], KEYS[3], KEYS[9]
local sp = space(P, G, T, K_V, K_F, K_CAL, K_GROUPS)
local K_PK = P .. 'pk'

local now = shaper_now(ARGV[1])
local max_jobs = tonumber(ARGV[2])
local la = tonumber(ARGV[3])
local horizon = now + la
local lease_s = tonumber(ARGV[4])
local now_s = now / 1000000

-- The upstream's bucket, its limits as paced now (leaky's library).
local bucket, a = leaky_open(KEYS, 11, ARGV, 9, now)
local plimits
plimits, a = leaky_limits(ARGV, a)
local overrides = {}
local no = tonumber(ARGV[a])
a = a + 1
for i = 1, no do
  local p = ARGV[a]
  overrides[p], a = leaky_limits(ARGV, a + 1)
end
local weights = {}
local nw = tonumber(ARGV[a])
for i = 1, nw do
  weights[ARGV[a + 2 * i - 1]] = tonumber(ARGV[a + 2 * i])
end
a = a + 1 + 2 * nw
local lweights = {}
local nl = tonumber(ARGV[a])
for i = 1, nl do
  lweights[ARGV[a + 2 * i - 1]] = tonumber(ARGV[a + 2 * i])
end

local function costs_of(s)
  local t = {}
  if s then
    for k, v in string.gmatch(s, '([^=,]+)=(%d+)') do
      t[k] = tonumber(v)
    end
  end
  return t
end

forward_due(sp, KEYS[5], KEYS[6], KEYS[4], now)

local out = {now, -1, 0, -1, 0}
local taken, parks, steps = 0, 0, 0
local stop = false
-- more: the take stopped at its park or step bound with the ready
-- structure not all examined; the caller must come back at once.
local more = false
if redis.call('EXISTS', KEYS[10]) == 1 then
  -- Paused through asynq: nothing goes, leases are still recovered.
  stop = true
  out[2], out[3] = tonumber(ARGV[8]), 2
end
-- What the take changed, written once after the loop.
local went, went_lane, lane_time, v1 = {}, {}, {}, nil
-- pend: new scores of sole members of a sorted set, written after the loop.
local pends = {}
local function pend(key, member, score)
  if not pends[key] then pends[key] = {} end
  pends[key][member] = score
end
local function pending(key, member)
  return pends[key] and pends[key][member]
end
local function unpend(key, member)
  if pends[key] then pends[key][member] = nil end
end
while not stop and taken < max_jobs and steps < 2000 do
  steps = steps + 1
  repeat
    -- Each lookup reads the first two members: a sole member's new score
    -- need not be written until the end of the take, since nothing joins
    -- these sets during the loop (pend).
    local top = redis.call('ZRANGE', K_F, 0, 1, 'WITHSCORES')
    if #top == 0 then stop = true break end
    local fk = top[1]
    local s1 = pending(K_F, fk) or tonumber(top[2])
    local f_sole = #top == 2
    local lk = P .. 'l:' .. fk
    local lt = redis.call('ZRANGE', lk, 0, 1, 'WITHSCORES')
    if #lt == 0 then
      redis.call('ZREM', K_F, fk)
      redis.call('HDEL', K_V, 'v:' .. fk)
      lane_time[fk] = nil
      unpend(K_F, fk)
      break
    end
    local lane = lt[1]
    local s2 = pending(lk, lane) or tonumber(lt[2])
    local l_sole = #lt == 2
    local rk = P .. 'r:' .. lane .. '|' .. fk
    local fl = redis.call('ZRANGE', rk, 0, 1, 'WITHSCORES')
    local r_sole = #fl == 2
    local function retire_lane()
      redis.call('ZREM', lk, lane)
      unpend(lk, lane)
      if redis.call('ZCARD', lk) == 0 then
        redis.call('ZREM', K_F, fk)
        redis.call('HDEL', K_V, 'v:' .. fk)
        lane_time[fk] = nil
        unpend(K_F, fk)
      end
    end
    if #fl == 0 then
      retire_lane()
      break
    end
    local pk = fl[1]
    local elig = pending(rk, pk) or tonumber(fl[2])
    if elig > now then
      -- Every partition of this lane is parked: calendar it.
      retire_lane()
      redis.call('ZADD', K_CAL, elig, lane .. '|' .. fk)
      break
    end
    local g = lane .. '|' .. fk .. '|' .. pk
    -- The job and the one after it, which the flow's next chance needs.
    local head = redis.call('ZRANGE', G .. g, 0, 1)
    if #head == 0 then
      redis.call('ZREM', rk, pk)
      redis.call('SREM', K_GROUPS, g)
      redis.call('ZREM', K_PK, g)
      break
    end
    local id = head[1]
    local tk = T .. id
    -- Where nothing but the upstream can hold the job back (no partition
    -- limits), it is all but certainly taken: read its message now too.
    local limited = pk ~= '' and (overrides[pk] ~= nil or #plimits > 0)
    local f, msg
    if limited then
      f = {redis.call('HGET', tk, 'sc')}
    else
      f = redis.call('HMGET', tk, 'sc', 'msg')
      msg = f[2]
    end
    local costs = costs_of(f[1])
    -- The upstream's own slot for this job.
    local su, why = leaky_earliest(bucket, costs, now)
    if su > horizon then
      out[2], out[3] = su - horizon, why
      stop = true
      break
    end
    -- The partition's slot.
    local pl = plimits
    if overrides[pk] then pl = overrides[pk] end
    -- An operator's override of the partition (leaky's library) wins.
    pl = leaky_partition_override(bucket, pk) or pl
    if pk == '' then pl = {} end
    local part = leaky_partition(bucket, pk, pl, now)
    local pslot = leaky_partition_earliest(part, costs, now)
    if pslot > now then
      -- Not this partition's turn yet. It is taken when its slot comes,
      -- not booked ahead: booking the upstream at a partition's later
      -- slot would leave the upstream idle until then.
      unpend(rk, pk)
      redis.call('ZADD', rk, pslot, pk)
      redis.call('ZADD', K_PK, pslot, g)
      parks = parks + 1
      if parks >= 200 then stop, more = true, true end
      break
    end
    local lw = leaky_lease_wait(bucket, id, now)
    if lw then
      out[2], out[3] = lw, 3
      stop = true
      break
    end
    local slot = math.max(su, pslot)
    leaky_book(bucket, slot, costs, id)
    leaky_partition_book(part, slot, costs, now)
    -- The job leaves its flow for asynq's active list.
    redis.call('ZREM', G .. g, id)
    local nxt = {head[2]}
    if #head < 2 then
      redis.call('SREM', K_GROUPS, g)
      redis.call('ZREM', rk, pk)
      redis.call('ZREM', K_PK, g)
      unpend(rk, pk)
    else
      -- The partition can go again when its limits allow its next job's
      -- costs (a job without a limit's cost is not held by it).
      local e = now
      if #pl > 0 then
        e = leaky_partition_earliest(part, costs_of(redis.call('HGET', T .. nxt[1], 'sc')), now)
      end
      if r_sole and e <= now then
        pend(rk, pk, e)
      else
        unpend(rk, pk)
        redis.call('ZADD', rk, e, pk)
      end
      if e > now then
        redis.call('ZADD', K_PK, e, g)
      end
    end
    -- To asynq's active state; the list, the leases and the counters are
    -- written once for the whole take, below.
    redis.call('HSET', tk, 'state', 'active')
    redis.call('HDEL', tk, 'group')
    went[#went + 1] = id
    went_lane[lane] = (went_lane[lane] or 0) + 1
    -- Fair share: the key and the lane each move on by 1/weight; the
    -- virtual times are written once, below.
    v1 = s1
    if f_sole then
      pend(K_F, fk, s1 + 1 / (weights[fk] or 1))
    else
      redis.call('ZADD', K_F, s1 + 1 / (weights[fk] or 1), fk)
    end
    lane_time[fk] = s2
    if l_sole then
      pend(lk, lane, s2 + 1 / (lweights[lane] or 1))
    else
      redis.call('ZADD', lk, s2 + 1 / (lweights[lane] or 1), lane)
    end
    out[#out + 1] = id
    out[#out + 1] = msg or redis.call('HGET', tk, 'msg')
    out[#out + 1] = slot - now
    taken = taken + 1
  until true
end
if not stop and taken < max_jobs and steps >= 2000 then more = true end
for key, members in pairs(pends) do
  for member, score in pairs(members) do
    redis.call('ZADD', key, 'XX', score, member)
  end
end
if #went > 0 then
  redis.call('LPUSH', KEYS[7], unpack(went))
  local lease_at = math.floor(now_s) + lease_s
  local z = {}
  for _, id in ipairs(went) do
    z[#z + 1] = lease_at
    z[#z + 1] = id
  end
  redis.call('ZADD', KEYS[8], unpack(z))
  for lane, n in pairs(went_lane) do
    count(KEYS[4], 'pending:' .. lane, -n)
    count(KEYS[4], 'active:' .. lane, n)
  end
  local hv = {'v', v1}
  for fk, t in pairs(lane_time) do
    hv[#hv + 1] = 'v:' .. fk
    hv[#hv + 1] = t
  end
  redis.call('HSET', K_V, unpack(hv))
end

leaky_commit(bucket, now)

-- When does something else come due?
local next = -1
local function sooner(t)
  if t and (next < 0 or t < next) then next = t end
end
for z = 5, 6 do
  local first = redis.call('ZRANGE', KEYS[z], 0, 0, 'WITHSCORES')
  if #first > 0 then sooner(math.max(0, math.floor(tonumber(first[2]) * 1000000) - now)) end
end
local cal = redis.call('ZRANGE', K_CAL, 0, 0, 'WITHSCORES')
if #cal > 0 then sooner(math.max(0, tonumber(cal[2]) - now)) end
local lease = redis.call('ZRANGE', KEYS[8], 0, 0, 'WITHSCORES')
if #lease > 0 then
  local exp = tonumber(lease[2]) * 1000000
  if exp <= now then out[5] = 1 else sooner(exp - now) end
end
if more then sooner(0) end
out[4] = next
if taken == 0 and out[2] < 0 and not more then
  -- Nothing can go now: the next enqueue wakes the workers.
  redis.call('HSET', K_V, 'sleep', 1)
end
return out
