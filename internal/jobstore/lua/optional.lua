-- optional.lua: a library. set_optional(task, pk, costs) writes a new task's
-- partition (sp) and costs (sc) only when they are not empty: in a task hash
-- each field costs about 100 bytes of Redis memory, and most jobs have
-- neither (issue 12). Every reader takes a missing field as empty.
local function set_optional(task, pk, costs)
  if pk ~= '' then redis.call('HSET', task, 'sp', pk) end
  if costs ~= '' then redis.call('HSET', task, 'sc', costs) end
end
