-- expired.lua lists tasks whose lease has run out, oldest lease first. A
-- lease naming a task whose hash is gone can never be finished; it is
-- dropped (with its active list entry) so it does not fill every later
-- page. (One whose task is not in the active list is dropped by the
-- recovery's Finish.)
--
-- KEYS[1] -> lease set
-- KEYS[2] -> active list
-- ARGV[1] -> now, Unix seconds
-- ARGV[2] -> most leases to look at
-- ARGV[3] -> task key prefix (the task hashes share the queue's slot)
--
-- Returns {id, msg, sl, sp, cb} per task, sl and sp "" when unset, cb "1"
-- when the task has a callback (a cb field), else "0".
local out = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  local v = redis.call('HMGET', ARGV[3] .. id, 'msg', 'sl', 'sp', 'cb')
  if v[1] then
    local cb = '0'
    if v[4] then cb = '1' end
    out[#out + 1] = {id, v[1], v[2] or '', v[3] or '', cb}
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('LREM', KEYS[2], 0, id)
  end
end
return out
