package jobstore

import (
	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
	"github.com/shaperhq/shaper/leaky"
)

// The ready structure of one upstream. Every key shares the hash tag of the
// upstream's asynq queue, {shaper.NAME}, so each script below touches one
// Redis Cluster slot. Keys the scripts build at run time (a lane's zset, a
// flow's group, a partition's TAT) are made from prefixes passed in ARGV
// and carry the same tag.
//
//	P:s:{Q}:v          hash: v (the upstream's virtual time), v:FK (FK's lane
//	                   virtual time), seq (FIFO counter), sleep (a worker sleeps)
//	P:s:{Q}:f          zset: fairness key FK -> virtual start, FKs with work
//	P:s:{Q}:l:FK       zset: lane -> virtual start within FK, lanes with work
//	P:s:{Q}:r:LANE|FK  zset: partition PK -> µs when it can next send
//	P:s:{Q}:cal        zset: LANE|FK -> µs when its earliest partition can send,
//	                   for lanes whose every partition is parked
//	P:s:{Q}:c          hash: STATE:LANE -> jobs (pending scheduled retry
//	                   deferred active dead succeeded); retry counts jobs
//	                   waiting after a failed attempt, deferred those handed
//	                   back to wait (a 429) without spending one
//	P:s:{Q}:pb         zset: PK -> jobs not yet finished
//	P:s:{Q}:pk         zset: LANE|FK|PK -> µs until which the flow's partition
//	                   is parked for its limits (members whose time passed
//	                   are stale: status counts only later ones)
//	asynq:{Q}:g:LANE|FK|PK  a flow: asynq's group zset, job id -> FIFO seq
//	P:leaky:{Q}:p:PK:LIMIT  a partition's TAT per partition limit
//
// A job waiting in a flow is, to asynq's Inspector, an aggregating task of
// group LANE|FK|PK; the task hash also carries shaper's fields sl (lane), sf
// (fairness key), sp (partition), sc (costs "name=n,..."), sq (FIFO seq),
// and sd ("1" while it waits in asynq's retry set handed back, not failed;
// see Finish).

// flowLua is shared by the scripts that put jobs into flows. It expects
// locals: P (our prefix "P:s:{Q}:"), G (asynq's group prefix), T (asynq's
// task prefix), K_V, K_F, K_CAL, K_GROUPS (key names).
// optionalLua writes a new task's partition (sp) and costs (sc) only when
// they are not empty: in a task hash each field costs about 100 bytes of
// Redis memory, and most jobs have neither (issue 12). Every reader takes
// a missing field as empty.
const optionalLua = `
local function set_optional(task, pk, costs)
  if pk ~= '' then redis.call('HSET', task, 'sp', pk) end
  if costs ~= '' then redis.call('HSET', task, 'sc', costs) end
end
`

const flowLua = `
local function activate_lane(fk, lane)
  local lk = P .. 'l:' .. fk
  if redis.call('ZSCORE', lk, lane) == false then
    local v2 = tonumber(redis.call('HGET', K_V, 'v:' .. fk) or '0')
    redis.call('ZADD', lk, v2, lane)
    redis.call('ZREM', K_CAL, lane .. '|' .. fk)
  end
  if redis.call('ZSCORE', K_F, fk) == false then
    local v1 = tonumber(redis.call('HGET', K_V, 'v') or '0')
    redis.call('ZADD', K_F, v1, fk)
  end
end

local function push(id, lane, fk, pk, seq, t)
  local g = lane .. '|' .. fk .. '|' .. pk
  redis.call('ZADD', G .. g, seq, id)
  redis.call('SADD', K_GROUPS, g)
  redis.call('HSET', T .. id, 'state', 'aggregating', 'group', g)
  redis.call('ZADD', P .. 'r:' .. lane .. '|' .. fk, 'NX', t, pk)
  activate_lane(fk, lane)
end

local function count(k, field, by)
  local n = redis.call('HINCRBY', k, field, by)
  if n <= 0 then redis.call('HDEL', k, field) end
end

-- The counter a job leaving asynq's retry set was counted in: deferred
-- (handed back, sd = "1") or retry (after a failed attempt). The mark goes
-- with it.
local function waited_as(tk, sd)
  if sd == '1' then
    redis.call('HDEL', tk, 'sd')
    return 'deferred:'
  end
  return 'retry:'
end
`

