-- delete_expired.lua deletes finished tasks whose time in the completed or
-- archived set is up, and counts them out of shaper's counters by the lane
-- in each task's sl field.
--
-- KEYS[1] -> completed or archived set
-- KEYS[2] -> shaper's counter hash
-- ARGV[1] -> cutoff, Unix seconds: scores at or below it go
-- ARGV[2] -> most tasks to delete
-- ARGV[3] -> task key prefix (the task hashes share the queue's slot)
-- ARGV[4] -> counter state of the set: "succeeded" or "dead"
-- ARGV[5] -> now, Unix seconds
-- ARGV[6], ARGV[7] -> as the finish script's ARGV[9], ARGV[10]; with
--    tombstones, KEYS[3] is their set
-- ARGV[8] -> as the finish script's ARGV[12]
-- ARGV[9] -> most tasks the set keeps (0 = no bound): past it, the
--    lowest scores go too, within ARGV[2] in all
-- ARGV[10..14] -> as the finish script's ARGV[13..17]
--
-- Returns how many tasks it deleted (a task whose callback is still to be
-- delivered is kept, see forget in trim.lua).
--
-- Needs remember.lua and trim.lua before it (see lua.go).
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local gone = nil
if tonumber(ARGV[6]) > 0 then
  gone = {key = KEYS[3], most = tonumber(ARGV[6]), ttl = tonumber(ARGV[7]), now = tonumber(ARGV[5])}
end
local sides = side_prefixes(ARGV[8])
local rem = remembering(ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[14])
local tomb, kept = {}, 0
for _, id in ipairs(ids) do
  local r = forget(id, KEYS[2], ARGV[4], ARGV[3], sides, rem)
  if not r then
    tomb[#tomb + 1] = id
  end
  if r ~= 'kept' then
    redis.call('ZREM', KEYS[1], id)
  else
    kept = kept + 1
  end
end
entomb(gone, tomb, #ids)
-- Then the count bound, within the same limit: an upstream that finishes
-- nothing more still comes down to it.
local trimmed = trim(KEYS[1], KEYS[2], ARGV[4], tonumber(ARGV[9]), tonumber(ARGV[2]) - #ids, ARGV[3], sides, gone, rem)
return #ids - kept + trimmed
