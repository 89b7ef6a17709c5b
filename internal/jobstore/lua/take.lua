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
-- job is taken only once its partition can send by the upstream's own slot
-- for it (now, or that later slot), so a partition never holds the
-- upstream idle, and a partition whose limit is no tighter than the
-- upstream's gives a take as many jobs as the upstream's. A lane whose
-- every partition must wait past the upstream's next slot goes on the
-- calendar until its earliest one can send.
--
-- KEYS[1] -> f
-- KEYS[2..] -> the upstream bucket's keys (leaky.Bucket.BookingKeys)
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
-- ARGV[6] -> our prefix P:s:{Q}:, which the counters (c), v, cal, pk, cw
--    and the lanes' and partitions' sets are named from (see lua.go)
-- ARGV[7] -> asynq's prefix of the queue, asynq:{Q}:, which its keys are
--    named from as Keys (keys.go) names them: scheduled, retry, active,
--    lease, groups, paused, g: (a flow), t: (a task)
-- ARGV[8..] -> the bucket's (leaky.Bucket.BookingArgs); then, unless every
--    one of them is empty (then ARGV ends there), the partition limits
--    (leaky.Bucket.PartitionArgs), then o, o × (partition, its limits as
--    PartitionArgs): overrides; then w, w × (fairness key, weight); then
--    x, x × (lane, weight): weights other than 1, or every lane's where
--    the upstream has more than one and partition limits
--
-- (Every KEYS or ARGV element costs Redis about as much as a small
-- command's share of a call, so what the take can name from a prefix, or
-- needs only in some cases, is not passed.)
--
-- A queue paused through asynq (Inspector.PauseQueue) gives no job: the
-- take answers a block (reason 2) with a wait of PAUSED_POLL, since asynq's
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
-- a wait of CALL_YIELD, and the call books the slot (calls.lua). A job
-- whose key is more than one send ahead of a key whose calls wait for the
-- job's partition (a call mark, partmarks.lua) is not taken either, but
-- only its partition is held for the call, until after the call's send
-- (its score in r: moves there; the take goes on with other partitions);
-- its key is marked beside the calls (a job mark), so that a call ahead of
-- it leaves it the partition's slot. And while such a call's key is
-- behind, the take books no upstream slot at or after the time the call
-- comes back (it stops there, with a wait of CALL_YIELD): that slot is
-- the call's.
--
-- A key whose last lane goes on the calendar leaves f; its virtual start
-- is kept in kv, which it comes back at (flow.lua's kept_start), so that
-- keys whose lanes wait on the calendar by turns (their jobs share a
-- partition tighter than the upstream) keep their order; and so is a
-- lane's, in kl:FK, where the upstream has more than one lane. Where
-- partitions are limited, a key's virtual start (and a lane's, so) is
-- therefore read and written even while it is the only one in its set.
--
-- What a take costs Redis is mostly its calls (a few thousand instructions
-- each, more for a number Redis must format: constant strings are passed
-- where they will do) and the tables and closures it builds; so the common
-- case (one fairness key, one lane, no partition limits, no calls waiting)
-- reads nothing it need not, and builds little per job: once a job went
-- from a flow whose key, lane and partition each had its set to itself,
-- and no partition limit counts it, the next job of that flow goes the
-- same way without a look at those sets (a run).
--
-- Needs gcra's library, leaky's booking library (leaky.BookingLua) and
-- count.lua before it, the loaders take_forward (flow.lua and forward.lua:
-- space, forward_due, due_firsts, first_score) and take_calls (calls.lua
-- and partmarks.lua: call_keys, call_ahead, call_lane_first, CALL_YIELD,
-- CALL_MARK, part_mark, part_marks, part_lapse), and PAUSED_POLL (see
-- lua.go).
local P, A = ARGV[6], ARGV[7]
local K_F, K_COUNTS = KEYS[1], P .. 'c'
local G, T = A .. 'g:', A .. 't:'

local now = shaper_now(ARGV[1])
local max_jobs = tonumber(ARGV[2])
local horizon = now + tonumber(ARGV[3])

