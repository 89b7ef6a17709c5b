package tokenbucket

import "github.com/redis/go-redis/v9"

// The scripts below do the arithmetic of internal/gcra (gcra.Allow) inline,
// on the bucket's level (its TAT minus now) rather than through the shared
// Lua helpers: the helpers are closures the script would build again on
// every call, and an admission decision is small enough for that to show.
// TestMatchesModel holds them to the Go model, bit for bit.
//
// Every value is an integer below 2^53 (gcra.MaxSpan bounds the level), so
// Lua's doubles are exact. TAT and TTL are written with '%d' (Lua 5.1
// formats it from a 64-bit long): the same digits as the model's, whatever
// way a Redis version turns a Lua number into a string. The TTL is
// ⌊(level + interval + 999) / 1000⌋ ms: the numerator is below 2^51, so the
// double quotient is within 2^-12 of the true one while a fraction short of
// an integer is at least 0.001 short, and math.floor is exact.
//
// A written key expires once its bucket would be full again (an absent key
// means exactly that), plus one interval and the rounding up to whole
// milliseconds, so expiry can never forget tokens that are still spent. A
// denied request writes nothing.
//
// Both return, per request, the bucket's level before the decision in µs:
// as it is (zero or more) when the request was allowed, negated when it was
// denied. A denied request meets a bucket with less room than its cost, and
// no cost exceeds the capacity, so its level is positive and the two cases
// never meet. Every header input follows from it and the cost (see decode).
// An allowed request on a full bucket, nearly every decision over a large
// key space, answers 0: fewer bytes, and an integer go-redis boxes without
// allocating.

// allowOneScript decides one request on one bucket: the lone caller's
// script, one GET and at most one SET.
//
//	KEYS[1] -> the bucket's TAT, integer µs as a string (absent: the bucket is full)
//	ARGV[1] -> interval µs: how long one token takes to come back
//	ARGV[2] -> capacity
//	ARGV[3] -> cost
//	ARGV[4] -> now override in µs (absent: Redis TIME)
//
// Returns the level before the decision as a plain integer.
var allowOneScript = redis.NewScript(`
local interval = tonumber(ARGV[1])
local now = ARGV[4]
if now then
  now = tonumber(now)
else
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local level = (tonumber(redis.call('GET', KEYS[1])) or now) - now
if level < 0 then level = 0 end
local after = level + tonumber(ARGV[3]) * interval
if after > tonumber(ARGV[2]) * interval then
  return -level
end
redis.call('SET', KEYS[1], string.format('%d', now + after), 'PX', string.format('%d', math.floor((after + interval + 999) / 1000)))
return level
`)

// allowScript decides the requests of a batch, so requests gathered from
// concurrent callers share a round trip. Each bucket appears once in KEYS
// with all of its requests, decided in order; buckets are read with one
// MGET and each written at most once, after its last request. All buckets
// share one shape.
//
//	KEYS[i]   -> bucket i's TAT, integer µs as a string (absent: the bucket is full)
//	ARGV[1]   -> interval µs
//	ARGV[2]   -> capacity
//	ARGV[3]   -> now override in µs ("" = Redis TIME)
//	ARGV[3+i] -> bucket i's requests: "c" for one of cost c, "-k" for k of
//	             cost 1, else their costs in order, comma-separated; absent
//	             for one request of cost 1 (so those buckets go last)
//
// Returns an array of one level per request (before that request's
// decision), bucket by bucket and in order within a bucket.
var allowScript = redis.NewScript(`
local interval = tonumber(ARGV[1])
local span = tonumber(ARGV[2]) * interval
local now = ARGV[3]
local call, format, floor = redis.call, string.format, math.floor
if now == '' then
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(now)
end
local tats = call('MGET', unpack(KEYS))
local out = {}
local n = 0
-- The last TAT and TTL written, and their strings: buckets decided alike
-- are written with the same values, which are then formatted once.
local lastTat, tatStr, lastTTL, ttlStr
local listed = #ARGV - 3
for i = 1, listed do
  local level = (tonumber(tats[i]) or now) - now
  if level < 0 then level = 0 end
  local took = false
  local reqs = ARGV[3 + i]
  local units, iter = 0, nil
  local cost = tonumber(reqs)
  if cost == nil then
    iter = string.gmatch(reqs, '%d+')
    cost = tonumber(iter())
  elseif cost < 0 then
    units, cost = -cost - 1, 1
  end
  while cost do
    n = n + 1
    local after = level + cost * interval
    if after > span then
      out[n] = -level
    else
      out[n] = level
      level = after
      took = true
    end
    if units > 0 then
      units = units - 1
    elseif iter then
      local c = iter()
      cost = c and tonumber(c)
    else
      cost = nil
    end
  end
  if took then
    local tat = now + level
    if tat ~= lastTat then
      lastTat, tatStr = tat, format('%d', tat)
    end
    local ttl = floor((level + interval + 999) / 1000)
    if ttl ~= lastTTL then
      lastTTL, ttlStr = ttl, format('%d', ttl)
    end
    call('SET', KEYS[i], tatStr, 'PX', ttlStr)
  end
end
-- The other buckets have one request of cost 1 each. A full one (absent,
-- nearly every bucket over a large key space) gives its token and is
-- written with the TAT and TTL every full bucket gets, formatted once.
local fullTat, fullTTL
for i = listed + 1, #KEYS do
  n = n + 1
  local tat = tats[i]
  local level = 0
  if tat then
    level = tonumber(tat) - now
    if level < 0 then level = 0 end
  end
  if level == 0 then
    out[n] = 0
    if not fullTat then
      fullTat, fullTTL = format('%d', now + interval), format('%d', floor((interval + interval + 999) / 1000))
    end
    call('SET', KEYS[i], fullTat, 'PX', fullTTL)
  elseif level + interval > span then
    out[n] = -level
  else
    out[n] = level
    level = level + interval
    call('SET', KEYS[i], format('%d', now + level), 'PX', format('%d', floor((level + interval + 999) / 1000)))
  end
end
return out
`)

// admitLua is the library through which a script of another package
// decides admission in its own call (see AdmitLua): allowScript's
// arithmetic on one request, on a bucket the caller reads (with the rest
// of its keys, in one MGET if it likes) and writes once after its last
// request. Needs nothing before it. It defines:
//
//	tb_admit(tat, now, interval, capacity, cost) -> level, tat2: the
//	  decision on a bucket whose TAT is tat (nil: none, the bucket is full)
//	  for cost tokens at now: level is the bucket's level before it, as
//	  the allow scripts answer it (negated when denied; Admission.Result
//	  reads it), tat2 the TAT after an allowed request (nil when denied),
//	  which the caller passes as tat to the bucket's next decision
//	tb_keep(key, tat, now, interval) writes a bucket's TAT, with the TTL
//	  the allow scripts give it: once it would be full again, plus one
//	  interval and the rounding up to whole milliseconds
const admitLua = `
local function tb_admit(tat, now, interval, capacity, cost)
  local level = (tat or now) - now
  if level < 0 then level = 0 end
  local after = level + cost * interval
  if after > capacity * interval then return -level end
  return level, now + after
end

local function tb_keep(key, tat, now, interval)
  redis.call('SET', key, string.format('%d', tat), 'PX', string.format('%d', math.floor((tat - now + interval + 999) / 1000)))
end
`
