-- extend.lua moves the lease of tasks that still hold one; ZADD XX
-- leaves out a task whose lease already went, so it is not resurrected.
--
-- KEYS[1] -> lease set
-- ARGV[1] -> new lease end, Unix seconds
-- ARGV[2..] -> task ids
--
-- Returns how many of the tasks still held a lease.
local held = 0
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], ARGV[i])
    held = held + 1
  end
end
return held
