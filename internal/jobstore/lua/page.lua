-- page.lua reads the next entries of one of asynq's per-state indexes of
-- a queue, newest first, after a cursor, in one atomic step (so entries
-- joining or leaving meanwhile shift nothing under the cursor). It changes
-- nothing.
--
-- A sorted set (archived, completed, scheduled, retry) is read from its
-- highest score down, ties by member from the highest down, as ZREVRANGE
-- orders them. The cursor is the last entry read, (score, member): if that
-- member is still there with that score, reading goes on after its rank;
-- if it left, after the last member ranked above where it would be (a
-- binary search among the members sharing its score), so a cursor whose
-- entry moved on neither skips nor repeats the rest.
--
-- A list (active, where the newest is pushed on the left) is read from the
-- left. Its cursor is (position, member): after the member if it is still
-- within n places of that position, else from the position it had.
--
-- KEYS[1] -> the index (sorted set or list)
-- ARGV[1] -> "z" for a sorted set, "l" for a list
-- ARGV[2] -> the cursor's score (z) or position (l); "" to start at the top
-- ARGV[3] -> the cursor's member
-- ARGV[4] -> most entries to return
-- ARGV[5] -> asynq's task key prefix of the queue (same hash tag)
--
-- Returns a flat array, four values per entry: member, score (z) or
-- position (l), and the task hash's "state" and "sp" (partition) fields,
-- "" when unset.
local key, kind, cs, cm = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local n = tonumber(ARGV[4])
local T = ARGV[5]
local start = 0
local rows
-- Byte order, as Redis orders members (Lua's < follows the locale).
local function greater(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end
if kind == 'z' then
  if cs ~= '' then
    local s = redis.call('ZSCORE', key, cm)
    if s and tonumber(s) == tonumber(cs) then
      start = redis.call('ZREVRANK', key, cm) + 1
    else
      -- Members scoring cs are ranked [lo, hi), by member descending.
      local lo = redis.call('ZCOUNT', key, '(' .. cs, '+inf')
      local hi = redis.call('ZCOUNT', key, cs, '+inf')
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        local m = redis.call('ZREVRANGE', key, mid, mid)[1]
        if greater(m, cm) then lo = mid + 1 else hi = mid end
      end
      start = lo
    end
  end
  rows = redis.call('ZREVRANGE', key, start, start + n - 1, 'WITHSCORES')
else
  if cs ~= '' then
    -- Where the member was, or near it: entries before it come and go.
    -- (LRANGE rather than LPOS, which needs Redis 6.0.6.)
    local at = tonumber(cs)
    start = at
    local from = math.max(0, at - n)
    for i, id in ipairs(redis.call('LRANGE', key, from, at + n)) do
      if id == cm then start = from + i break end
    end
  end
  local ids = redis.call('LRANGE', key, start, start + n - 1)
  rows = {}
  for i, id in ipairs(ids) do
    rows[#rows + 1] = id
    rows[#rows + 1] = tostring(start + i - 1)
  end
end
local out = {}
for i = 1, #rows, 2 do
  local f = redis.call('HMGET', T .. rows[i], 'state', 'sp')
  out[#out + 1] = rows[i]
  out[#out + 1] = rows[i + 1]
  out[#out + 1] = f[1] or ''
  out[#out + 1] = f[2] or ''
end
return out
