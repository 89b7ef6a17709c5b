package tokenbucket

import (
	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
)

// allowScript decides one or more token-bucket requests, so requests
// gathered from concurrent callers share a round trip. Each bucket appears
// once in KEYS with all of its requests, decided in order; buckets are read
// with one MGET and each written at most once, after its last request. All
// buckets share one shape. A denied request writes nothing.
//
//	KEYS[i]   -> bucket i's TAT, integer µs as a string (absent: the bucket is full)
//	ARGV[1]   -> interval µs: how long one token takes to come back
//	ARGV[2]   -> capacity
//	ARGV[3]   -> now override in µs ("" = Redis TIME)
//	ARGV[3+i] -> the costs of bucket i's requests, in order, comma-separated
//
// Returns one integer per request, bucket by bucket and in order within a
// bucket: the bucket's level after the decision (its TAT minus now, in µs),
// positive when the request was allowed and negated when it was denied. A
// level of zero cannot occur: an allowed request adds at least one
// interval, and a denied one meets a bucket with less room than its cost.
// Every header input follows from it and the cost (see decode).
//
// Integers are written with '%d' rather than shaper_int's '%.0f': the same
// digits for every integer below 2^53 (Lua 5.1 formats '%d' from a 64-bit
// long), at a fraction of the cost of printing a double.
//
// A written key expires once its bucket would be full again (an absent key
// means exactly that), plus one interval and the rounding up to whole
// milliseconds, so expiry can never forget tokens that are still spent.
var allowScript = script.New(gcra.LuaFunctions, `
local interval = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now = shaper_now(ARGV[3])
local tats = redis.call('MGET', unpack(KEYS))
local out = {}
local n = 0
for i = 1, #KEYS do
  local tat = tonumber(tats[i] or '0') or 0
  if tat < now then tat = now end
  local took = false
  local costs = ARGV[3 + i]
  local cost = tonumber(costs)
  local iter
  if cost == nil then
    iter = string.gmatch(costs, '%d+')
    cost = tonumber(iter())
  end
  while cost do
    n = n + 1
    if gcra_earliest(tat, now, interval, capacity, cost) > now then
      out[n] = now - tat
    else
      tat = gcra_take(tat, now, interval, cost)
      took = true
      out[n] = tat - now
    end
    cost = nil
    if iter then
      local c = iter()
      if c then cost = tonumber(c) end
    end
  end
  if took then
    redis.call('SET', KEYS[i], string.format('%d', tat), 'PX', string.format('%d', shaper_idiv(tat - now + interval + 999, 1000)))
  end
end
return out
`)