-- The upstream's bucket, its limits as paced now (leaky's library), and
-- asynq's pause mark, read with the limits. Whether any call was ever
-- marked waiting (cw), or any job waits in asynq's scheduled or retry
-- sets, or any lane on the calendar, is asked with the bucket's optional
-- state: quiet, none of them exists (the common case), and the take does
-- nothing of calls, due jobs or the calendar.
local K_CW, K_CAL, K_SCHED, K_RETRY = P .. 'cw', P .. 'cal', A .. 'scheduled', A .. 'retry'
local bucket, a, marks, quiet = leaky_open(KEYS, 2, ARGV, 8, now, {A .. 'paused'}, {K_CW, K_SCHED, K_RETRY, K_CAL, P .. 'cpw'})
-- (Read only: every job without costs, every table of weights or limits
-- not given, shares it.)
local NONE = {}
local plimits, overrides, weights, lweights = NONE, NONE, NONE, NONE
-- lanes_kept: partitions are limited and the upstream has lanes (more
-- than one is passed): a lane's virtual start is kept while it waits on
-- the calendar, as its key's is (see below).
local lanes_kept = false
local parted = bucket.pov ~= ''
if ARGV[a] then
  plimits, a = leaky_limits(ARGV, a)
  local no = tonumber(ARGV[a])
  a = a + 1
  if no > 0 then
    overrides = {}
    for i = 1, no do
      local p = ARGV[a]
      overrides[p], a = leaky_limits(ARGV, a + 1)
    end
  end
  parted = parted or #plimits > 0 or no > 0
  local nw = tonumber(ARGV[a])
  if nw > 0 then
    weights = {}
    for i = 1, nw do
      weights[ARGV[a + 2 * i - 1]] = tonumber(ARGV[a + 2 * i])
    end
  end
  a = a + 1 + 2 * nw
  local nl = tonumber(ARGV[a])
  lanes_kept = parted and nl > 1
  if nl > 0 then
    lweights = {}
    for i = 1, nl do
      lweights[ARGV[a + 2 * i - 1]] = tonumber(ARGV[a + 2 * i])
    end
  end
end

