-- holds.lua reads an upstream's counters and what holds its waiting
-- jobs: the bucket's block, asynq's pause, and the jobs in flows of
-- partitions parked for their limits.
--
-- KEYS[1] -> counts
-- KEYS[2] -> leaky block hash
-- KEYS[3] -> asynq paused key
-- KEYS[4] -> parked flows (P:s:{Q}:pk)
-- ARGV[1] -> now override
-- ARGV[2] -> asynq group prefix
-- ARGV[3] -> most parks to count
--
-- Returns {now µs, block end µs (0 none), block reason, asynq's paused
-- mark (nil none), 1 if parks beyond ARGV[3] went uncounted else 0,
-- {field, n, ...} of the counts, {lane, parked jobs, ...}}.
local now = shaper_now(ARGV[1])
local b = redis.call('HMGET', KEYS[2], 'until', 'reason')
local most = tonumber(ARGV[3])
local parks = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. now, '+inf', 'LIMIT', 0, most)
local lanes = {}
for _, g in ipairs(parks) do
  local lane = string.sub(g, 1, (string.find(g, '|', 1, true) or (#g + 1)) - 1)
  lanes[lane] = (lanes[lane] or 0) + redis.call('ZCARD', ARGV[2] .. g)
end
local parked = {}
for lane, n in pairs(lanes) do
  parked[#parked + 1] = lane
  parked[#parked + 1] = n
end
local more = 0
if #parks == most and redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf') > most then more = 1 end
return {now, tonumber(b[1] or '0'), b[2] or '', redis.call('GET', KEYS[3]), more,
  redis.call('HGETALL', KEYS[1]), parked}
