-- waiting.lua records proxied calls waiting for their slot, on Redis's
-- clock: it drops the calls whose wait has ended, adds each of these
-- until the end of its wait, and keeps the set a little past the longest
-- wait. Calls that begin to wait together in one process share the call.
--
-- KEYS[1] -> the upstream's waiting set: call id -> end of its wait, µs
-- ARGV[1] -> now override, µs ("" = Redis TIME)
-- ARGV[2] -> how long the set is kept after this write, ms
-- ARGV[3..] -> per call: its id, its wait in µs
--
-- Returns the count of calls waiting, these included.
local now = shaper_now(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', shaper_int(now))
local add = {}
for i = 3, #ARGV, 2 do
  add[#add + 1] = shaper_int(now + tonumber(ARGV[i + 1]))
  add[#add + 1] = ARGV[i]
end
if #add > 0 then
  redis.call('ZADD', KEYS[1], unpack(add))
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])
