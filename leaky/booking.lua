-- booking.lua: a library through which a script of another package books
-- send slots on a bucket in the same call as its own work (the job store's
-- take books each job's slot as it takes the job). Needs script.Prelude,
-- gcra's library, the dyn library's loader (leaky_dyn: shaper_dyn_read,
-- shaper_dyn_interval, shaper_stated) and LEAKY_MAX_STATED before it; Go
-- puts them together (BookingLua). The bucket's KEYS and ARGV are laid out by
-- Bucket.BookingKeys and Bucket.BookingArgs, a partition's limits by
-- Bucket.PartitionArgs; the caller places them where it likes and passes
-- the indices. It defines:
--
--   leaky_open(keys, k, args, a, now) -> b, a2: the bucket whose KEYS start
--     at keys[k] (one TAT per limit) and whose ARGV start at args[a]
--     (concurrency, lease µs past the slot, the bucket's key prefix, the
--     partitions' overrides hash or "" for none, n, n × (interval,
--     capacity, per µs, and "" for a limit of requests, fixed and in force,
--     else "COST FIELD UPTO": its cost name or "", its dyn field or "", µs
--     from which it is no longer enforced or 0: a draining limit's end),
--     the count of operators' changes the limits follow), its limits as
--     paced now; a2 is the ARGV index after the bucket's. The keys a
--     booking reads only in some cases (the block hash, the leases, the dyn
--     hash, the stated limits' TATs, the partitions' TATs) are named from
--     the prefix as the Bucket's key functions name them: a script call
--     pays for every argument it is passed, read or not. Limits that
--     follow an older count than the dyn hash's 'n' (an operator changed
--     them since, see Bucket.PutLimits) are stale: leaky_earliest then
--     answers reason 5 and no slot, and the caller reads the limits again.
--     b.lim holds the limits ({interval, capacity, per, cost, key, tat,
--     off}: off true for a draining limit whose drain ended), the
--     configured ones first, in order; b.named is whether one of those
--     counts a cost by name (so a caller without named costs of its own
--     need not read a send's costs)
--     leaky_open(keys, k, args, a, now, also, probe) -> b, a2, vals, none
--     also reads the string keys named in the list also, in the same MGET
--     as the limits' TATs, vals holding their values in order (false:
--     none); and asks whether any key of the list probe exists in the same
--     EXISTS as the bucket's own: none is true when none of those exists,
--     else the caller looks itself
--   leaky_limits(args, a) -> limits, a2: a partition's limits at args[a]
--     (k, k × (id, interval, capacity, per µs, cost name))
--   leaky_cost(l, costs) -> what a send of costs counts in limit l
--   leaky_earliest(b, costs, now) -> slot µs, reason (0 none, 1 a limit, 2
--     the block, 5 stale limits: a slot 2^40 µs away): the bucket's
--     earliest slot for a send of costs (name -> n; a limit without a cost
--     name counts 1)
--   leaky_lease_wait(b, lease, now) -> nil if lease may be held (no
--     concurrency cap, held already, or room), else µs until one ends
--   leaky_book(b, slot, costs, lease) books the slot on every limit and,
--     with a concurrency cap, holds lease until the slot plus its lifetime
--   leaky_partition_override(b, pk) -> partition pk's own limits as an
--     operator set them (Bucket.PutPartitionLimits), or nil: one HGET of
--     the overrides hash per partition and call, none on a bucket without
--     overrides
--   leaky_partition(b, pk, limits, now) -> p: partition pk's state under
--     limits ({} for none); each TAT is read once per b, however many
--     times its partition is met (a take's jobs, a batch of calls)
--   leaky_partition_earliest(p, costs, now) -> slot µs for the partition
--   leaky_partition_book(p, slot, costs) books it, on b
--   leaky_commit(b, now) writes what leaky_book and leaky_partition_book
--     changed, each TAT once, with its TTL from now
local function leaky_cost(l, costs)
  if l.cost == '' then return 1 end
  return costs[l.cost] or 0
end

local function leaky_open(keys, k, args, a, now, also, probe)
  local n = tonumber(args[a + 4])
  local pre = args[a + 2]
  -- (A table costs Redis for every field it is built with, and more for
  -- one added later: b has those every booking reads; the concurrency
  -- cap's, the partitions' are added where there are such.)
  local b = {prefix = pre, lim = {}, conc = 0, pov = args[a + 3], blocked = 0, stale = false, named = false,
    changed = false}
  if args[a] ~= '0' then
    b.conc, b.lease_ttl, b.leases, b.lease_expiry = tonumber(args[a]), tonumber(args[a + 1]), pre .. 'leases', 0
  end
  -- Neither the dyn hash nor the block exists unless the upstream stated
  -- limits, pushed back, was paused, adapted or had its limits changed:
  -- one EXISTS tells (and of the caller's probe keys too), and spares
  -- reading either.
  local dkey, block = pre .. 'dyn', pre .. 'block'
  local dyn, shaper_dyn_read, shaper_dyn_interval, shaper_stated
  local found, own
  if probe then
    found = redis.call('EXISTS', dkey, block, unpack(probe))
    own = found
    -- (Where the probe's keys exist, as a calendar or a retry set may for
    -- long, one more EXISTS spares the reads of what does not.)
    if found > 0 then own = redis.call('EXISTS', dkey, block) end
  else
    found = redis.call('EXISTS', dkey, block)
    own = found
  end
  if own > 0 then
    shaper_dyn_read, shaper_dyn_interval, shaper_stated = leaky_dyn()
    dyn = shaper_dyn_read(dkey)
    b.blocked = tonumber(redis.call('HGET', block, 'until') or '0')
  end
  a = a + 5
  local lim, reads = b.lim, {}
  for i = 1, n do
    local l = {interval = tonumber(args[a]), capacity = tonumber(args[a + 1]), per = tonumber(args[a + 2]),
      cost = '', key = keys[k + i - 1], tat = 0}
    -- (Most limits count requests, fixed and for good: "".)
    local x = args[a + 3]
    if x ~= '' then
      local cost, field, upto = string.match(x, '^([^ ]*) ([^ ]*) (%d+)$')
      l.cost = cost
      if cost ~= '' then b.named = true end
      if dyn and field ~= '' then l.interval = shaper_dyn_interval(dyn, field, l.interval, now) end
      -- A draining limit whose drain has ended (on this clock) holds nothing.
      if upto ~= '0' and now >= tonumber(upto) then l.off = true end
    end
    if not l.off then reads[#reads + 1] = l.key end
    lim[i] = l
    a = a + 4
  end
  if dyn then
    -- The change of limits these follow; nothing is booked under older ones.
    b.stale = dyn.n ~= nil and tonumber(dyn.n) ~= tonumber(args[a])
    for s = 1, LEAKY_MAX_STATED do
      local iv, cap, pr = shaper_stated(dyn, s)
      if iv then
        local key = pre .. 'tat:stated' .. s
        lim[#lim + 1] = {interval = iv, capacity = cap, per = pr, cost = '', key = key, tat = 0}
        reads[#reads + 1] = key
      end
    end
  end
  a = a + 1
  local nl = #reads
  if also then
    for i = 1, #also do reads[nl + i] = also[i] end
  end
  local got = {}
  if #reads > 0 then
    local vals = redis.call('MGET', unpack(reads))
    local j = 0
    for i = 1, #lim do
      local l = lim[i]
      if not l.off then
        j = j + 1
        if vals[j] then l.tat = tonumber(vals[j]) end
      end
    end
    for i = nl + 1, #reads do got[i - nl] = vals[i] end
  end
  if b.conc > 0 then
    redis.call('ZREMRANGEBYSCORE', b.leases, '-inf', now)
  end
  return b, a, got, found == own
end

local function leaky_limits(args, a)
  local out = {}
  local cnt = tonumber(args[a])
  a = a + 1
  for i = 1, cnt do
    out[i] = {id = args[a], interval = tonumber(args[a + 1]), capacity = tonumber(args[a + 2]),
      per = tonumber(args[a + 3]), cost = args[a + 4]}
    a = a + 5
  end
  return out, a
end

local function leaky_earliest(b, costs, now)
  if b.stale then return now + 1099511627776, 5 end
  local slot, why = now, 0
  if b.blocked > slot then slot, why = b.blocked, 2 end
  local lim = b.lim
  for i = 1, #lim do
    local l = lim[i]
    if not l.off then
      local c = 1
      if l.cost ~= '' then c = costs[l.cost] or 0 end
      local at = gcra_earliest(l.tat, now, l.interval, l.capacity, c)
      if at > slot then slot, why = at, 1 end
    end
  end
  return slot, why
end

local function leaky_lease_wait(b, lease, now)
  if b.conc <= 0 or redis.call('ZSCORE', b.leases, lease) ~= false or redis.call('ZCARD', b.leases) < b.conc then
    return nil
  end
  local oldest = redis.call('ZRANGE', b.leases, '0', '0', 'WITHSCORES')
  return math.max(0, tonumber(oldest[2]) - now)
end

local function leaky_book(b, slot, costs, lease)
  local lim = b.lim
  for i = 1, #lim do
    local l = lim[i]
    if not l.off then
      local c = 1
      if l.cost ~= '' then c = costs[l.cost] or 0 end
      l.tat = gcra_take(l.tat, slot, l.interval, c)
    end
  end
  b.changed = true
  if b.conc > 0 then
    local exp = slot + b.lease_ttl
    redis.call('ZADD', b.leases, exp, lease)
    if exp > b.lease_expiry then b.lease_expiry = exp end
  end
end

local function leaky_partition_override(b, pk)
  if b.pov == '' or pk == '' then return nil end
  local cache = b.pcache
  if not cache then
    cache = {}
    b.pcache = cache
  end
  local c = cache[pk]
  if c == nil then
    c = false
    local v = redis.call('HGET', b.pov, pk)
    if v then
      c = {}
      for id, iv, cap, per, cost in string.gmatch(v, '([^%s,]+) (%d+) (%d+) (%d+) ([^%s,]+) %d+ %d+') do
        if cost == '-' then cost = '' end
        c[#c + 1] = {id = id, interval = tonumber(iv), capacity = tonumber(cap), per = tonumber(per), cost = cost}
      end
    end
    cache[pk] = c
  end
  return c or nil
end

-- (b.pt: the partitions' TATs read so far, key -> {tat, per, dirty}.)
local function leaky_partition(b, pk, limits, now)
  local p = {lim = limits, tat = {}, key = {}}
  if #limits == 0 then return p end
  local pt = b.pt
  if not pt then
    pt = {}
    b.pt = pt
  end
  p.pt = pt
  for j = 1, #limits do
    local key = b.prefix .. 'p:' .. pk .. ':' .. limits[j].id
    local c = pt[key]
    if not c then
      local v = redis.call('GET', key)
      c = {tat = 0, dirty = false}
      if v then c.tat = tonumber(v) end
      pt[key] = c
    end
    p.key[j], p.tat[j] = key, c.tat
  end
  return p
end

local function leaky_partition_earliest(p, costs, now)
  local slot, lim = now, p.lim
  for j = 1, #lim do
    local l = lim[j]
    local c = 1
    if l.cost ~= '' then c = costs[l.cost] or 0 end
    local at = gcra_earliest(p.tat[j], now, l.interval, l.capacity, c)
    if at > slot then slot = at end
  end
  return slot
end

local function leaky_partition_book(p, slot, costs)
  local lim = p.lim
  for j = 1, #lim do
    local l = lim[j]
    local c = 1
    if l.cost ~= '' then c = costs[l.cost] or 0 end
    local t = gcra_take(p.tat[j], slot, l.interval, c)
    p.tat[j] = t
    local e = p.pt[p.key[j]]
    e.tat, e.per, e.dirty = t, l.per, true
  end
end

-- (A TAT is µs, whole and below 2^53: %d writes it exactly, for less than
-- shaper_int's %.0f or Redis's own %.17g of a number.)
local function leaky_commit(b, now)
  if b.changed then
    local lim = b.lim
    for i = 1, #lim do
      local l = lim[i]
      if not l.off then
        redis.call('SET', l.key, string.format('%d', l.tat), 'PX', math.ceil((l.tat - now + l.per) / 1000))
      end
    end
  end
  if b.pt then
    for key, e in pairs(b.pt) do
      if e.dirty then
        redis.call('SET', key, string.format('%d', e.tat), 'PX', math.ceil((e.tat - now + e.per) / 1000))
      end
    end
  end
  if b.conc > 0 and b.lease_expiry > 0 then
    local ttl = math.ceil((b.lease_expiry - now) / 1000) + 1000
    if redis.call('PTTL', b.leases) < ttl then
      redis.call('PEXPIRE', b.leases, ttl)
    end
  end
end
