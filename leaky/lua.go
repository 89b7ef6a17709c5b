package leaky

import (
	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
)

// Reason codes shared by the scripts and the Go model. Every script that
// answers a reason, this package's or another's through BookingLua, uses
// these numbers: 4 is ReasonPartition, 6 ReasonTurn (the job store's
// call_turn.lua); a new one takes the next free number.
const (
	codeNone        = 0
	codeLimit       = 1
	codeBlocked     = 2
	codeConcurrency = 3
	codeStale       = 5
	codeTurn        = 6
)

// reserveScript books send slots for one or more reservations on a bucket,
// in order, each for every limit of the bucket at once, honouring a
// fleet-wide block and an optional concurrency lease. A reservation that does
// not fit within its max wait books nothing. Concurrent callers in one
// process share a call (see Bucket.Reserve); they all see one "now".
//
//	KEYS[1] -> block hash {until=µs, reason=text}
//	KEYS[2] -> in-flight leases, a sorted set of lease id -> expiry µs
//	KEYS[3..2+n] -> one TAT string per limit
//	KEYS[3+n] -> the dyn hash (see dynLua), then MaxStated stated-limit TATs
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//	ARGV[2] -> lease lifetime µs, counted from the slot
//	ARGV[3] -> concurrency limit
//	ARGV[4] -> n, the number of limits
//	ARGV[5+5i .. 9+5i] -> limit i: interval µs, capacity, per µs, dyn field
//	  ("" fixed), and µs from which it is no longer enforced (0 never: a
//	  draining limit's drain ends on Redis's clock)
//	ARGV[5+5n] -> the count of operators' changes the limits follow
//	then per reservation: max wait µs, lease id ("" = none), cost of each limit
//
// Stated limits count one per reservation; their TATs are booked like the
// others' but not reported, so Cancel leaves them booked.
//
// Limits that follow an older count than the dyn hash's 'n' (an operator
// changed them since) book nothing: every reply is {0, 0, 5, 0, now}, and
// the caller reads the limits again.
//
// Returns one reply per reservation: {ok, wait, reason, limit, now, prev_1,
// next_1, ..., prev_n, next_n}. ok is 1 when booked; wait is the delay until
// the slot (ok) or how long until trying again can succeed (not ok); reason
// says what set the slot or refused it (0 none, 1 a limit, 2 the block, 3
// concurrency); limit is the 1-based limit that bound the slot; prev_i and
// next_i are the TATs before and after (prev 0 when there was none), for
// giving the slot back.
var reserveScript = script.New(gcra.LuaFunctions, dynLua, `
local now = shaper_now(ARGV[1])
local lease_ttl = tonumber(ARGV[2])
local concurrency = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local interval, capacity, per, tat, changed, key, off = {}, {}, {}, {}, {}, {}, {}
local dyn = shaper_dyn_read(KEYS[3 + n])
for i = 1, n do
  local b = 5 + 5 * (i - 1)
  interval[i] = shaper_dyn_interval(dyn, ARGV[b + 3], tonumber(ARGV[b]), now)
  capacity[i] = tonumber(ARGV[b + 1])
  per[i] = tonumber(ARGV[b + 2])
  key[i] = KEYS[i + 2]
  local upto = tonumber(ARGV[b + 4])
  off[i] = upto > 0 and now >= upto
  tat[i] = 0
  if not off[i] then tat[i] = tonumber(redis.call('GET', key[i]) or '0') end
end
-- The limits the upstream stated, after the configured ones.
local all = n
for s = 1, #KEYS - 3 - n do
  local iv, cap, pr = shaper_stated(dyn, s)
  if iv then
    all = all + 1
    interval[all], capacity[all], per[all] = iv, cap, pr
    key[all] = KEYS[3 + n + s]
    tat[all] = tonumber(redis.call('GET', key[all]) or '0')
  end
end
local function unit_cost(base, i)
  if i > n then return 1 end
  return tonumber(ARGV[base + 1 + i])
end
local replies = {}
local start = 6 + 5 * n
local stride = 2 + n
if dyn.n ~= nil and tonumber(dyn.n) ~= tonumber(ARGV[5 + 5 * n]) then
  for base = start, #ARGV, stride do
    replies[#replies + 1] = {0, 0, 5, 0, now}
  end
  return replies
end
local blocked = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
local pruned = false
local last_expiry = 0
for base = start, #ARGV, stride do
  local max_wait = tonumber(ARGV[base])
  local lease = ARGV[base + 1]
  local slot, reason, binding = now, 0, 0
  if blocked > slot then
    slot, reason = blocked, 2
  end
  for i = 1, all do
    if not off[i] then
      local at = gcra_earliest(tat[i], now, interval[i], capacity[i], unit_cost(base, i))
      if at > slot then
        slot, reason, binding = at, 1, i
      end
    end
  end
  local out = {0, 0, reason, binding, now}
  local ok = slot - now <= max_wait
  if not ok then
    out[2] = slot - now - max_wait
  elseif lease ~= '' then
    if not pruned then
      redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
      pruned = true
    end
    if redis.call('ZSCORE', KEYS[2], lease) == false and redis.call('ZCARD', KEYS[2]) >= concurrency then
      local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
      out[2], out[3], out[4] = tonumber(oldest[2]) - now, 3, 0
      ok = false
    else
      local expiry = slot + lease_ttl
      redis.call('ZADD', KEYS[2], expiry, lease)
      if expiry > last_expiry then last_expiry = expiry end
    end
  end
  if ok then
    for i = 1, all do
      if off[i] then
        -- (Only a limit of the caller's is off.)
        out[#out + 1] = 0
        out[#out + 1] = 0
      else
        local nxt = gcra_take(tat[i], slot, interval[i], unit_cost(base, i))
        if i <= n then
          out[#out + 1] = tat[i]
          out[#out + 1] = nxt
        end
        tat[i] = nxt
        changed[i] = true
      end
    end
    out[1], out[2] = 1, slot - now
  end
  replies[#replies + 1] = out
end

for i = 1, all do
  if changed[i] then
    redis.call('SET', key[i], shaper_int(tat[i]), 'PX', math.ceil((tat[i] - now + per[i]) / 1000))
  end
end
if last_expiry > 0 then
  local ttl = math.ceil((last_expiry - now) / 1000) + 1000
  if redis.call('PTTL', KEYS[2]) < ttl then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end
return replies
`)

