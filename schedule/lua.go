package schedule

import "github.com/shaperhq/shaper/internal/script"

// All of a deployment's schedules share one hash tag, {schedules}, so each
// script touches one Redis Cluster slot. A schedule's member is
// NAME@TENANT (names hold no @).
//
//	P:{schedules}:cal        zset: member -> its next tick, unix seconds (the
//	                         calendar; paused schedules and those with no tick
//	                         ahead are not in it)
//	P:{schedules}:def        hash: member -> the Schedule as JSON
//	P:{schedules}:state      hash: member -> its State as JSON
//	P:{schedules}:paused     set: paused members
//	P:{schedules}:t:TENANT   zset (all scores 0): the tenant's schedule names

// dueScript lists the schedules whose tick has come, with their
// definitions, in one call: the only command an idle replica sends per
// pass, whatever the number of schedules.
//
//	KEYS[1] -> calendar
//	KEYS[2] -> definitions
//	ARGV[1] -> most schedules to return
//	ARGV[2] -> now in µs, or "" for Redis TIME
//
// Returns {now µs, the first tick after now ("" for none), member, tick,
// definition, member, tick, definition, …}, the earliest ticks first; a
// definition is "" if it has gone. The first tick after now tells the
// runner how long it may sleep.
var dueScript = script.New(`
local now = shaper_now(ARGV[2])
local secs = shaper_idiv(now, 1000000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', secs, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local after = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. shaper_int(secs), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local out = {shaper_int(now), after[2] or ''}
for i = 1, #due, 2 do
  out[#out + 1] = due[i]
  out[#out + 1] = due[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], due[i]) or ''
end
return out
`)

// advanceScript moves a schedule from one tick to another only if it is
// still at the first: the compare-and-set that makes a tick run once.
//
//	KEYS[1] -> calendar
//	KEYS[2] -> states
//	ARGV[1] -> member
//	ARGV[2] -> the tick it must be at (unix s)
//	ARGV[3] -> the tick to move to, "" for none (leaves the calendar)
//	ARGV[4] -> the State to record as JSON, "" to leave it
//
// Returns 1 when moved, 0 when the schedule was elsewhere (another replica
// moved it) or is gone (deleted, paused).
var advanceScript = script.New(`
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not cur or tonumber(cur) ~= tonumber(ARGV[2]) then
  return 0
end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
end
return 1
`)

// putScript stores a schedule, making it or replacing it.
//
//	KEYS[1] -> calendar
//	KEYS[2] -> definitions
//	KEYS[3] -> paused set
//	KEYS[4] -> the tenant's names
//	ARGV[1] -> member
//	ARGV[2] -> the Schedule as JSON (its cron, timezone and source fields are read)
//	ARGV[3] -> its first tick from now (unix s), "" for none
//	ARGV[4] -> "1" paused, "0" not
//	ARGV[5] -> "create" (refuse an existing one) or "replace"
//	ARGV[6] -> name
//	ARGV[7] -> most schedules a tenant may have
//
// A replaced schedule keeps its calendar place when its cron and timezone
// are unchanged and it stays unpaused, so a replica restarting just before
// a tick does not move the tick. Returns 1 made, 2 replaced, 0 exists
// (create), -2 the tenant has too many.
var putScript = script.New(`
local old = redis.call('HGET', KEYS[2], ARGV[1])
if old and ARGV[5] == 'create' then
  return 0
end
if not old and redis.call('ZCARD', KEYS[4]) >= tonumber(ARGV[7]) then
  return -2
end
local same = false
if old then
  local o = cjson.decode(old)
  local n = cjson.decode(ARGV[2])
  same = o.cron == n.cron and o.timezone == n.timezone
end
local was_paused = redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[4], 0, ARGV[6])
if ARGV[4] == '1' then
  redis.call('SADD', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('SREM', KEYS[3], ARGV[1])
  local keep = same and not was_paused and redis.call('ZSCORE', KEYS[1], ARGV[1])
  if not keep then
    if ARGV[3] == '' then
      redis.call('ZREM', KEYS[1], ARGV[1])
    else
      redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
    end
  end
end
if old then
  return 2
end
return 1
`)

// removeScript deletes a schedule.
//
//	KEYS[1] -> calendar
//	KEYS[2] -> definitions
//	KEYS[3] -> states
//	KEYS[4] -> paused set
//	KEYS[5] -> the tenant's names
//	ARGV[1] -> member
//	ARGV[2] -> name
//	ARGV[3] -> "api" to refuse a schedule the config declares, "" not
//
// Returns 1 deleted, 0 no such schedule, -1 declared in the config.
var removeScript = script.New(`
local old = redis.call('HGET', KEYS[2], ARGV[1])
if not old then
  return 0
end
if ARGV[3] == 'api' and cjson.decode(old).source == 'config' then
  return -1
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[2])
return 1
`)

// pauseScript pauses or resumes a schedule.
//
//	KEYS[1] -> calendar
//	KEYS[2] -> definitions
//	KEYS[3] -> paused set
//	ARGV[1] -> member
//	ARGV[2] -> "pause" or "resume"
//	ARGV[3] -> on resume, its first tick from now (unix s), "" for none
//
// A paused schedule leaves the calendar; resumed, it runs from its next
// tick after now (ticks while paused are not run). Resuming one that is not
// paused changes nothing. Returns 1 done, 0 no such schedule, -1 declared
// in the config.
var pauseScript = script.New(`
local old = redis.call('HGET', KEYS[2], ARGV[1])
if not old then
  return 0
end
if cjson.decode(old).source == 'config' then
  return -1
end
if ARGV[2] == 'pause' then
  redis.call('SADD', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
elseif redis.call('SREM', KEYS[3], ARGV[1]) == 1 and ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
`)
