-- job_hold.lua reads what keeps one job from being taken now.
--
-- KEYS[1] -> task hash
-- KEYS[2] -> leaky block hash
-- KEYS[3] -> asynq paused key
-- ARGV[1] -> now override
-- ARGV[2] -> our prefix
--
-- Returns {now µs, state ("" none), block end µs (0 none), block reason,
-- asynq's paused mark (nil none), partition's park end µs (0 unless the
-- job waits in its flow), the sd mark ("" none)}.
local now = shaper_now(ARGV[1])
local f = redis.call('HMGET', KEYS[1], 'state', 'sl', 'sf', 'sp', 'sd')
local b = redis.call('HMGET', KEYS[2], 'until', 'reason')
local parked = 0
if f[1] == 'aggregating' and f[2] then
  local sc = redis.call('ZSCORE', ARGV[2] .. 'r:' .. f[2] .. '|' .. (f[3] or ''), f[4] or '')
  if sc then parked = tonumber(sc) end
end
return {now, f[1] or '', tonumber(b[1] or '0'), b[2] or '', redis.call('GET', KEYS[3]), parked, f[5] or ''}
