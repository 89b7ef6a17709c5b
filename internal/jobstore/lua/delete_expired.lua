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
-- ARGV[6], ARGV[7] -> most tombstones kept (0 = none; with tombstones,
--    KEYS[3] is their set) and for how many seconds (a whole number, at
--    least 1)
-- ARGV[8] -> side key prefixes deleted with a task, joined by newlines
--    ("" = none; each in the queue's slot)
-- ARGV[9] -> most tasks the set keeps (0 = no bound): past it, the
--    lowest scores go too, within ARGV[2] in all
-- ARGV[10..14] -> records of deleted idempotency keys' tasks
--    (Remembered.args): the bucket index key ("" = none; its buckets are
--    built from it, in the queue's slot), window and span in seconds, the
--    Lua pattern of such an ID, the cancel mark's prefix
--
-- Returns how many tasks it deleted (a task whose callback is still to be
-- delivered is kept, see forget in trim.lua).
--
-- Needs remember.lua and trim.lua before it (see lua.go).
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local gone = nil
if tonumber(ARGV[6]) > 0 then
  gone = {key = KEYS[3], most = tonumber(ARGV[6]), ttl = ARGV[7], at = ARGV[5],
    before = '(' .. (tonumber(ARGV[5]) - tonumber(ARGV[7]))}
end
local sides = {}
for p in string.gmatch(ARGV[8], '[^\n]+') do
  sides[#sides + 1] = p
end
local rem = nil
if ARGV[10] ~= '' then
  rem = {key = ARGV[10], window = tonumber(ARGV[11]), span = tonumber(ARGV[12]), pattern = ARGV[13], cancel = ARGV[14]}
end
local tally = {}
local forget, entomb, trim = sweeper({prefix = ARGV[3], sides = sides, gone = gone, rem = rem, tally = tally})
-- The state's place in a tally (see trim.lua).
local state = 5
if ARGV[4] == 'succeeded' then
  state = 2
end
local tomb, kept = {}, 0
for _, id in ipairs(ids) do
  local r = forget(id, state)
  if not r then
    tomb[#tomb + 1] = id
  end
  if r ~= 'kept' then
    redis.call('ZREM', KEYS[1], id)
  else
    kept = kept + 1
  end
end
entomb(tomb, #ids)
-- Then the count bound, within the same limit: an upstream that finishes
-- nothing more still comes down to it.
local trimmed = 0
local most = tonumber(ARGV[9])
if most > 0 and tonumber(ARGV[2]) > #ids then
  trimmed = trim(KEYS[1], state, redis.call('ZCARD', KEYS[1]) - most, tonumber(ARGV[2]) - #ids)
end
settle(KEYS[2], tally)
return #ids - kept + trimmed
