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
-- ARGV[4] -> "1": a full look; "0": the caller's last take gave all it
--    asked for and it looked fully a moment ago (see Taker), so this take
--    leaves the due sets alone (what came due moves at a later take;
--    but where partitions are limited, the calendar is read still), and,
--    when it gives max jobs too, does not look at what else comes due
--    (next -1) nor at the leases (expired 0): its caller comes back at once
-- ARGV[5] -> asynq lease seconds
-- ARGV[6] -> our prefix
-- ARGV[7] -> asynq group prefix
-- ARGV[8] -> asynq task prefix
-- ARGV[9] -> wait µs to answer while the queue is paused through asynq
-- ARGV[10..] -> the bucket's (leaky.Bucket.BookingArgs), then the partition
--    limits (leaky.Bucket.PartitionArgs), then o, o × (partition, its
--    limits as PartitionArgs): overrides; then w, w × (fairness key,
--    weight); then x, x × (lane, weight)
--
-- A queue paused through asynq (Inspector.PauseQueue) gives no job: the
-- take answers a block (reason 2) with a wait of ARGV[9], since asynq's
-- unpause announces nothing.
--
-- Returns {now, wait, reason, next, expired, id_1, msg_1, slot_1, ...}:
-- wait (µs, -1 none) is how long until the upstream itself can send again
-- when it stopped the take (reason 1 a limit, 2 a block or asynq's pause,
-- 3 concurrency);
-- next (µs from now, -1 none) is when something else comes due (a
-- scheduled job, a parked lane, a lease), 0 when the take stopped at its
-- bound on parks or steps before examining every flow; expired is 1 when
-- some active job's lease has run out (a take that gives max jobs with
-- ARGV[4] "0" answers 0, and leaves leases out of next); slot_i is the µs
-- from now until job i's slot.
--
-- A job whose key is more than one of its sends ahead of a key whose
-- proxied calls wait (call_turn.lua), or whose lane is not behind the lane
-- of a call of its own key that waits, is not taken: the take stops, with
-- a wait of CALL_YIELD, and the call books the slot (calls.lua).
--
-- Needs gcra's library, leaky's booking library (leaky.BookingLua), flow.lua,
-- forward.lua and calls.lua before it (see lua.go).
local P, G, T = ARGV[6], ARGV[7], ARGV[8]
local K_V, K_F, K_CAL, K_GROUPS = KEYS[1], KEYS[2], KEYS[3], KEYS[9]
local sp = space(P, G, T, K_V, K_F, K_CAL, K_GROUPS)
local K_PK = P .. 'pk'

local now = shaper_now(ARGV[1])
local max_jobs = tonumber(ARGV[2])
local la = tonumber(ARGV[3])
local horizon = now + la
local lease_s = tonumber(ARGV[5])
local now_s = now / 1000000

-- The upstream's bucket, its limits as paced now (leaky's library), and
-- asynq's pause mark, read with the limits.
local bucket, a, marks = leaky_open(KEYS, 11, ARGV, 10, now, {KEYS[10]})
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

-- Proxied calls waiting their turn (call_turn.lua, which says what cq
-- and cw hold): keys with calls waiting and no jobs, by virtual time.
local calls, calls_live = call_keys(P, K_F, now)
local call_lanes = {}

-- named: some of the limits ls counts a cost by name.
local function named(ls)
  for _, l in ipairs(ls) do
    if l.cost ~= '' then return true end
  end
  return false
end

-- (A job without costs shares one empty table, read only, so the common
-- case builds none.)
local NO_COSTS = {}
local function costs_of(s)
  if not s or s == '' then return NO_COSTS end
  local t = {}
  do
    for k, v in string.gmatch(s, '([^=,]+)=(%d+)') do
      t[k] = tonumber(v)
    end
  end
  return t
end

local look = ARGV[4] == '1'
local firsts = {}
-- Where partitions are limited, a lane whose every partition was parked
-- waits on the calendar: it is brought back at every take, so that one
-- partition's backlog never holds another's jobs back.
local parted = #plimits > 0 or no > 0 or bucket.pov ~= ''
if look or parted then
  firsts = forward_due(sp, KEYS[5], KEYS[6], KEYS[4], now, parted)
end

local out = {now, -1, 0, -1, 0}
local taken, parks, steps = 0, 0, 0
local stop = false
-- more: the take stopped at its park or step bound with the ready
-- structure not all examined; the caller must come back at once.
local more = false
if marks[1] then
  -- Paused through asynq: nothing goes, leases are still recovered.
  stop = true
  out[2], out[3] = tonumber(ARGV[9]), 2