// enqueueScript stores a job and makes it ready, or schedules it.
//
//	KEYS[1] task hash  KEYS[2] v  KEYS[3] f  KEYS[4] cal  KEYS[5] counts
//	KEYS[6] pbacklog   KEYS[7] asynq scheduled  KEYS[8] asynq groups set
//	ARGV[1] now override  ARGV[2] encoded asynq message  ARGV[3] lane
//	ARGV[4] fairness key  ARGV[5] partition  ARGV[6] costs
//	ARGV[7] process at, Unix seconds ("" = now)  ARGV[8] our prefix
//	ARGV[9] asynq group prefix  ARGV[10] asynq task prefix
//	ARGV[11] wake channel  ARGV[12] upstream name
//	ARGV[13] for an idempotency key's job, the upstream's records of
//	dropped ones (Remembered.Key; its buckets are built from it,
//	in the same slot); "" = none
//	KEYS[9] leaky block hash, KEYS[10] asynq paused key: optional, to learn
//	whether a job stored ready is held back
//
// Returns 0 if a job with this id exists (nothing changed), 1 if stored
// ready, 2 if stored scheduled, 3 if stored ready but held back (with
// KEYS[9..10]: the upstream is blocked or paused through asynq, or the
// job's partition is parked); 4, 5 or 6 if the job with this id finished
// and was dropped, and a record of it is still kept (nothing changed):
// it succeeded, died or was cancelled.
var enqueueScript = script.New(RememberLua + optionalLua + `
local P, G, T = ARGV[8], ARGV[9], ARGV[10]
local K_V, K_F, K_CAL, K_GROUPS = KEYS[2], KEYS[3], KEYS[4], KEYS[8]
` + flowLua + `
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if ARGV[13] and ARGV[13] ~= '' then
  -- An idempotency key outlives its job: the check is here, with the
  -- store, so two repeats at once cannot both miss it.
  local final = recall(ARGV[13], string.sub(KEYS[1], #T + 1))
  if final then
    return ({s = 4, d = 5, c = 6})[final] or 5
  end
end
local now = shaper_now(ARGV[1])
local lane, fk, pk = ARGV[3], ARGV[4], ARGV[5]
local id = string.sub(KEYS[1], #T + 1)
local seq = redis.call('HINCRBY', K_V, 'seq', 1)
redis.call('HSET', KEYS[1], 'msg', ARGV[2], 'sl', lane, 'sf', fk, 'sq', seq)
set_optional(KEYS[1], pk, ARGV[6])
if pk ~= '' then
  redis.call('ZINCRBY', KEYS[6], 1, pk)
end
local out = 1
if ARGV[7] ~= '' and tonumber(ARGV[7]) * 1000000 > now then
  redis.call('HSET', KEYS[1], 'state', 'scheduled')
  redis.call('ZADD', KEYS[7], ARGV[7], id)
  count(KEYS[5], 'scheduled:' .. lane, 1)
  out = 2
else
  push(id, lane, fk, pk, seq, now)
  count(KEYS[5], 'pending:' .. lane, 1)
  if KEYS[10] then
    local parked = redis.call('ZSCORE', P .. 'r:' .. lane .. '|' .. fk, pk)
    if tonumber(redis.call('HGET', KEYS[9], 'until') or '0') > now or redis.call('EXISTS', KEYS[10]) == 1
        or (parked and tonumber(parked) > now) then
      out = 3
    end
  end
end
if redis.call('HDEL', K_V, 'sleep') == 1 then
  redis.call('PUBLISH', ARGV[11], ARGV[12])
end
return out
`)

