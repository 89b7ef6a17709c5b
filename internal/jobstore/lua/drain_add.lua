-- drain_add.lua adds one replica's send counts to an upstream's drain
-- counters (per second and per history step) and renews each one's TTL,
-- in one call: a flush sends one command an upstream, not two a key.
--
-- KEYS[1] -> a counter of the upstream, and so on: KEYS[i] -> the i-th
--    (all in the upstream's slot, {UPSTREAM})
-- ARGV[1] -> what to add to KEYS[1], ARGV[2] -> its TTL in seconds; then
--    ARGV[2i-1] and ARGV[2i] likewise for KEYS[i]
--
-- Returns the number of counters written.
for i = 1, #KEYS do
  redis.call('INCRBY', KEYS[i], ARGV[2 * i - 1])
  redis.call('EXPIRE', KEYS[i], ARGV[2 * i])
end
return #KEYS
