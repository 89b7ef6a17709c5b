package tokenbucket

import (
	"github.com/shaperhq/shaper/internal/gcra"
	"github.com/shaperhq/shaper/internal/script"
)

// allowScript decides one or more token-bucket requests in order, so
// requests gathered from concurrent callers share a round trip. All buckets
// share one shape. A denied request writes nothing.
//
//	KEYS[i]   -> bucket i's TAT, integer µs as a string (absent: the bucket is full)
//	ARGV[1]   -> interval µs: how long one token takes to come back
//	ARGV[2]   -> capacity
//	ARGV[3]   -> now override in µs ("" = Redis TIME)
//	ARGV[3+i] -> cost of request i
//
// Returns 4 integers per request: allowed (1 or 0), remaining tokens,
// retry_after µs (0 when allowed), reset_after µs (until the bucket is full).
//
// A written key expires once its bucket would be full again (an absent key
// means exactly that), plus one interval and the rounding up to whole
// milliseconds, so expiry can never forget tokens that are still spent.
var allowScript = script.New(gcra.LuaFunctions, `
local interval = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now = shaper_now(ARGV[3])
local out = {}
for i = 1, #KEYS do
  local cost = tonumber(ARGV[3 + i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
  if tat < now then tat = now end
  local at = gcra_earliest(tat, now, interval, capacity, cost)
  local j = 4 * (i - 1)
  if at > now then
    out[j + 1] = 0
    out[j + 2] = gcra_remaining(tat, now, interval, capacity)
    out[j + 3] = at - now
    out[j + 4] = tat - now
  else
    local nxt = gcra_take(tat, now, interval, cost)
    local ttl_ms = shaper_idiv(nxt - now + interval + 999, 1000)
    redis.call('SET', KEYS[i], shaper_int(nxt), 'PX', shaper_int(ttl_ms))
    out[j + 1] = 1
    out[j + 2] = gcra_remaining(nxt, now, interval, capacity)
    out[j + 3] = 0
    out[j + 4] = nxt - now
  end
end
return out
`)
