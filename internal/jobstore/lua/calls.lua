-- calls.lua: a library through which the take yields to proxied calls
-- waiting their turn (call_turn.lua). It defines:
--
--   CALL_YIELD: the µs a take that yielded asks to be run again in
--   CALL_MARK: the µs a mark outlives the time it was made for
--     (jobstore.CallMark; lua.go defines it before this library)
--   call_keys(our, f, now) -> {{key, virtual time}, ...}, live: the first
--     few keys with calls waiting at now (P:s:{Q}:cq, marked in cw) that
--     have no jobs in f (those the take serves itself); live: some call
--     waits, so the take writes every virtual time it moves (a sole
--     key's or lane's too), which the calls compare theirs with. Where no
--     call was ever marked (no proxied calls, or none waited), cw does not
--     exist, and one EXISTS says so
--   call_ahead(calls, fk, s, q) -> true when fairness key fk at virtual
--     time s is more than q ahead of a key of calls
--   call_lane_first(our, v, fk, lane, s2, lane_at, fk_lane_v, now, cache)
--     -> true when a call of key fk waits (marked in P:s:{Q}:cl:FK) in
--     lane, or in a lane not ahead of lane's start s2: lane_at(l) is the
--     take's own view of lane l's start (nil: none waits with jobs), in
--     which case the calls' lane time (cv, FK|LANE) counts, never behind
--     fk_lane_v, the key's lane virtual time; cache keeps what was read
--     per key
local CALL_YIELD = 5000

local function call_keys(our, f, now)
  local out = {}
  local cw = our .. 'cw'
  if redis.call('EXISTS', cw) == 0 then return out, false end
  local live = #redis.call('ZRANGEBYSCORE', cw, '(' .. shaper_int(now), '+inf', 'LIMIT', '0', '1') > 0
  if not live then return out, false end
  local r = redis.call('ZRANGE', our .. 'cq', '0', '3', 'WITHSCORES')
  for i = 1, #r, 2 do
    local e = redis.call('ZSCORE', cw, r[i])
    if e and tonumber(e) > now and redis.call('ZSCORE', f, r[i]) == false then
      out[#out + 1] = {r[i], tonumber(r[i + 1])}
    end
  end
  return out, true
end

local function call_ahead(calls, fk, s, q)
  for _, c in ipairs(calls) do
    if c[1] ~= fk and s > c[2] + q + 1e-9 then return true end
  end
  return false
end

local function call_lane_first(our, v, fk, lane, s2, lane_at, fk_lane_v, now, cache)
  local ls = cache[fk]
  if ls == nil then
    ls = redis.call('ZRANGEBYSCORE', our .. 'cl:' .. fk, '(' .. shaper_int(now), '+inf')
    cache[fk] = ls
  end
  for _, l in ipairs(ls) do
    if l == lane then return true end
    local t = lane_at(l)
    if t == nil then
      t = math.min(math.max(tonumber(redis.call('HGET', our .. 'cv', fk .. '|' .. l) or '0'), fk_lane_v), fk_lane_v + 2)
    end
    if t <= s2 + 1e-9 then return true end
  end
  return false
end