// cancelScript gives back a reservation that was not used. A limit's TAT is
// restored only if no later reservation moved it; otherwise that limit keeps
// the slot, because handing it back would let a newer reservation's send
// land beside an older one's. Once the slot has begun nothing is restored:
// the send may already count in some window.
//
//	KEYS[1] -> in-flight leases sorted set
//	KEYS[2..] -> one TAT string per limit
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//	ARGV[2] -> lease id ("" = none)
//	ARGV[3] -> the slot in µs
//	ARGV[4+3i .. 6+3i] -> limit i: TAT before the reservation (0 = none), TAT after it, per µs
//
// Returns the number of limits whose TAT was restored.
var cancelScript = script.New(`
local now = shaper_now(ARGV[1])
if ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[1], ARGV[2])
end
if now >= tonumber(ARGV[3]) then
  return 0
end
local restored = 0
for i = 1, #KEYS - 1 do
  local base = 4 + 3 * (i - 1)
  local prev = tonumber(ARGV[base])
  local next_tat = ARGV[base + 1]
  local per = tonumber(ARGV[base + 2])
  if redis.call('GET', KEYS[i + 1]) == next_tat then
    if prev > now then
      redis.call('SET', KEYS[i + 1], shaper_int(prev), 'PX', math.ceil((prev - now + per) / 1000))
    else
      redis.call('DEL', KEYS[i + 1])
    end
    restored = restored + 1
  end
end
return restored
`)

// blockScript blocks every reservation on a bucket until a time, keeping a
// later block if one is already in place, and announces the block so that
// workers holding slots booked before it hold off too.
//
//	KEYS[1] -> block hash {until=µs, reason=text}
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//	ARGV[2] -> block duration µs (> 0)
//	ARGV[3] -> reason
//	ARGV[4] -> announcement channel
//	ARGV[5] -> bucket name
//
// Returns {until µs, now µs}: the block in force after the call.
var blockScript = script.New(`
local now = shaper_now(ARGV[1])
local want = now + tonumber(ARGV[2])
local cur = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
if cur >= want then
  return {cur, now}
end
redis.call('HSET', KEYS[1], 'until', shaper_int(want), 'reason', ARGV[3])
-- Never shorter than it was: a bare pushback's memory may outlive the block.
local ttl = math.ceil((want - now) / 1000) + 1
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
redis.call('PUBLISH', ARGV[4], ARGV[5] .. ' ' .. shaper_int(want))
return {want, now}
`)

// unblockScript lifts a block and announces it.
//
//	KEYS[1] -> block hash
//	ARGV[1] -> announcement channel
//	ARGV[2] -> bucket name
//
// Returns 1 if a block was lifted.
var unblockScript = script.New(`
redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' 0')
return redis.call('DEL', KEYS[1])
`)