-- Proxied calls waiting their turn (call_turn.lua, which says what cq
-- and cw hold): keys with calls waiting and no jobs, by virtual time;
-- and, where partitions are limited, whether any call waits for its
-- partition (parts_live: a live call mark in cpw, partmarks.lua).
local calls, calls_live, parts_live, holes = NONE, false, false, nil
local HOLE_GRACE = 20000
local call_keys, call_ahead, call_lane_first, CALL_YIELD, CALL_MARK
local part_mark, part_marks, part_lapse
if not quiet then
  call_keys, call_ahead, call_lane_first, CALL_YIELD, CALL_MARK, part_mark, part_marks, part_lapse = take_calls()
  calls, calls_live = call_keys(P, K_F, now)
  if parted then
    -- (At most 16: those that come back first.)
    local r = redis.call('ZRANGEBYSCORE', P .. 'cpw', '(' .. shaper_int(now), '+inf', 'WITHSCORES', 'LIMIT', '0', '16')
    if #r > 0 then
      parts_live, calls_live = true, true
      -- holes: the calls waiting for their partitions, each {key, its
      -- virtual time in the rotation (cr), µs it comes back}: while its
      -- key is behind, the take books no slot at or after the time it
      -- comes back (see below).
      holes = {}
      local ms = {}
      for i = 1, #r, 2 do ms[#ms + 1] = r[i] end
      local vts = redis.call('ZMSCORE', P .. 'cr', unpack(ms))
      for i, m in ipairs(ms) do
        local fk = string.sub(m, string.find(m, '\n', 1, true) + 1)
        local h = tonumber(r[2 * i]) - CALL_MARK
        if vts[i] and h + HOLE_GRACE > now then holes[#holes + 1] = {fk, tonumber(vts[i]), h} end
      end
    end
  end
end

-- by_name: some limit counts a cost by name, so a job's costs are read.
-- (An operator's override of a partition may: read them where there are
-- overrides.)
local by_name = bucket.named or bucket.pov ~= ''
if parted then
  for i = 1, #plimits do
    if plimits[i].cost ~= '' then by_name = true end
  end
  for _, ls in pairs(overrides) do
    for i = 1, #ls do
      if ls[i].cost ~= '' then by_name = true end
    end
  end
end
-- named: some of the limits ls counts a cost by name; costs_of: the
-- costs a task's sc field says. (Built where costs are read at all.)
local named, costs_of
if by_name or parted then
  named = function(ls)
    for i = 1, #ls do
      if ls[i].cost ~= '' then return true end
    end
    return false
  end
  costs_of = function(s)
    if not s or s == '' then return NONE end
    local t = {}
    for k, v in string.gmatch(s, '([^=,]+)=(%d+)') do
      t[k] = tonumber(v)
    end
    return t
  end
end

local look = ARGV[4] == '1'
-- firsts: what forward_due (or due_firsts) read of the due sets and the
-- calendar, for the answer's next; nil: not read.
local firsts
local space, forward_due, due_firsts, first_score
if quiet then
  firsts = {scheduled = false, retry = false, cal = false}
elseif look or parted then
  -- Where partitions are limited, a lane whose every partition was parked
  -- waits on the calendar: it is brought back at every take, so that one
  -- partition's backlog never holds another's jobs back.
  space, forward_due, due_firsts, first_score = take_forward()
  firsts = forward_due(space(P, G, T, P .. 'v', K_F, K_CAL, A .. 'groups'), K_SCHED, K_RETRY, K_COUNTS, now, look)
end
-- The parks (pk, which only status reads, counting those not past) whose
-- time passed go at a full look. (Where no partition is limited there are
-- none: those left from before go with their flows.)
if parted and look then
  redis.call('ZREMRANGEBYSCORE', P .. 'pk', '-inf', now)
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
  out[2], out[3] = PAUSED_POLL, 2
end
-- What the take changed, written once after the loop.
local went, went_lane = {}, {}
-- view: what the take knows of the first members of a sorted set it
-- picks from (fairness keys, a key's lanes, a lane's partitions): read
-- once, up to 16 members, then kept in order by the take itself, whose
-- new scores are written once, after the loop (dirty, false until one
-- is), or before the set is read again. Nothing else writes these sets
-- while the take runs, so going back to one (the one fairness key and
-- lane of the common case, every tenant of a fair share) costs no read.
-- m and s hold the first members and their scores in ZRANGE's order as
-- the take has made it; full: they hold all of them.
--
-- A set that held one member when the take read it, and still does,
-- keeps that member's score as it is in Redis when the take moves it on
-- within the virtual times (fairness keys, lanes: vt) or to a time not
-- after now (partitions): its score orders it against nothing, and one
-- that joins it comes in at that score (flow.lua's virtual time), or, for
-- a partition, at a later now. So the common case, one key, one lane, no
-- partitions, writes none of these sets; and a sole key's or lane's score
-- is not even read (s is then ZERO's, and never moved).
local views = {[K_F] = false}
-- cal_z: the lanes the take puts on the calendar, in one ZADD after the
-- loop (nothing reads the calendar while it runs).
local cal_z = false
-- kv_z: the virtual times of the keys that left the rotation with their
-- lanes on the calendar, in one ZADD after the loop.
local kv_z = false
-- kl_z: the same for lanes, by key (kl:FK).
local kl_z = false
local ZERO = {0}
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
  if v.rm then
    redis.call('ZREM', key, unpack(v.rm))
    v.rm = nil
  end
  if not v.dirty then return end
  local only
  if v.sole and #v.m == 1 then only = v.m[1] end
  local z = {}
  for m, sc in pairs(v.dirty) do
    if m ~= only or (not v.vt and sc > now) then
      -- (A partition's score is µs, whole: Lua writes it for less than
      -- Redis's own %.17g of a number.)
      if not v.vt then sc = string.format('%d', sc) end
      z[#z + 1] = sc
      z[#z + 1] = m
    end
  end
  if #z > 0 then redis.call('ZADD', key, 'XX', unpack(z)) end
  v.dirty = false
end
-- keeps: a virtual-time set (the keys', or a key's lanes') whose scores
-- are kept for its members while they wait on the calendar (kv, kl):
-- read, and moved, even while it holds one member.
local function keeps(key)
  return parted and (key == K_F or lanes_kept)
end
local function view(key, vt)
  local v = views[key]
  if v then
    if v.m[1] or v.full then return v end
    if v.dirty or v.rm then flush(key, v) end
  else
    if vt and not calls_live and not keeps(key) then
      -- A key's or a lane's score matters only against another's, so the
      -- first read asks for two names and no scores (Redis formats each
      -- score, and Lua parses it back). (Where partitions are limited, a
      -- key's is kept for it while its lanes wait on the calendar: read,
      -- and moved, always.)
      local ms = redis.call('ZRANGE', key, '0', '1')
      if #ms < 2 then
        v = {m = ms, s = ZERO, full = true, sole = #ms == 1, vt = true, dirty = false}
        views[key] = v
        return v
      end
    end
    v = {m = false, s = false, full = false, sole = nil, vt = vt, dirty = false}
    views[key] = v
  end
  local r = redis.call('ZRANGE', key, '0', '15', 'WITHSCORES')
  local ms, ss = {}, {}
  for i = 2, #r, 2 do
    ms[i / 2], ss[i / 2] = r[i - 1], tonumber(r[i])
  end
  v.m, v.s, v.full = ms, ss, #ms < 16
  if v.sole == nil then v.sole = #ms == 1 and not calls_live and not (vt and keeps(key)) end
  return v
end
-- The sets the calendar's lanes came back to, where they were empty, hold
-- what forward_due put in them: the take knows them without a read.
if firsts and firsts.seen and not calls_live and not lanes_kept then
  for key, ms in pairs(firsts.seen) do
    if #ms == 1 then
      views[key] = {m = {ms[1]}, s = ZERO, full = true, sole = true, vt = true, dirty = false}
    elseif #ms < 16 then
      table.sort(ms, function(x, y) return before(0, x, 0, y) end)
      local ss = {}
      for i = 1, #ms do ss[i] = 0 end
      views[key] = {m = ms, s = ss, full = true, sole = false, vt = true, dirty = false}
    end
  end
end
-- rescore: the first member moves to score sc; past the members the view
-- holds (and not full), it leaves the view, which stays the set's head. A
-- sole member's new score is written only if it is a partition's and
-- later than now (see above): a sole key's or lane's is not kept at all.
local function rescore(v, sc)
  local ms = v.m
  local m = ms[1]
  if v.sole then
    if v.vt then return end
    v.s[1] = sc
  else
    local ss, n = v.s, #ms
    local i = 1
    while i < n and not before(sc, m, ss[i + 1], ms[i + 1]) do
      ms[i], ss[i] = ms[i + 1], ss[i + 1]
      i = i + 1
    end
    if i < n or v.full then
      ms[i], ss[i] = m, sc
    else
      ms[i], ss[i] = nil, nil
    end
  end
  local d = v.dirty
  if v.sole and sc <= now then
    if d then d[m] = nil end
    return
  end
  if not d then
    d = {}
    v.dirty = d
  end
  d[m] = sc
end
-- drop_first: the first member leaves the set. The fairness keys' set
-- loses its members in one ZREM, with its flush (below, or before it is
-- read again), unless calls wait: they read the sets too.
local function drop_first(key, v)
  local m = table.remove(v.m, 1)
  if v.s ~= ZERO then table.remove(v.s, 1) end
  if v.dirty then v.dirty[m] = nil end
  if key == K_F and not calls_live then
    local rm = v.rm
    if not rm then
      rm = {}
      v.rm = rm
    end
    rm[#rm + 1] = m
  else
    redis.call('ZREM', key, m)
  end
end
-- flows: what the take has read of a flow, from its head, a few jobs per
-- read (as many as the take may still give, or the flow's share of it,
-- see share below, and the one after); the jobs it takes leave the flow at
-- the end of the take, all at once: they are its first rank + at - 1
-- (nothing else writes a flow while the take runs).
-- parked: the parks of flows (K_PK, read only by status) the take made,
-- flow -> µs, written in one ZADD after the loop; a flow that empties
-- leaves it (gone: flows to take out of K_PK, in one ZREM). Parks come
-- of partition limits alone.
local parked, gone = NONE, false
if parted then parked = {} end
-- share: about as many jobs as the flow may give in this take, where
-- other flows share it (max jobs where none does): a read asks for that
-- many and the one after, not for the whole take's (every id read costs
-- Redis its reply and Lua its string, used or not). A flow that gives more
-- is read again, for at least twice as many.
local flows = {}
local function flow_head(g, share)
  local fl = flows[g]
  if not fl then
    -- From the head: the jobs up to max jobs (or share), and the one
    -- after; the first read of a take asks for ARGV[2]'s own string.
    local k = max_jobs - taken
    local hi = ARGV[2]
    if share < k then
      k, hi = share, share
    elseif taken > 0 then
      hi = k
    end
    local key = G .. g
    local ids = redis.call('ZRANGE', key, '0', hi)
    fl = {key = key, ids = ids, at = 1, rank = 0, more = #ids == k + 1, n = k}
    flows[g] = fl
  elseif fl.more and fl.ids[fl.at + 1] == nil then
    -- The jobs taken are still in the flow, ahead of the rest.
    local from = fl.rank + fl.at - 1
    local k = math.min(math.max(1, max_jobs - taken), math.max(2 * fl.n, share))
    fl.ids = redis.call('ZRANGE', fl.key, from, from + k)
    fl.rank, fl.at, fl.more, fl.n = from, 1, #fl.ids == k + 1, k
  end
  return fl
end
-- lane_at: the take's own view of lane l's start in the current key's
-- lanes (cur_lk, cur_lv), for call_lane_first (only where calls wait).
local cur_lk, cur_lv, lane_at, call_lanes
if calls_live then
  call_lanes = {}
  lane_at = function(l)
    if cur_lv.dirty and cur_lv.dirty[l] then return cur_lv.dirty[l] end
    for i, m in ipairs(cur_lv.m) do
      if m == l then return cur_lv.s[i] end
    end
    local t = redis.call('ZSCORE', cur_lk, l)
    return t and tonumber(t)
  end
end
-- jm: the marks the take leaves on a partition a call waits for, for a
-- key whose jobs wait for it too (partmarks.lua's job marks: pk -> fk ->
-- {until µs, the key's virtual time}): a call of a key ahead of it
-- leaves it the partition's slot, though the take may come for the slot
-- after the call. Written once, after the loop.
local jm = false
-- (Built only where calls wait for their partitions.)
local job_mark, call_marks, part_vt, jobs_vt
if parts_live then
  job_mark = function(pk, fk, vt, until_)
    if not jm then jm = {} end
    local p = jm[pk]
    if not p then
      p = {}
      jm[pk] = p
    end
    p[fk] = {until_, vt}
  end
  -- call_marks: the live marks of keys whose calls wait for partition pk,
  -- read once a take.
  local marks_of = {}
  call_marks = function(pk)
    local m = marks_of[pk]
    if not m then
      m = part_marks(P, pk, now, false)
      marks_of[pk] = m
    end
    return m
  end
  -- part_vt: key fk's virtual time within partition pk, where calls wait
  -- for it: its job mark's (the time of its jobs' sends in pk, as a call
  -- key's mark is of its calls'), else, new to the partition's turns, the
  -- least of the other keys waiting there. Keys take turns in the
  -- partition by these, not by their places in the rotation, which a key
  -- back from the calendar takes up near the rotation's head while a key
  -- of calls alone does not. (Kept as the take moves it.)
  jobs_vt = {}
  part_vt = function(pk, fk)
    local t = jobs_vt[pk]
    if not t then
      t = {}
      for _, m in ipairs(part_marks(P, pk, now, true)) do t[m[1]] = m[2] end
      jobs_vt[pk] = t
    end
    local v = t[fk]
    if v then return v end
    for o, ov in pairs(t) do
      if o ~= fk and (v == nil or ov < v) then v = ov end
    end
    for _, c in ipairs(call_marks(pk)) do
      if c[1] ~= fk and (v == nil or c[2] < v) then v = c[2] end
    end
    v = v or 0
    t[fk] = v
    return v
  end
end
-- call_behind: some other key than fk, of the calls that wait for a
-- partition (cs), is more than q behind fk's virtual time s.
-- after_one: when partition part could send again after one request
-- sent at its own slot pslot.
local call_behind, after_one, hole_at
if parts_live then
  -- hole_at: when a call of another key than fk that waits for its
  -- partition comes back, if by slot su, and fk (at virtual time s,
  -- sends of q) is more than one send ahead of it; else nil.
  hole_at = function(fk, s, q, su)
    for _, h in ipairs(holes) do
      if h[1] ~= fk and su >= h[3] and s > h[2] + q + 1e-9 then return h[3] end
    end
    return nil
  end
  call_behind = function(cs, fk, s, q)
    for _, c in ipairs(cs) do
      if c[1] ~= fk and s > c[2] + q + 1e-9 then return true end
    end
    return false
  end
  after_one = function(part, pslot, costs, now)
    local e, lim = now, part.lim
    for j = 1, #lim do
      local l = lim[j]
      local c = 1
      if l.cost ~= '' then c = costs[l.cost] or 0 end
      local at = gcra_earliest(gcra_take(part.tat[j], math.max(pslot, now), l.interval, c), now, l.interval, l.capacity, c)
      if at > e then e = at end
    end
    return e
  end
end
-- What the last job went by: its key, lane, partition and flow, their
-- views and sets' keys (the common case meets the same ones job after
-- job); run: the next job of the flow may go by them unlooked (see above).
local fv, fk, s1, lk, lv, lane, s2, rk, rv, pk, g, fl
local run = false
while not stop and taken < max_jobs and steps < 2000 do
  steps = steps + 1
  repeat
    local part, pl, pslot = nil, NONE, now
    if run then
      fl = flow_head(g, max_jobs)
    else
      fv = view(K_F, true)
      local k1 = fv.m[1]
      if k1 == nil then stop = true break end
      s1 = fv.s[1]
      if k1 ~= fk then
        fk, lk, lane = k1, P .. 'l:' .. k1, nil
      end
      lv = view(lk, true)
      local l1 = lv.m[1]
      if l1 == nil then
        drop_first(K_F, fv)
        break
      end
      s2 = lv.s[1]
      if l1 ~= lane then
        lane, rk, pk = l1, P .. 'r:' .. l1 .. '|' .. fk, nil
      end
      rv = view(rk)
      local p1, elig = rv.m[1], rv.s[1]
      -- (A lane retires lazily, when the take finds it empty; its key
      -- when its last lane does.)
      if p1 == nil then
        drop_first(lk, lv)
        if view(lk).m[1] == nil then drop_first(K_F, fv) end
        break
      end
      if elig > now and elig > leaky_earliest(bucket, NONE, now) then
        -- Every partition of this lane is parked past the upstream's own
        -- next slot: calendar it (its virtual start kept in kl).
        drop_first(lk, lv)
        if lanes_kept then
          if not kl_z then kl_z = {} end
          local z = kl_z[fk]
          if not z then
            z = {}
            kl_z[fk] = z
          end
          z[#z + 1], z[#z + 2] = s2, lane
        end
        if view(lk).m[1] == nil then
          -- The key's last lane: it leaves the rotation, and its virtual
          -- time is kept (kv) until a lane of it comes back (flow.lua).
          drop_first(K_F, fv)
          if not kv_z then kv_z = {} end
          local c = #kv_z
          kv_z[c + 1], kv_z[c + 2] = s1, fk
        end
        if not cal_z then cal_z = {} end
        local c = #cal_z
        cal_z[c + 1], cal_z[c + 2] = elig, lane .. '|' .. fk
        if firsts then firsts.cal = nil end
        break
      end
      if p1 ~= pk then
        pk, g = p1, lane .. '|' .. fk .. '|' .. p1
      end
      -- The job and the one after it, which the flow's next chance needs
      -- (and the flow's share of the take, as the views count the keys,
      -- the key's lanes and the lane's partitions).
      local share = max_jobs
      if not (fv.sole and lv.sole and rv.sole) then
        share = math.ceil((max_jobs - taken) / (#fv.m * #lv.m * #rv.m))
      end
      fl = flow_head(g, share)
    end
    local id = fl.ids[fl.at]
    if id == nil then
      drop_first(rk, rv)
      redis.call('SREM', A .. 'groups', g)
      parked[g] = nil
      if not gone then gone = {} end
      gone[#gone + 1] = g
      run = false
      break
    end
    local tk = T .. id
    -- The message is read with the costs: a job held back by its
    -- partition's limits reads it in vain, but one that goes needs no
    -- second read.
    local costs, msg = NONE, nil
    if by_name then
      local f = redis.call('HMGET', tk, 'sc', 'msg')
      costs, msg = costs_of(f[1]), f[2]
    else
      msg = redis.call('HGET', tk, 'msg')
    end
    -- The upstream's own slot for this job.
    local su, why = leaky_earliest(bucket, costs, now)
    if su > horizon then
      out[2], out[3] = su - horizon, why
      stop = true
      break
    end
    -- The partition's slot. (No partition, or none limited: it can send
    -- now, and there is nothing of it to read or book; a run's has none.)
    if parted and pk ~= '' and not run then
      pl = overrides[pk] or plimits
      -- An operator's override of the partition (leaky's library) wins.
      pl = leaky_partition_override(bucket, pk) or pl
      if #pl > 0 then
        part = leaky_partition(bucket, pk, pl, now)
        pslot = leaky_partition_earliest(part, costs, now)
      end
    end
    if pslot > now and pslot > su then
      -- Not this partition's turn yet. It is taken when its slot comes
      -- before the upstream's own (or with it), not booked ahead of it:
      -- booking the upstream at a partition's later slot would leave the
      -- upstream idle until then.
      rescore(rv, pslot)
      parked[g] = pslot
      if parts_live and #call_marks(pk) > 0 then job_mark(pk, fk, part_vt(pk, fk), pslot + CALL_MARK) end
      parks = parks + 1
      if parks >= 200 then stop, more = true, true end
      break
    end
    if part and parts_live and #call_marks(pk) > 0 and
        call_behind(call_marks(pk), fk, part_vt(pk, fk), 1 / (weights[fk] or 1)) then
      -- A call of a key this one is ahead of waits for this partition:
      -- the partition's next slot is the call's, and its jobs wait until
      -- the one after (unless the partition has room for both by the
      -- upstream's own slot).
      local h = after_one(part, pslot, costs, now)
      if h > now and h > su then
        rescore(rv, h)
        parked[g] = h
        job_mark(pk, fk, part_vt(pk, fk), h + CALL_MARK)
        parks = parks + 1
        if parks >= 200 then stop, more = true, true end
        break
      end
    end
    if bucket.conc > 0 then
      local lw = leaky_lease_wait(bucket, id, now)
      if lw then
        out[2], out[3] = lw, 3
        stop = true
        break
      end
    end
    local hole = holes and hole_at(fk, s1, 1 / (weights[fk] or 1), su)
    if hole then
      -- A call its partition holds comes back for this slot (or an
      -- earlier one), and its key is behind: the upstream's slot then is
      -- the call's, and the take books none from there on until it has
      -- (it comes back then).
      out[2], out[3] = math.max(CALL_YIELD, hole - now), 1
      stop = true
      break
    end
    if calls_live then
      cur_lk, cur_lv = lk, lv
      if call_ahead(calls, fk, s1, 1 / (weights[fk] or 1)) or call_lane_first(P, nil, fk, lane, s2, lane_at, s2, now, call_lanes) then
        -- A key whose calls wait is behind, or a call of this key waits in
        -- a lane not ahead of this job's: the call gets the slot.
        out[2], out[3] = CALL_YIELD, 1
        stop = true
        break
      end
    end
    local slot = su
    if pslot > slot then slot = pslot end
    leaky_book(bucket, slot, costs, id)
    if part then
      leaky_partition_book(part, slot, costs)
      if parts_live and #call_marks(pk) > 0 then
        local v = part_vt(pk, fk) + 1 / (weights[fk] or 1)
        jobs_vt[pk][fk] = v
        job_mark(pk, fk, v, math.max(slot, leaky_partition_earliest(part, NONE, now)) + CALL_MARK)
      end
    end
    -- The job leaves its flow for asynq's active list (the flow's ZREM
    -- comes after the loop).
    local at = fl.at + 1
    fl.at = at
    local nxt = fl.ids[at]
    if nxt == nil then
      redis.call('SREM', A .. 'groups', g)
      drop_first(rk, rv)
      parked[g] = nil
      if not gone then gone = {} end
      gone[#gone + 1] = g
      run = false
    elseif run then
      -- (A run's partition moves to now, and, sole, stays as it is.)
    else
      -- The partition can go again when its limits allow its next job's
      -- costs (a job without a limit's cost is not held by it).
      local e = now
      if part then
        -- (Limits that count requests alone need not read its costs.)
        local nc = NONE
        if named(pl) then nc = costs_of(redis.call('HGET', T .. nxt, 'sc')) end
        e = leaky_partition_earliest(part, nc, now)
      end
      rescore(rv, e)
      -- (Parked: held past the upstream's own next slot, not only past
      -- now.)
      if e > now and e > leaky_earliest(bucket, NONE, now) then parked[g] = e end
      run = part == nil and fv.sole and lv.sole and rv.sole
    end
    -- To asynq's active state; the list, the leases and the counters are
    -- written once for the whole take, below.
    -- (Its group field goes empty, not away, in the same write: asynq
    -- reads "" as no group.)
    redis.call('HSET', tk, 'state', 'active', 'group', '')
    taken = taken + 1
    went[taken] = id
    went_lane[lane] = (went_lane[lane] or 0) + 1
    -- Fair share: the key and the lane each move on by 1/weight (written
    -- once, below; a sole one's stays).
    if not fv.sole then rescore(fv, s1 + 1 / (weights[fk] or 1)) end
    if not lv.sole then rescore(lv, s2 + 1 / (lweights[lane] or 1)) end
    local o = #out
    out[o + 1], out[o + 2], out[o + 3] = id, msg, slot - now
  until true
end
if not stop and taken < max_jobs and steps >= 2000 then more = true end
for key, v in pairs(views) do
  if v and (v.dirty or v.rm) then flush(key, v) end
end
if cal_z then redis.call('ZADD', K_CAL, unpack(cal_z)) end
if jm then
  local pttl = math.ceil((horizon - now + CALL_MARK) / 1000) + 60000
  for pk, ks in pairs(jm) do
    for fk, e in pairs(ks) do
      part_mark(P, true, pk, fk, e[2], string.format('%d', e[1]), pttl)
    end
  end
  part_lapse(P, now, true)
end
if kv_z or kl_z then
  -- (Kept as long as the calendar's entries may wait: a day past them.)
  local last = 0
  for i = 1, #cal_z, 2 do
    if cal_z[i] > last then last = cal_z[i] end
  end
  local pttl = math.ceil((last - now) / 1000) + 86400000
  -- (Never shortened: an earlier take's entries may wait longer.)
  local function keep(k, z)
    redis.call('ZADD', k, unpack(z))
    if redis.call('PTTL', k) < pttl then redis.call('PEXPIRE', k, pttl) end
  end
  if kv_z then keep(P .. 'kv', kv_z) end
  if kl_z then
    for fk, z in pairs(kl_z) do keep(P .. 'kl:' .. fk, z) end
  end
end
local K_PK = P .. 'pk'
if gone then redis.call('ZREM', K_PK, unpack(gone)) end
if next(parked) then
  local z = {}
  for pg, t in pairs(parked) do
    z[#z + 1] = string.format('%d', t)
    z[#z + 1] = pg
  end
  redis.call('ZADD', K_PK, unpack(z))
end
local K_LEASE = A .. 'lease'
if taken > 0 then
  redis.call('LPUSH', A .. 'active', unpack(went))
  -- (Unix seconds, written once for all.)
  local lease_at = string.format('%d', math.floor(now / 1000000) + tonumber(ARGV[5]))
  local z = {}
  for i = 1, taken do
    z[2 * i - 1], z[2 * i] = lease_at, went[i]
  end
  redis.call('ZADD', K_LEASE, unpack(z))
  for l, n in pairs(went_lane) do
    if n == 1 then
      count(K_COUNTS, 'pending:' .. l, '-1')
      count(K_COUNTS, 'active:' .. l, '1')
    else
      count(K_COUNTS, 'pending:' .. l, -n)
      count(K_COUNTS, 'active:' .. l, n)
    end
  end
end
-- The taken jobs leave their flows last, once they are in the active list
-- and leased: a write refused part way (a key of the slot moved away while
-- a Cluster reshards) leaves a job in both, taken again, never in neither.
for _, f in pairs(flows) do
  local n = f.rank + f.at - 1
  if n == 1 then
    redis.call('ZREMRANGEBYRANK', f.key, '0', '0')
  elseif n > 1 then
    redis.call('ZREMRANGEBYRANK', f.key, '0', n - 1)
  end
end

leaky_commit(bucket, now)

-- When does something else come due?
local due = -1
if look or taken < max_jobs then
  -- (What forward_due read still stands unless something of it moved.)
  if not forward_due then space, forward_due, due_firsts, first_score = take_forward() end
  if firsts == nil then firsts = due_firsts(K_SCHED, K_RETRY, K_CAL) end
  for _, name in ipairs({'scheduled', 'retry'}) do
    local first = firsts[name]
    if first == nil then first = first_score(A .. name) end
    if first then
      local t = math.max(0, math.floor(first * 1000000) - now)
      if due < 0 or t < due then due = t end
    end
  end
  local cal = firsts.cal
  if cal == nil then cal = first_score(K_CAL) end
  if cal then
    local t = math.max(0, cal - now)
    if due < 0 or t < due then due = t end
  end
  local lease = redis.call('ZRANGE', K_LEASE, '0', '0', 'WITHSCORES')
  if #lease > 0 then
    local exp = tonumber(lease[2]) * 1000000
    if exp <= now then
      out[5] = 1
    elseif due < 0 or exp - now < due then
      due = exp - now
    end
  end
end
if more then due = 0 end
out[4] = due
if taken == 0 and out[2] < 0 and not more then
  -- Nothing can go now: the next enqueue wakes the workers.
  redis.call('HSET', P .. 'v', 'sleep', '1')
end
return out