// takeScript takes up to N ready jobs whose send slots fall within the
// lookahead, booking each slot in the upstream's limits and the job's
// partition's limits at once, and moves each job to asynq's active state.
// Before that it moves due scheduled and retrying jobs into their flows and
// brings calendar entries that came due back into the rotation.
//
// Which job goes next: the fairness key with the lowest virtual start
// (start-time fair queuing, each send advancing it by 1/weight), within it
// the lane with the lowest virtual start (by lane weight), within that the
// partition that can send earliest, within that the oldest job. The
// upstream's own slots are booked up to the lookahead ahead; a partition's
// job is taken only once its partition can send now, so a partition never
// holds the upstream idle. A lane whose every partition must wait goes on
// the calendar until its earliest one can send.
//
//	KEYS[1] v  KEYS[2] f  KEYS[3] cal  KEYS[4] counts  KEYS[5] asynq scheduled
//	KEYS[6] asynq retry  KEYS[7] asynq active  KEYS[8] asynq lease
//	KEYS[9] asynq groups set  KEYS[10] leaky block hash
//	KEYS[11] leaky concurrency leases  KEYS[12] asynq's paused key
//	KEYS[13..12+n] one TAT per upstream limit
//	KEYS[13+n] the bucket's dyn hash, then the stated limits' TATs (leaky.Layout)
//	ARGV[1] now override  ARGV[2] max jobs  ARGV[3] lookahead µs
//	ARGV[4] asynq lease seconds  ARGV[5] concurrency (0 none)
//	ARGV[6] concurrency lease µs after the slot  ARGV[7] our prefix
//	ARGV[8] asynq group prefix  ARGV[9] asynq task prefix
//	ARGV[10] partition TAT prefix ("P:leaky:{Q}:p:")
//	ARGV[11] wait µs to answer while the queue is paused through asynq
//	ARGV[12] n, then n × (interval, capacity, per µs, cost name, dyn field) for the upstream
//	then m, m × (id, interval, capacity, per µs, cost name): partition limits
//	then o, o × (partition, k, k × (id, interval, capacity, per µs, cost)):
//	overrides; then w, w × (fairness key, weight); then x, x × (lane, weight)
//
// A queue paused through asynq (Inspector.PauseQueue) gives no job: the
// take answers a block (reason 2) with a wait of pausedPoll, since asynq's
// unpause announces nothing.
//
// Returns {now, wait, reason, next, expired, id_1, msg_1, slot_1, ...}:
// wait (µs, -1 none) is how long until the upstream itself can send again
// when it stopped the take (reason 1 a limit, 2 a block or asynq's pause,
// 3 concurrency);
// next (µs from now, -1 none) is when something else comes due (a
// scheduled job, a parked lane, a lease), 0 when the take stopped at its
// bound on parks or steps before examining every flow; expired is 1 when
// some active job's lease has run out; slot_i is the µs from now until
// job i's slot.
var takeScript = script.New(gcra.LuaFunctions, leaky.DynLua, `
local P, G, T, PT = ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local K_V, K_F, K_CAL, K_GROUPS = KEYS[1], KEYS[2], KEYS[3], KEYS[9]
local K_PK = P .. 'pk'
`+flowLua+`
local now = shaper_now(ARGV[1])
local max_jobs = tonumber(ARGV[2])
local la = tonumber(ARGV[3])
local horizon = now + la
local lease_s = tonumber(ARGV[4])
local conc = tonumber(ARGV[5])
local conc_ttl = tonumber(ARGV[6])
local now_s = now / 1000000

local a = 12
local function arg()
  local v = ARGV[a]
  a = a + 1
  return v
end
local function limits(with_id, upstream)
  local out = {}
  local cnt = tonumber(arg())
  for i = 1, cnt do
    local l = {}
    if with_id then l.id = arg() end
    l.interval = tonumber(arg())
    l.capacity = tonumber(arg())
    l.per = tonumber(arg())
    l.cost = arg()
    if upstream then l.dyn = arg() end
    out[i] = l
  end
  return out
end
local up = limits(false, true)
-- The upstream's limits as paced now: adaptive ones at their current
-- rate, and those the upstream stated after the configured ones.
local n_up = #up
local dyn = shaper_dyn_read(KEYS[13 + n_up])
for i = 1, n_up do
  up[i].interval = shaper_dyn_interval(dyn, up[i].dyn, up[i].interval, now)
  up[i].key = KEYS[12 + i]
end
for s = 1, #KEYS - 13 - n_up do
  local iv, cap, pr = shaper_stated(dyn, s)
  if iv then
    up[#up + 1] = {interval = iv, capacity = cap, per = pr, cost = '', key = KEYS[13 + n_up + s]}
  end
end
local plimits = limits(true)
local overrides = {}
local no = tonumber(arg())
for i = 1, no do
  local p = arg()
  overrides[p] = limits(true)
end
local weights = {}
local nw = tonumber(arg())
for i = 1, nw do
  local k = arg()
  weights[k] = tonumber(arg())
end
local lweights = {}
local nl = tonumber(arg())
for i = 1, nl do
  local k = arg()
  lweights[k] = tonumber(arg())
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
local function cost(l, costs)
  if l.cost == '' then return 1 end
  return costs[l.cost] or 0
end

-- Due scheduled and retrying jobs join their flows, at their old place.
for z = 5, 6 do
  local due = redis.call('ZRANGEBYSCORE', KEYS[z], '-inf', now_s, 'LIMIT', 0, 200)
  for _, id in ipairs(due) do
    redis.call('ZREM', KEYS[z], id)
    local f = redis.call('HMGET', T .. id, 'sl', 'sf', 'sp', 'sq', 'sd')
    if f[1] then
      local from = 'scheduled:'
      if z == 6 then from = waited_as(T .. id, f[5]) end
      push(id, f[1], f[2] or '', f[3] or '', tonumber(f[4] or '0'), now)
      count(KEYS[4], from .. f[1], -1)
      count(KEYS[4], 'pending:' .. f[1], 1)
    end
  end
end
-- Parks whose time passed are no longer parks.
redis.call('ZREMRANGEBYSCORE', K_PK, '-inf', now)
-- Parked lanes whose time came rejoin.
for _, m in ipairs(redis.call('ZRANGEBYSCORE', K_CAL, '-inf', now, 'LIMIT', 0, 200)) do
  redis.call('ZREM', K_CAL, m)
  local bar = string.find(m, '|', 1, true)
  activate_lane(string.sub(m, bar + 1), string.sub(m, 1, bar - 1))
end

local blocked = tonumber(redis.call('HGET', KEYS[10], 'until') or '0')
local tat, changed = {}, false
for i = 1, #up do
  tat[i] = tonumber(redis.call('GET', up[i].key) or '0')
end
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', now)
end

local out = {now, -1, 0, -1, 0}
local taken, parks, steps = 0, 0, 0
local stop = false
-- more: the take stopped at its park or step bound with the ready
-- structure not all examined; the caller must come back at once.
local more = false
if redis.call('EXISTS', KEYS[12]) == 1 then
  -- Paused through asynq: nothing goes, leases are still recovered.
  stop = true
  out[2], out[3] = tonumber(ARGV[11]), 2
end
local conc_expiry = 0
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
    local su, why = now, 0
    if blocked > su then su, why = blocked, 2 end
    for i = 1, #up do
      local l = up[i]
      local at = gcra_earliest(tat[i], now, l.interval, l.capacity, cost(l, costs))
      if at > su then su, why = at, 1 end
    end
    if su > horizon then
      out[2], out[3] = su - horizon, why
      stop = true
      break
    end
    -- The partition's slot.
    local pl = plimits
    if overrides[pk] then pl = overrides[pk] end
    if pk == '' then pl = {} end
    local ptat = {}
    local sp = now
    for j = 1, #pl do
      local l = pl[j]
      ptat[j] = tonumber(redis.call('GET', PT .. pk .. ':' .. l.id) or '0')
      local at = gcra_earliest(ptat[j], now, l.interval, l.capacity, cost(l, costs))
      if at > sp then sp = at end
    end
    if sp > now then
      -- Not this partition's turn yet. It is taken when its slot comes,
      -- not booked ahead: booking the upstream at a partition's later
      -- slot would leave the upstream idle until then.
      unpend(rk, pk)
      redis.call('ZADD', rk, sp, pk)
      redis.call('ZADD', K_PK, sp, g)
      parks = parks + 1
      if parks >= 200 then stop, more = true, true end
      break
    end
    if conc > 0 and redis.call('ZSCORE', KEYS[11], id) == false and redis.call('ZCARD', KEYS[11]) >= conc then
      local oldest = redis.call('ZRANGE', KEYS[11], 0, 0, 'WITHSCORES')
      out[2], out[3] = math.max(0, tonumber(oldest[2]) - now), 3
      stop = true
      break
    end
    local slot = math.max(su, sp)
    for i = 1, #up do
      tat[i] = gcra_take(tat[i], slot, up[i].interval, cost(up[i], costs))
    end
    changed = true
    for j = 1, #pl do
      local l = pl[j]
      ptat[j] = gcra_take(ptat[j], slot, l.interval, cost(l, costs))
      redis.call('SET', PT .. pk .. ':' .. l.id, shaper_int(ptat[j]), 'PX', math.ceil((ptat[j] - now + l.per) / 1000))
    end
    if conc > 0 then
      local exp = slot + conc_ttl
      redis.call('ZADD', KEYS[11], exp, id)
      if exp > conc_expiry then conc_expiry = exp end
    end
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
        local nc = costs_of(redis.call('HGET', T .. nxt[1], 'sc'))
        for j = 1, #pl do
          local l = pl[j]
          local nx = gcra_earliest(ptat[j], now, l.interval, l.capacity, cost(l, nc))
          if nx > e then e = nx end
        end
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

if changed then
  for i = 1, #up do
    redis.call('SET', up[i].key, shaper_int(tat[i]), 'PX', math.ceil((tat[i] - now + up[i].per) / 1000))
  end
end
if conc_expiry > 0 then
  local ttl = math.ceil((conc_expiry - now) / 1000) + 1000
  if redis.call('PTTL', KEYS[11]) < ttl then
    redis.call('PEXPIRE', KEYS[11], ttl)
  end
end

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
`)

