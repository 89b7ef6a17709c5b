-- calls.lua: a library through which the take yields to proxied calls
-- waiting their turn (call_turn.lua). It defines:
--
--   CALL_YIELD: the µs a take that yielded asks to be run again in
--   call_keys(our, f, now) -> {{key, virtual time}, ...}: the first few
--     keys with calls waiting at now (P:s:{Q}:cq, marked in cw) that have
--     no jobs in f (those the take serves itself)
--   call_ahead(calls, fk, s, q) -> true when fairness key fk at virtual
--     time s is more than q ahead of a key of calls
local CALL_YIELD = 5000

local function call_keys(our, f, now)
  local out = {}
  local r = redis.call('ZRANGE', our .. 'cq', 0, 3, 'WITHSCORES')
  for i = 1, #r, 2 do
    local e = redis.call('ZSCORE', our .. 'cw', r[i])
    if e and tonumber(e) > now and redis.call('ZSCORE', f, r[i]) == false then
      out[#out + 1] = {r[i], tonumber(r[i + 1])}
    end
  end
  return out
end

local function call_ahead(calls, fk, s, q)
  for _, c in ipairs(calls) do
    if c[1] ~= fk and s > c[2] + q + 1e-9 then return true end
  end
  return false
end
