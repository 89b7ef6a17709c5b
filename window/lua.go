package window

import "github.com/shaperhq/shaper/internal/script"

// muldivLua is exact ⌊a·b/c⌋ for the sliding window counter, whose products
// (a count times a window in µs) can pass 2^53, where Lua's doubles stop
// being exact. It multiplies bit by bit, keeping the remainder below c, so
// every intermediate stays below 2c. Needs integers a >= 0, 0 <= b <= c and
// c below 2^52; mulDiv in model.go is its Go twin.
//
//	window_muldiv(a, b, c) -> q, r with a·b = q·c + r and 0 <= r < c
const muldivLua = `
local function window_muldiv(a, b, c)
  local bits = {}
  while a > 0 do
    local bit = a % 2
    bits[#bits + 1] = bit
    a = (a - bit) / 2
  end
  local q, r = 0, 0
  for i = #bits, 1, -1 do
    q, r = q * 2, r * 2
    if r >= c then q, r = q + 1, r - c end
    if bits[i] == 1 then
      r = r + b
      if r >= c then q, r = q + 1, r - c end
    end
  end
  return q, r
end
`

// fixedWindowScript counts units in the clock-aligned window that holds
// now. A key whose stored window starts after now (Redis's clock stepped
// back) keeps counting in that window rather than handing out a fresh one.
// Writes only when it admits.
//
//	KEYS[1] -> hash {w = window start µs, c = units admitted in it}
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//	ARGV[2] -> per, the window in µs
//	ARGV[3] -> rate, units per window
//	ARGV[4] -> n, the cost (1 <= n <= rate)
//	ARGV[5] -> TTL in ms
//
// Returns {allowed (1 or 0), remaining, retry_after µs, reset_after µs}.
var fixedWindowScript = script.New(`
local key = KEYS[1]
local now = shaper_now(ARGV[1])
local per = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local n = tonumber(ARGV[4])

local state = redis.call('HMGET', key, 'w', 'c')
local w = tonumber(state[1])
if w ~= nil and now < w then now = w end
local start = shaper_idiv(now, per) * per
local count = 0
if w ~= nil and w >= start then count = tonumber(state[2]) or 0 end

local reset = start + per - now
if count + n > rate then
  return {0, math.max(rate - count, 0), reset, reset}
end
count = count + n
redis.call('HSET', key, 'w', shaper_int(start), 'c', shaper_int(count))
redis.call('PEXPIRE', key, ARGV[5])
return {1, rate - count, 0, reset}
`)

// slidingLogScript admits n units if the window (now-per, now] then holds at
// most rate, recording each as a member of a sorted set scored by its time.
// Members are "now:i" with i counting on from the members already at now,
// which are always exactly "now:1".."now:m" (ZREMRANGEBYSCORE drops all
// members of one score together), so they stay unique even when one
// request or many requests in the same µs add several units. Trimming
// entries that have left the window is its only write on a denial.
//
//	KEYS[1] -> sorted set of "µs:i" members scored by µs
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//	ARGV[2] -> per, the window in µs
//	ARGV[3] -> rate, units per window
//	ARGV[4] -> n, the cost (1 <= n <= rate)
//	ARGV[5] -> TTL in ms
//
// Returns {allowed (1 or 0), remaining, retry_after µs, reset_after µs}.
var slidingLogScript = script.New(`
local key = KEYS[1]
local now = shaper_now(ARGV[1])
local per = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local n = tonumber(ARGV[4])

redis.call('ZREMRANGEBYSCORE', key, '-inf', shaper_int(now - per))
local count = redis.call('ZCARD', key)
if count + n > rate then
  -- n fit once the k oldest have left the window.
  local k = count + n - rate
  local kth = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return {0, math.max(rate - count, 0), tonumber(kth[2]) + per - now, tonumber(last[2]) + per - now}
end

local stamp = shaper_int(now)
local seq = redis.call('ZCOUNT', key, stamp, stamp)
-- ZADD in batches: Lua's unpack cannot spread an unbounded table.
local args = {}
for i = 1, n do
  args[#args + 1] = stamp
  args[#args + 1] = stamp .. ':' .. shaper_int(seq + i)
  if #args >= 1000 or i == n then
    redis.call('ZADD', key, unpack(args))
    args = {}
  end
end
redis.call('PEXPIRE', key, ARGV[5])
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
return {1, rate - count - n, 0, tonumber(last[2]) + per - now}
`)

// slidingWindowScript is the sliding window counter: the current
// clock-aligned window's count plus the previous window's, weighted by the
// share of it that the sliding window ending now still covers, rounded up
// (see SlidingWindow). As in fixedWindowScript, a stored window after now
// holds now back to its start. Writes only when it admits.
//
//	KEYS[1] -> hash {w = current window start µs, c = its units, p = the previous window's units}
//	ARGV[1] -> now override in µs ("" = Redis TIME)
//	ARGV[2] -> per, the window in µs
//	ARGV[3] -> rate, units per window
//	ARGV[4] -> n, the cost (1 <= n <= rate)
//	ARGV[5] -> TTL in ms
//
// Returns {allowed (1 or 0), remaining, retry_after µs, reset_after µs}.
var slidingWindowScript = script.New(muldivLua, `
local key = KEYS[1]
local now = shaper_now(ARGV[1])
local per = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local n = tonumber(ARGV[4])

local state = redis.call('HMGET', key, 'w', 'c', 'p')
local w = tonumber(state[1])
if w ~= nil and now < w then now = w end
local start = shaper_idiv(now, per) * per
local elapsed = now - start
local cur, prev = 0, 0
if w ~= nil then
  if w >= start then
    cur = tonumber(state[2]) or 0
    prev = tonumber(state[3]) or 0
  elseif w >= start - per then
    prev = tonumber(state[2]) or 0
  end
end

local weighted = 0
if prev > 0 then
  local q, r = window_muldiv(prev, per - elapsed, per)
  weighted = q
  if r > 0 then weighted = q + 1 end
end

-- Until the estimate is zero: the current window's units weigh on until
-- the end of the next one, the previous window's until this one ends.
local function reset_after(c)
  if c > 0 then return start + 2 * per - now end
  if prev > 0 then return start + per - now end
  return 0
end

if weighted + cur + n > rate then
  local retry
  local room = rate - cur - n
  if room >= 0 then
    -- Later in this window, once prev's weight drops to room; room < prev
    -- since the weight is at most prev.
    retry = per - window_muldiv(per, room, prev) - elapsed
  else
    -- In the next window, once cur's weight drops to rate - n; that is
    -- below cur, since cur + n > rate.
    retry = 2 * per - window_muldiv(per, rate - n, cur) - elapsed
  end
  return {0, math.max(rate - weighted - cur, 0), retry, reset_after(cur)}
end

cur = cur + n
redis.call('HSET', key, 'w', shaper_int(start), 'c', shaper_int(cur), 'p', shaper_int(prev))
redis.call('PEXPIRE', key, ARGV[5])
return {1, rate - weighted - cur, 0, reset_after(cur)}
`)

// resetScript forgets a key's state. It is a script only because the
// limiters take the narrow redis.Scripter.
//
//	KEYS[1] -> any limiter key
//
// Returns the number of keys deleted (0 or 1).
var resetScript = script.New(`
return redis.call('DEL', KEYS[1])
`)