// requeueScript puts active jobs that were not sent back at the head of
// their flows (a worker shutting down, a slot missed), releasing their
// concurrency leases.
//
//	KEYS[1] v  KEYS[2] f  KEYS[3] cal  KEYS[4] counts  KEYS[5] asynq active
//	KEYS[6] asynq lease  KEYS[7] asynq groups  KEYS[8] leaky concurrency leases
//	ARGV[1] our prefix  ARGV[2] asynq group prefix  ARGV[3] asynq task prefix
//	ARGV[4] wake channel  ARGV[5] upstream name  ARGV[6..] job ids
//
// Returns how many were active and went back.
var requeueScript = script.New(`
local P, G, T = ARGV[1], ARGV[2], ARGV[3]
local K_V, K_F, K_CAL, K_GROUPS = KEYS[1], KEYS[2], KEYS[3], KEYS[7]
` + flowLua + `
local n = 0
for i = 6, #ARGV do
  local id = ARGV[i]
  redis.call('ZREM', KEYS[8], id)
  if redis.call('LREM', KEYS[5], 0, id) > 0 then
    redis.call('ZREM', KEYS[6], id)
    local f = redis.call('HMGET', T .. id, 'sl', 'sf', 'sp', 'sq')
    if f[1] then
      push(id, f[1], f[2] or '', f[3] or '', tonumber(f[4] or '0'), 0)
      count(KEYS[4], 'active:' .. f[1], -1)
      count(KEYS[4], 'pending:' .. f[1], 1)
      n = n + 1
    end
  end
end
if n > 0 and redis.call('HDEL', K_V, 'sleep') == 1 then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return n
`)

