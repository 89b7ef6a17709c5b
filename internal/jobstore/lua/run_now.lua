-- run_now.lua moves retrying jobs into their flows at once (an operator
-- resumed their upstream) and wakes the workers. A job counted deferred
-- leaves that count, one counted retry leaves that one.
--
-- KEYS[1] -> v
-- KEYS[2] -> f
-- KEYS[3] -> cal
-- KEYS[4] -> counts
-- KEYS[5] -> asynq retry
-- KEYS[6] -> asynq groups
-- ARGV[1] -> now override
-- ARGV[2] -> our prefix
-- ARGV[3] -> asynq group prefix
-- ARGV[4] -> asynq task prefix
-- ARGV[5] -> wake channel
-- ARGV[6] -> upstream
-- ARGV[7..] -> ids
--
-- Returns how many were retrying.
--
-- Needs count.lua and flow.lua before it (see lua.go).
local P, G, T = ARGV[2], ARGV[3], ARGV[4]
local K_V, K_F, K_CAL, K_GROUPS = KEYS[1], KEYS[2], KEYS[3], KEYS[6]
local sp = space(P, G, T, K_V, K_F, K_CAL, K_GROUPS)

local now = shaper_now(ARGV[1])
local n = 0
for i = 7, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[5], id) == 1 then
    local f = redis.call('HMGET', T .. id, 'sl', 'sf', 'sp', 'sq', 'sd')
    if f[1] then
      local from = waited_as(T .. id, f[5])
      push(sp, id, f[1], f[2] or '', f[3] or '', tonumber(f[4] or '0'), now)
      count(KEYS[4], from .. f[1], -1)
      count(KEYS[4], 'pending:' .. f[1], 1)
      n = n + 1
    end
  end
end
if n > 0 then
  redis.call('HDEL', K_V, 'sleep')
  redis.call('PUBLISH', ARGV[5], ARGV[6])
end
return n
