-- requeue.lua puts active jobs that were not sent back at the head of
-- their flows (a worker shutting down, a slot missed), releasing their
-- concurrency leases.
--
-- KEYS[1] -> v
-- KEYS[2] -> f
-- KEYS[3] -> cal
-- KEYS[4] -> counts
-- KEYS[5] -> asynq active
-- KEYS[6] -> asynq lease
-- KEYS[7] -> asynq groups
-- KEYS[8] -> leaky concurrency leases
-- ARGV[1] -> our prefix
-- ARGV[2] -> asynq group prefix
-- ARGV[3] -> asynq task prefix
-- ARGV[4] -> wake channel
-- ARGV[5] -> upstream name
-- ARGV[6..] -> job ids
--
-- Returns how many were active and went back.
--
-- Needs count.lua and flow.lua before it (see lua.go).
local P, G, T = ARGV[1], ARGV[2], ARGV[3]
local K_V, K_F, K_CAL, K_GROUPS = KEYS[1], KEYS[2], KEYS[3], KEYS[7]
local sp = space(P, G, T, K_V, K_F, K_CAL, K_GROUPS)

local n = 0
for i = 6, #ARGV do
  local id = ARGV[i]
  redis.call('ZREM', KEYS[8], id)
  if redis.call('LREM', KEYS[5], 0, id) > 0 then
    redis.call('ZREM', KEYS[6], id)
    local f = redis.call('HMGET', T .. id, 'sl', 'sf', 'sp', 'sq')
    if f[1] then
      push(sp, id, f[1], f[2] or '', f[3] or '', tonumber(f[4] or '0'), 0)
      count(KEYS[4], 'active:' .. f[1], -1)
      count(KEYS[4], 'pending:' .. f[1], 1)
      n = n + 1
    end
  end
end
if n > 0 and redis.call('HDEL', K_V, 'sleep') == 1 then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return n
