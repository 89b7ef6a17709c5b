-- booking.lua: a library through which a script of another package books
-- send slots on a bucket in the same call as its own work (the job store's
-- take books each job's slot as it takes the job). Needs script.Prelude,
-- gcra's library and the dyn library (shaper_dyn_*) before it; Go puts them
-- together (BookingLua). The bucket's KEYS and ARGV are laid out by
-- Bucket.BookingKeys and Bucket.BookingArgs, a partition's limits by
-- Bucket.PartitionArgs; the caller places them where it likes and passes
-- the indices. It defines:
--
--   leaky_open(keys, k, args, a, now) -> b, a2: the bucket whose KEYS start
--     at keys[k] (block hash, leases, one TAT per limit, the dyn hash, the
--     stated limits' TATs: the rest of KEYS) and whose ARGV start at
--     args[a] (concurrency, lease µs past the slot, the partition TAT
--     prefix, the partitions' overrides hash or "" for none, n, n ×
--     (interval, capacity, per µs, cost name, dyn field)),
--     its limits as paced now; a2 is the ARGV index after the bucket's.
--     leaky_open(keys, k, args, a, now, also) -> b, a2, vals also reads the
--     string keys named in the list also, in the same MGET as the limits'
--     TATs, vals holding their values in order (false: none)
--   leaky_limits(args, a) -> limits, a2: a partition's limits at args[a]
--     (k, k × (id, interval, capacity, per µs, cost name))
--   leaky_earliest(b, costs, now) -> slot µs, reason (0 none, 1 a limit, 2
--     the block): the bucket's earliest slot for a send of costs (name ->
--     n; a limit without a cost name counts 1)
--   leaky_lease_wait(b, lease, now) -> nil if lease may be held (no
--     concurrency cap, held already, or room), else µs until one ends
--   leaky_book(b, slot, costs, lease) books the slot on every limit and,
--     with a concurrency cap, holds lease until the slot plus its lifetime
--   leaky_partition_override(b, pk) -> partition pk's own limits as an
--     operator set them (Bucket.PutPartitionLimits), or nil: one HGET of
--     the overrides hash per partition and call, none on a bucket without
--     overrides
--   leaky_partition(b, pk, limits, now) -> p: partition pk's state under
--     limits ({} for none)
--   leaky_partition_earliest(p, costs, now) -> slot µs for the partition
--   leaky_partition_book(p, slot, costs, now) books it (written at once)
--   leaky_commit(b, now) writes what leaky_book changed
local function leaky_cost(l, costs)
  if l.cost == '' then return 1 end
  return costs[l.cost] or 0
end

local function leaky_open(keys, k, args, a, now, also)
  local b = {block = keys[k], leases = keys[k + 1], lim = {}, changed = false, lease_expiry = 0}
  b.conc = tonumber(args[a])
  b.lease_ttl = tonumber(args[a + 1])
  b.pprefix = args[a + 2]
  b.pov, b.pcache = args[a + 3], {}
  local n = tonumber(args[a + 4])
  a = a + 5
  local dyn = shaper_dyn_read(keys[k + 2 + n])
  for i = 1, n do
    local l = {interval = tonumber(args[a]), capacity = tonumber(args[a + 1]), per = tonumber(args[a + 2]),
      cost = args[a + 3], key = keys[k + 1 + i]}
    l.interval = shaper_dyn_interval(dyn, args[a + 4], l.interval, now)
    b.lim[i] = l
    a = a + 5
  end
  for s = 1, #keys - (k + 2 + n) do
    local iv, cap, pr = shaper_stated(dyn, s)
    if iv then
      b.lim[#b.lim + 1] = {interval = iv, capacity = cap, per = pr, cost = '', key = keys[k + 2 + n + s]}
    end
  end
  local reads = {}
  for i, l in ipairs(b.lim) do reads[i] = l.key end
  local nl = #reads
  for _, key in ipairs(also or {}) do reads[#reads + 1] = key end
  local vals, got = {}, {}
  if #reads > 0 then vals = redis.call('MGET', unpack(reads)) end
  for i, l in ipairs(b.lim) do
    l.tat = tonumber(vals[i] or '0')
  end
  for i = nl + 1, #reads do got[#got + 1] = vals[i] end
  b.blocked = tonumber(redis.call('HGET', b.block, 'until') or '0')
  if b.conc > 0 then
    redis.call('ZREMRANGEBYSCORE', b.leases, '-inf', now)
  end
  return b, a, got
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
  local slot, why = now, 0
  if b.blocked > slot then slot, why = b.blocked, 2 end
  for _, l in ipairs(b.lim) do
    local at = gcra_earliest(l.tat, now, l.interval, l.capacity, leaky_cost(l, costs))
    if at > slot then slot, why = at, 1 end
  end
  return slot, why
end

local function leaky_lease_wait(b, lease, now)
  if b.conc <= 0 or redis.call('ZSCORE', b.leases, lease) ~= false or redis.call('ZCARD', b.leases) < b.conc then
    return nil
  end
  local oldest = redis.call('ZRANGE', b.leases, 0, 0, 'WITHSCORES')
  return math.max(0, tonumber(oldest[2]) - now)
end

local function leaky_book(b, slot, costs, lease)
  for _, l in ipairs(b.lim) do
    l.tat = gcra_take(l.tat, slot, l.interval, leaky_cost(l, costs))
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
  local c = b.pcache[pk]
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
    b.pcache[pk] = c
  end
  return c or nil
end

local function leaky_partition(b, pk, limits, now)
  local p = {lim = limits, tat = {}, key = {}}
  for j, l in ipairs(limits) do
    p.key[j] = b.pprefix .. pk .. ':' .. l.id
    p.tat[j] = tonumber(redis.call('GET', p.key[j]) or '0')
  end
  return p
end

local function leaky_partition_earliest(p, costs, now)
  local slot = now
  for j, l in ipairs(p.lim) do
    local at = gcra_earliest(p.tat[j], now, l.interval, l.capacity, leaky_cost(l, costs))
    if at > slot then slot = at end
  end
  return slot
end

local function leaky_partition_book(p, slot, costs, now)
  for j, l in ipairs(p.lim) do
    p.tat[j] = gcra_take(p.tat[j], slot, l.interval, leaky_cost(l, costs))
    redis.call('SET', p.key[j], shaper_int(p.tat[j]), 'PX', math.ceil((p.tat[j] - now + l.per) / 1000))
  end
end

local function leaky_commit(b, now)
  if b.changed then
    for _, l in ipairs(b.lim) do
      redis.call('SET', l.key, shaper_int(l.tat), 'PX', math.ceil((l.tat - now + l.per) / 1000))
    end
  end
  if b.lease_expiry > 0 then
    local ttl = math.ceil((b.lease_expiry - now) / 1000) + 1000
    if redis.call('PTTL', b.leases) < ttl then
      redis.call('PEXPIRE', b.leases, ttl)
    end
  end
end