// cancelScript archives a job that is waiting (in a flow, scheduled or
// retrying), marking it dead; the mark that says "cancelled" is the
// caller's. A job in any other state is left alone.
//
//	KEYS[1] task hash  KEYS[2] counts  KEYS[3] pbacklog  KEYS[4] asynq scheduled
//	KEYS[5] asynq retry  KEYS[6] asynq archived  KEYS[7] asynq groups
//	ARGV[1] now override  ARGV[2] asynq group prefix  ARGV[3] id
//
// Returns the state the job was in ("" if there is no such job).
var cancelScript = script.New(`
local f = redis.call('HMGET', KEYS[1], 'state', 'group', 'sl', 'sp', 'sd')
local state = f[1]
if not state then return '' end
local from
if state == 'aggregating' then
  redis.call('ZREM', ARGV[2] .. f[2], ARGV[3])
  if redis.call('EXISTS', ARGV[2] .. f[2]) == 0 then
    redis.call('SREM', KEYS[7], f[2])
  end
  from = 'pending:'
elseif state == 'scheduled' then
  redis.call('ZREM', KEYS[4], ARGV[3])
  from = 'scheduled:'
elseif state == 'retry' then
  redis.call('ZREM', KEYS[5], ARGV[3])
  from = 'retry:'
  if f[5] == '1' then
    from = 'deferred:'
    redis.call('HDEL', KEYS[1], 'sd')
  end
else
  return state
end
local now = shaper_now(ARGV[1])
redis.call('ZADD', KEYS[6], math.floor(now / 1000000), ARGV[3])
redis.call('HSET', KEYS[1], 'state', 'archived')
redis.call('HDEL', KEYS[1], 'group')
local lane = f[3] or ''
local n = redis.call('HINCRBY', KEYS[2], from .. lane, -1)
if n <= 0 then redis.call('HDEL', KEYS[2], from .. lane) end
redis.call('HINCRBY', KEYS[2], 'dead:' .. lane, 1)
local pk = f[4] or ''
if pk ~= '' then
  if tonumber(redis.call('ZINCRBY', KEYS[3], -1, pk)) <= 0 then
    redis.call('ZREM', KEYS[3], pk)
  end
end
return state
`)

