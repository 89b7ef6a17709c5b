-- count.lua: a library. count(k, field, by) adds by to a counter of hash
-- k (by may be a number or its string), dropping the field at 0, so that a
-- hash of counters holds only those that are not.
local function count(k, field, by)
  local n = redis.call('HINCRBY', k, field, by)
  if n <= 0 then redis.call('HDEL', k, field) end
end
