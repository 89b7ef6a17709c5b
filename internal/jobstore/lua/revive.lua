-- revive.lua puts an archived job back into its flow with a fresh FIFO
-- place, as the enqueue script would a new one, if its message is still
-- the one the caller read.
--
-- KEYS[1] -> task hash
-- KEYS[2] -> v
-- KEYS[3] -> f
-- KEYS[4] -> cal
-- KEYS[5] -> counts
-- KEYS[6] -> pbacklog
-- KEYS[7] -> asynq archived
-- KEYS[8] -> asynq groups
--    then, when ARGV[10] is "1", a key to delete; then, when ARGV[11] is
--    "1", a key that must exist
-- ARGV[1] -> now override
-- ARGV[2] -> id
-- ARGV[3] -> the message read
-- ARGV[4] -> the message to store
-- ARGV[5] -> our prefix
-- ARGV[6] -> asynq group prefix
-- ARGV[7] -> asynq task prefix
-- ARGV[8] -> wake channel
-- ARGV[9] -> upstream name
-- ARGV[10] -> forget flag
-- ARGV[11] -> needs flag
--
-- Returns "ok"; "" if there is no such job; "changed" if its message is
-- not ARGV[3]; "needs" if the needed key is gone; else the asynq state the
-- job is in (it is not archived). Only "ok" changes anything.
--
-- Needs count.lua and flow.lua before it (see lua.go).
local P, G, T = ARGV[5], ARGV[6], ARGV[7]
local K_V, K_F, K_CAL, K_GROUPS = KEYS[2], KEYS[3], KEYS[4], KEYS[8]
local sp = space(P, G, T, K_V, K_F, K_CAL, K_GROUPS)

local id = ARGV[2]
local f = redis.call('HMGET', KEYS[1], 'state', 'msg', 'sl', 'sf', 'sp')
if not f[1] then return '' end
if f[1] ~= 'archived' then return f[1] end
if f[2] ~= ARGV[3] then return 'changed' end
local k = 9
local forget
if ARGV[10] == '1' then forget = KEYS[k]; k = k + 1 end
if ARGV[11] == '1' and redis.call('EXISTS', KEYS[k]) == 0 then return 'needs' end
local now = shaper_now(ARGV[1])
local lane, fk, pk = f[3] or '', f[4] or '', f[5] or ''
redis.call('ZREM', KEYS[7], id)
local seq = redis.call('HINCRBY', K_V, 'seq', 1)
redis.call('HSET', KEYS[1], 'msg', ARGV[4], 'sq', seq)
-- The job starts afresh: a hand-back's mark (kept through a cancel, for
-- the caller to read) goes.
redis.call('HDEL', KEYS[1], 'sd')
redis.call('HDEL', KEYS[1], 'result')
push(sp, id, lane, fk, pk, seq, now)
count(KEYS[5], 'dead:' .. lane, -1)
count(KEYS[5], 'pending:' .. lane, 1)
if pk ~= '' then
  redis.call('ZINCRBY', KEYS[6], 1, pk)
end
if forget then redis.call('DEL', forget) end
if redis.call('HDEL', K_V, 'sleep') == 1 then
  redis.call('PUBLISH', ARGV[8], ARGV[9])
end
return 'ok'
