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
-- A partition is parked while its flow is in pk (what status counts):
-- its own next slot alone may lie ahead with the partition not held back,
-- when the upstream's next slot is later still.
local parked = 0
if f[1] == 'aggregating' and f[2] and f[4] and f[4] ~= '' then
  local sc = redis.call('ZSCORE', ARGV[2] .. 'pk', f[2] .. '|' .. (f[3] or '') .. '|' .. f[4])
  if sc then parked = tonumber(sc) end
end
return {now, f[1] or '', tonumber(b[1] or '0'), b[2] or '', redis.call('GET', KEYS[3]), parked, f[5] or ''}
