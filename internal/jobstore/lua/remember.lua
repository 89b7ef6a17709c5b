-- remember.lua: a library that makes and reads the records of dropped
-- idempotency keys' tasks (see Remembered). It uses Redis's clock (TIME), so
-- enqueuers and workers agree on when a record is up. It defines, each
-- touching only keys that start with rk (the queue's slot):
--
--   recall(rk, id) -> the state letter recorded for id, or false
--   remember(rk, id, state, window, span) records id's final state, and
--     drops the buckets whose time is up
--
-- A record's field is the first 20 hex digits of the SHA-1 of the id. (Two
-- functions and no helpers: a script's local functions are made anew on
-- every call, used or not.)
local function recall(rk, id)
  local field = string.sub(redis.sha1hex(id), 1, 20)
  local now = redis.call('TIME')[1]
  for _, name in ipairs(redis.call('ZRANGEBYSCORE', rk, '(' .. now, '+inf')) do
    local v = redis.call('HGET', rk .. ':' .. name, field)
    if v then
      return v
    end
  end
  return false
end

local function remember(rk, id, state, window, span)
  -- (Redis is given the clock's own string: a number argument costs it
  -- a formatting.)
  local clock = redis.call('TIME')[1]
  local now = tonumber(clock)
  -- Buckets whose time is up go first: a bounded few, one per span.
  local up = redis.call('ZRANGEBYSCORE', rk, '-inf', clock)
  for _, name in ipairs(up) do
    redis.call('UNLINK', rk .. ':' .. name)
  end
  if #up > 0 then
    redis.call('ZREMRANGEBYSCORE', rk, '-inf', clock)
  end
  local start = now - now % span
  local name = span .. '.' .. start
  local till = start + span + window
  local b = rk .. ':' .. name
  redis.call('HSET', b, string.sub(redis.sha1hex(id), 1, 20), state)
  if redis.call('ZADD', rk, 'NX', till, name) == 1 then
    -- The TTL is a backstop a span later, so that a bucket is normally
    -- dropped by UNLINK above rather than freed on expiry.
    redis.call('EXPIREAT', b, till + span)
    -- The index outlives its last bucket's backstop, so that the next
    -- record can still find (and UNLINK) every bucket whose time is up.
    local last = redis.call('ZRANGE', rk, -1, -1, 'WITHSCORES')
    redis.call('EXPIREAT', rk, math.max(till, tonumber(last[2])) + span)
  end
end
