-- recall.lua reads one record.
--
-- KEYS[1] -> Remembered.Key
-- ARGV[1] -> the task ID
--
-- Returns the state letter, or nil.
--
-- Needs remember.lua before it (see lua.go).
return recall(KEYS[1], ARGV[1])