// releaseScript ends concurrency leases early, when their sends are done.
// Concurrent releases in one process share a call.
//
//	KEYS[1] -> in-flight leases sorted set
//	ARGV[1..] -> lease ids
//
// Returns how many of them were held (the others had already expired).
var releaseScript = script.New(`
return redis.call('ZREM', KEYS[1], unpack(ARGV))
`)

// extendScript moves a held lease's expiry, for holders that run longer
// than they reserved for.
//
//	KEYS[1] -> in-flight leases sorted set
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//	ARGV[2] -> lease id
//	ARGV[3] -> new lifetime µs from now
//
// Returns 1 if extended, 0 if the lease had expired (its holder must stop).
var extendScript = script.New(`
local now = shaper_now(ARGV[1])
local cur = redis.call('ZSCORE', KEYS[1], ARGV[2])
if cur == false or tonumber(cur) <= now then
  return 0
end
local expiry = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], expiry, ARGV[2])
local ttl = math.ceil((expiry - now) / 1000) + 1000
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
`)

// stateScript reads a bucket without changing it, for status displays.
//
//	KEYS[1] -> block hash
//	KEYS[2] -> in-flight leases sorted set
//	KEYS[3..] -> one TAT string per limit, then the dyn hash
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//
// Returns {now, blocked until (0 none), block reason, leases in flight,
// dyn hash fields as a flat list, tat_1, ..., tat_n}.
var stateScript = script.New(`
local now = shaper_now(ARGV[1])
local out = {now}
out[2] = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
out[3] = redis.call('HGET', KEYS[1], 'reason') or ''
out[4] = redis.call('ZCOUNT', KEYS[2], '(' .. shaper_int(now), '+inf')
out[5] = redis.call('HGETALL', KEYS[#KEYS])
for i = 3, #KEYS - 1 do
  out[#out + 1] = tonumber(redis.call('GET', KEYS[i]) or '0')
end
return out
`)

// partitionReserveScript books one send slot on a bucket and on one
// partition's limits beside it (the partition TATs the job store's take
// books, see PartitionTAT), for a caller that waits for its slot itself
// (a proxied call). A partition that cannot send now books nothing and
// answers when it can: booking the bucket at the partition's later slot
// would leave the bucket idle until then, as the take avoids too.
//
//	KEYS -> the bucket's BookingKeys
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//	ARGV[2] -> max wait µs
//	ARGV[3] -> lease id ("" = none)
//	ARGV[4..] -> the bucket's BookingArgs, then the partition's limits as
//	  PartitionArgs, then the partition, then c, c × (cost name, amount)
//
// Returns {ok, wait, reason, limit (always 0), now, prev_1, next_1, ...,
// prev_n, next_n, then prev and next of each partition limit} like
// reserveScript (reason 4: the partition's limits refused the slot).
var partitionReserveScript = script.New(gcra.LuaFunctions, BookingLua(), `
local now = shaper_now(ARGV[1])
local max_wait = tonumber(ARGV[2])
local lease = ARGV[3]
local b, a = leaky_open(KEYS, 1, ARGV, 4, now)
local n = tonumber(ARGV[8])
local plim
plim, a = leaky_limits(ARGV, a)
local pk = ARGV[a]
plim = leaky_partition_override(b, pk) or plim
local costs = {}
local nc = tonumber(ARGV[a + 1])
for i = 1, nc do
  costs[ARGV[a + 2 * i]] = tonumber(ARGV[a + 1 + 2 * i])
end
local part = leaky_partition(b, pk, plim, now)
local pslot = leaky_partition_earliest(part, costs, now)
if pslot > now then
  return {0, pslot - now, 4, 0, now}
end
local slot, why = leaky_earliest(b, costs, now)
if slot - now > max_wait then
  return {0, slot - now - max_wait, why, 0, now}
end
if lease ~= '' then
  local lw = leaky_lease_wait(b, lease, now)
  if lw then
    return {0, lw, 3, 0, now}
  end
end
local out = {1, slot - now, why, 0, now}
local prev, pprev = {}, {}
for i = 1, n do prev[i] = b.lim[i].tat end
for j = 1, #plim do pprev[j] = part.tat[j] end
leaky_book(b, slot, costs, lease)
leaky_partition_book(part, slot, costs)
leaky_commit(b, now)
for i = 1, n do
  out[#out + 1] = prev[i]
  out[#out + 1] = b.lim[i].tat
end
for j = 1, #plim do
  out[#out + 1] = pprev[j]
  out[#out + 1] = part.tat[j]
end
return out
`)