end
-- What the take changed, written once after the loop.
local went, went_lane = {}, {}
-- view: what the take knows of the first members of a sorted set it
-- picks from (fairness keys, a key's lanes, a lane's partitions): read
-- once, up to VIEW members, then kept in order by the take itself, whose
-- new scores are written once, after the loop (dirty), or before the set
-- is read again. Nothing else writes these sets while the take runs, so
-- going back to one (the one fairness key and lane of the common case,
-- every tenant of a fair share) costs no read. list holds the first
-- members in ZRANGE's order as the take has made it, {member, score}
-- each; full: it holds all of them.
--
-- A set that held one member when the take read it, and still does,
-- keeps that member's score as it is in Redis when the take moves it on
-- within the virtual times (fairness keys, lanes: vt) or to a time not
-- after now (partitions): its score orders it against nothing, and one
-- that joins it comes in at that score (flow.lua's virtual time), or, for
-- a partition, at a later now. So the common case, one key, one lane, no
-- partitions, writes none of these sets.
local VIEW = 16
local views = {}
-- before: a member of score sa and name ma comes before one of sb, mb in
-- a sorted set (names compared as bytes, as Redis does).
local function before(sa, ma, sb, mb)
  if sa ~= sb then return sa < sb end
  for i = 1, math.min(#ma, #mb) do
    local x, y = string.byte(ma, i), string.byte(mb, i)
    if x ~= y then return x < y end
  end
  return #ma < #mb
end
local function flush(key, v)
  local z = {}
  local only = v.sole and #v.list == 1 and v.list[1][1]
  for m, sc in pairs(v.dirty) do
    if m ~= only or (not v.vt and sc > now) then
      z[#z + 1] = sc
      z[#z + 1] = m
    end
  end
  if #z > 0 then redis.call('ZADD', key, 'XX', unpack(z)) end
  v.dirty = {}
end
local function view(key, vt)
  local v = views[key]
  if v and (#v.list > 0 or v.full) then return v end
  if not v then
    v = {dirty = {}, vt = vt}
    views[key] = v
  end
  flush(key, v)
  local r = redis.call('ZRANGE', key, 0, VIEW - 1, 'WITHSCORES')
  v.list = {}
  for i = 1, #r, 2 do v.list[#v.list + 1] = {r[i], tonumber(r[i + 1])} end
  v.full = #v.list < VIEW
  if v.sole == nil then v.sole = #v.list == 1 and not calls_live end
  return v
end
-- top: the first member and its score (nil: the set is empty).
local function top(v)
  local e = v.list[1]
  if e then return e[1], e[2] end
end
-- rescore: the first member moves to score sc; past the members the view
-- holds (and not full), it leaves the view, which stays the set's head.
local function rescore(v, sc)
  local e = table.remove(v.list, 1)
  e[2] = sc
  v.dirty[e[1]] = sc
  local i = 1
  while v.list[i] and not before(sc, e[1], v.list[i][2], v.list[i][1]) do i = i + 1 end
  if v.list[i] or v.full then table.insert(v.list, i, e) end
end
-- drop_first: the first member leaves the set.
local function drop_first(key, v)
  local e = table.remove(v.list, 1)
  v.dirty[e[1]] = nil
  redis.call('ZREM', key, e[1])
end
-- empty: the set holds no member now.
local function empty(key)
  return top(view(key)) == nil
end
-- flows: what the take has read of a flow, from its head, a few jobs per
-- read (as many as the take may still give, and the one after); the jobs
-- it takes leave the flow at the end of the take, all at once.
-- parked: the parks of flows (K_PK, read only by status) the take made,
-- flow -> µs, written in one ZADD after the loop; a flow that empties
-- leaves it (gone: flows to take out of K_PK, in one ZREM).
local parked, gone = {}, {}
local function unpark(g)
  parked[g] = nil
  gone[#gone + 1] = g
end
local flows = {}
local function flow_head(g)
  local fl = flows[g]
  if not fl then
    fl = {ids = {}, at = 1, rank = 0, more = true, took = {}}
    flows[g] = fl
  end
  if fl.more and fl.ids[fl.at + 1] == nil then
    -- The jobs taken are still in the flow, ahead of the rest.
    local from = fl.rank + fl.at - 1
    local k = math.max(1, max_jobs - taken)
    fl.ids = redis.call('ZRANGE', G .. g, from, from + k)
    fl.rank, fl.at, fl.more = from, 1, #fl.ids == k + 1
  end
  return fl
end
-- Lanes and fairness keys retire lazily, when the take finds them empty.
-- (These helpers are built once per take, not once per job.)
local function retire_key(fv)
  drop_first(K_F, fv)
end
local function retire_lane(lk, lv, fv)
  drop_first(lk, lv)
  if empty(lk) then retire_key(fv) end
end
-- lane_at: the take's own view of lane l's start in the current key's
-- lanes (cur_lk, cur_lv), for call_lane_first.
local cur_lk, cur_lv
local function lane_at(l)
  if cur_lv.dirty[l] then return cur_lv.dirty[l] end
  for _, e in ipairs(cur_lv.list) do
    if e[1] == l then return e[2] end
  end
  local t = redis.call('ZSCORE', cur_lk, l)
  return t and tonumber(t)
end
while not stop and taken < max_jobs and steps < 2000 do
  steps = steps + 1
  repeat
    local fv = view(K_F, true)
    local fk, s1 = top(fv)
    if fk == nil then stop = true break end
    local lk = P .. 'l:' .. fk
    local lv = view(lk, true)
    local lane, s2 = top(lv)
    if lane == nil then
      retire_key(fv)
      break
    end
    local rk = P .. 'r:' .. lane .. '|' .. fk
    local rv = view(rk)
    local pk, elig = top(rv)
    if pk == nil then
      retire_lane(lk, lv, fv)
      break
    end
    if elig > now then
      -- Every partition of this lane is parked: calendar it.
      retire_lane(lk, lv, fv)
      redis.call('ZADD', K_CAL, elig, lane .. '|' .. fk)
      firsts.cal = nil
      break
    end
    local g = lane .. '|' .. fk .. '|' .. pk
    -- The job and the one after it, which the flow's next chance needs.
    local fl = flow_head(g)
    local id = fl.ids[fl.at]
    if id == nil then
      drop_first(rk, rv)
      redis.call('SREM', K_GROUPS, g)
      unpark(g)
      break
    end
    local tk = T .. id
    -- The message is read with the costs: a job held back by its
    -- partition's limits reads it in vain, but one that goes needs no
    -- second read.
    local f = redis.call('HMGET', tk, 'sc', 'msg')
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
      rescore(rv, pslot)
      parked[g] = pslot
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
    cur_lk, cur_lv = lk, lv
    if call_ahead(calls, fk, s1, 1 / (weights[fk] or 1)) or call_lane_first(P, K_V, fk, lane, s2, lane_at, s2, now, call_lanes) then
      -- A key whose calls wait is behind, or a call of this key waits in
      -- a lane not ahead of this job's: the call gets the slot.
      out[2], out[3] = CALL_YIELD, 1
      stop = true
      break
    end
    local slot = math.max(su, pslot)
    leaky_book(bucket, slot, costs, id)
    leaky_partition_book(part, slot, costs, now)
    -- The job leaves its flow for asynq's active list (the flow's ZREM
    -- comes after the loop).
    fl.took[#fl.took + 1] = id
    fl.at = fl.at + 1
    local nxt = fl.ids[fl.at]
    if nxt == nil then
      redis.call('SREM', K_GROUPS, g)
      drop_first(rk, rv)
      unpark(g)
    else
      -- The partition can go again when its limits allow its next job's
      -- costs (a job without a limit's cost is not held by it).
      local e = now
      if #pl > 0 then
        -- (Limits that count requests alone need not read its costs.)
        local nc = {}
        if named(pl) then nc = costs_of(redis.call('HGET', T .. nxt, 'sc')) end
        e = leaky_partition_earliest(part, nc, now)
      end
      rescore(rv, e)
      if e > now then parked[g] = e end
    end
    -- To asynq's active state; the list, the leases and the counters are
    -- written once for the whole take, below.
    -- (Its group field goes empty, not away, in the same write: asynq
    -- reads "" as no group.)
    redis.call('HSET', tk, 'state', 'active', 'group', '')
    went[#went + 1] = id
    went_lane[lane] = (went_lane[lane] or 0) + 1
    -- Fair share: the key and the lane each move on by 1/weight (written
    -- once, below).
    rescore(fv, s1 + 1 / (weights[fk] or 1))
    rescore(lv, s2 + 1 / (lweights[lane] or 1))
    out[#out + 1] = id
    out[#out + 1] = f[2]
    out[#out + 1] = slot - now
    taken = taken + 1
  until true
end
if not stop and taken < max_jobs and steps >= 2000 then more = true end
for key, v in pairs(views) do
  flush(key, v)
end
if #gone > 0 then redis.call('ZREM', K_PK, unpack(gone)) end
do
  local z = {}
  for g, t in pairs(parked) do
    z[#z + 1] = t
    z[#z + 1] = g
  end
  if #z > 0 then redis.call('ZADD', K_PK, unpack(z)) end
end
for g, fl in pairs(flows) do
  if #fl.took > 0 then
    redis.call('ZREM', G .. g, unpack(fl.took))
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
end

leaky_commit(bucket, now)

-- When does something else come due?
local next = -1
local function sooner(t)
  if t and (next < 0 or t < next) then next = t end
end
if look or taken < max_jobs then
  -- (What forward_due read still stands unless something of it moved.)
  for z, name in pairs({[5] = 'scheduled', [6] = 'retry'}) do
    local first = firsts[name]
    if first == nil then first = first_score(KEYS[z]) end
    if first then sooner(math.max(0, math.floor(first * 1000000) - now)) end
  end
  local cal = firsts.cal
  if cal == nil then cal = first_score(K_CAL) end
  if cal then sooner(math.max(0, cal - now)) end
  local lease = redis.call('ZRANGE', KEYS[8], 0, 0, 'WITHSCORES')
  if #lease > 0 then
    local exp = tonumber(lease[2]) * 1000000
    if exp <= now then out[5] = 1 else sooner(exp - now) end
  end
end
if more then sooner(0) end
out[4] = next
if taken == 0 and out[2] < 0 and not more then
  -- Nothing can go now: the next enqueue wakes the workers.
  redis.call('HSET', K_V, 'sleep', 1)
end
return out