// runNowScript moves retrying jobs into their flows at once (an operator
// resumed their upstream) and wakes the workers. A job counted deferred
// leaves that count, one counted retry leaves that one.
//
//	KEYS[1] v  KEYS[2] f  KEYS[3] cal  KEYS[4] counts  KEYS[5] asynq retry
//	KEYS[6] asynq groups
//	ARGV[1] now override  ARGV[2] our prefix  ARGV[3] asynq group prefix
//	ARGV[4] asynq task prefix  ARGV[5] wake channel  ARGV[6] upstream
//	ARGV[7..] ids
//
// Returns how many were retrying.
var runNowScript = script.New(`
local P, G, T = ARGV[2], ARGV[3], ARGV[4]
local K_V, K_F, K_CAL, K_GROUPS = KEYS[1], KEYS[2], KEYS[3], KEYS[6]
` + flowLua + `
local now = shaper_now(ARGV[1])
local n = 0
for i = 7, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[5], id) == 1 then
    local f = redis.call('HMGET', T .. id, 'sl', 'sf', 'sp', 'sq', 'sd')
    if f[1] then
      local from = waited_as(T .. id, f[5])
      push(id, f[1], f[2] or '', f[3] or '', tonumber(f[4] or '0'), now)
      count(KEYS[4], from .. f[1], -1)
      count(KEYS[4], 'pending:' .. f[1], 1)
      n = n + 1
    end
  end
end
if n > 0 then
  redis.call('HDEL', K_V, 'sleep')
  redis.call('PUBLISH', ARGV[5], ARGV[6])
end
return n
`)

// placeScript stores a job directly in a state it otherwise reaches only
// through a worker (retrying, dead, succeeded), with the fields and
// counters a job that got there by dispatch would have, for carrying jobs
// over from another layout (package queue's MigrateLegacy). A retrying job
// stays in its partition's backlog and comes due through the take script
// like any other; a dead or succeeded one is out of it.
//
//	KEYS[1] task hash  KEYS[2] v  KEYS[3] counts  KEYS[4] pbacklog
//	KEYS[5] the state's asynq sorted set (retry, archived or completed)
//	ARGV[1] job id  ARGV[2] encoded asynq message  ARGV[3] lane
//	ARGV[4] fairness key  ARGV[5] partition  ARGV[6] costs
//	ARGV[7] asynq state ("retry", "archived" or "completed")
//	ARGV[8] counter state ("retry", "dead" or "succeeded")
//	ARGV[9] score in KEYS[5]  ARGV[10] "1" when a result follows
//	ARGV[11] result  ARGV[12] wake channel  ARGV[13] upstream name
//
// Returns 0 if a job with this id exists (nothing changed), 1 if stored.
var placeScript = script.New(optionalLua + `
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local id, lane, pk, state = ARGV[1], ARGV[3], ARGV[5], ARGV[7]
local seq = redis.call('HINCRBY', KEYS[2], 'seq', 1)
redis.call('HSET', KEYS[1], 'msg', ARGV[2], 'state', state, 'sl', lane, 'sf', ARGV[4], 'sq', seq)
set_optional(KEYS[1], pk, ARGV[6])
if ARGV[10] == '1' then
  redis.call('HSET', KEYS[1], 'result', ARGV[11])
end
redis.call('ZADD', KEYS[5], ARGV[9], id)
redis.call('HINCRBY', KEYS[3], ARGV[8] .. ':' .. lane, 1)
if state == 'retry' then
  if pk ~= '' then
    redis.call('ZINCRBY', KEYS[4], 1, pk)
  end
  -- A sleeping worker learns of it now rather than at its next poll.
  if redis.call('HDEL', KEYS[2], 'sleep') == 1 then
    redis.call('PUBLISH', ARGV[12], ARGV[13])
  end
end
return 1
`)

// jobHoldScript reads what keeps one job from being taken now.
//
//	KEYS[1] task hash  KEYS[2] leaky block hash  KEYS[3] asynq paused key
//	ARGV[1] now override  ARGV[2] our prefix
//
// Returns {now µs, state ("" none), block end µs (0 none), block reason,
// asynq's paused mark (nil none), partition's park end µs (0 unless the
// job waits in its flow), 1 if handed back (sd) else 0}.
var jobHoldScript = script.New(`
local now = shaper_now(ARGV[1])
local f = redis.call('HMGET', KEYS[1], 'state', 'sl', 'sf', 'sp', 'sd')
local b = redis.call('HMGET', KEYS[2], 'until', 'reason')
local parked = 0
if f[1] == 'aggregating' and f[2] then
  local sc = redis.call('ZSCORE', ARGV[2] .. 'r:' .. f[2] .. '|' .. (f[3] or ''), f[4] or '')
  if sc then parked = tonumber(sc) end
end
local sd = 0
if f[5] == '1' then sd = 1 end
return {now, f[1] or '', tonumber(b[1] or '0'), b[2] or '', redis.call('GET', KEYS[3]), parked, sd}
`)

// holdsScript reads an upstream's counters and what holds its waiting
// jobs: the bucket's block, asynq's pause, and the jobs in flows of
// partitions parked for their limits.
//
//	KEYS[1] counts  KEYS[2] leaky block hash  KEYS[3] asynq paused key
//	KEYS[4] parked flows (P:s:{Q}:pk)
//	ARGV[1] now override  ARGV[2] asynq group prefix  ARGV[3] most parks to count
//
// Returns {now µs, block end µs (0 none), block reason, asynq's paused
// mark (nil none), 1 if parks beyond ARGV[3] went uncounted else 0,
// {field, n, ...} of the counts, {lane, parked jobs, ...}}.
var holdsScript = script.New(`
local now = shaper_now(ARGV[1])
local b = redis.call('HMGET', KEYS[2], 'until', 'reason')
local most = tonumber(ARGV[3])
local parks = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. now, '+inf', 'LIMIT', 0, most)
local lanes = {}
for _, g in ipairs(parks) do
  local lane = string.sub(g, 1, (string.find(g, '|', 1, true) or (#g + 1)) - 1)
  lanes[lane] = (lanes[lane] or 0) + redis.call('ZCARD', ARGV[2] .. g)
end
local parked = {}
for lane, n in pairs(lanes) do
  parked[#parked + 1] = lane
  parked[#parked + 1] = n
end
local more = 0
if #parks == most and redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf') > most then more = 1 end
return {now, tonumber(b[1] or '0'), b[2] or '', redis.call('GET', KEYS[3]), more,
  redis.call('HGETALL', KEYS[1]), parked}
`)
