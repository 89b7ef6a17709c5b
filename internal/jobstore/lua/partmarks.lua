-- partmarks.lua: a library of the marks on partitions tighter than their
-- upstream, which proxied calls (call_turn.lua) and, while calls wait for
-- a partition, the take's jobs (take.lua) leave for each other, so that
-- the keys waiting for one such partition take turns in it. For partition
-- PK and fairness key FK, under our prefix P:s:{Q}:
--
--   cp:PK  zset: FK -> the key's virtual time, for a key whose calls wait
--          for PK
--   jp:PK  zset: the same for a key whose jobs wait for PK beside calls
--   cpw    zset: "PK\nFK" -> µs until a call mark lapses
--   cr     zset: the same members -> the call key's virtual time in the
--          rotation (its turn at the upstream, which cp:PK's is not)
--   jpw    zset: the same for job marks
--
-- The virtual times in cp:PK and jp:PK are the keys' within the
-- partition: a key new to its turns starts at the least of the others
-- marked there, and each of its sends there moves it on by 1/weight.
--
-- (A partition holds no control character, so the first line feed of a
-- member of cpw or jpw ends the partition.)
--
--   part_mark(our, jobs, pk, fk, vt, until_, pttl, rvt): marks key fk on
--     pk at virtual time vt (within pk) until until_ (a call's mark, with
--     rvt its key's time in the rotation; or with jobs a job key's), the
--     keys living pttl ms
--   part_marks(our, pk, now, jobs) -> {{fk, vt}, ...}: the live marks on
--     pk of keys whose calls (with jobs: whose jobs) wait for it, lowest
--     virtual time first, at most 16
--   part_lapse(our, now, jobs): the call marks (with jobs: the job marks)
--     whose time passed go, at most 64
local function part_mark(our, jobs, pk, fk, vt, until_, pttl, rvt)
  local z, w = our .. 'cp:' .. pk, our .. 'cpw'
  if jobs then z, w = our .. 'jp:' .. pk, our .. 'jpw' end
  local m = pk .. '\n' .. fk
  redis.call('ZADD', w, 'GT', until_, m)
  redis.call('ZADD', z, vt, fk)
  redis.call('PEXPIRE', w, pttl)
  redis.call('PEXPIRE', z, pttl)
  if not jobs then
    redis.call('ZADD', our .. 'cr', rvt, m)
    redis.call('PEXPIRE', our .. 'cr', pttl)
  end
end

local function part_marks(our, pk, now, jobs)
  local z, w = our .. 'cp:' .. pk, our .. 'cpw'
  if jobs then z, w = our .. 'jp:' .. pk, our .. 'jpw' end
  local r = redis.call('ZRANGE', z, '0', '15', 'WITHSCORES')
  local out = {}
  if #r == 0 then return out end
  local ms = {}
  for i = 1, #r, 2 do ms[#ms + 1] = pk .. '\n' .. r[i] end
  local untils = redis.call('ZMSCORE', w, unpack(ms))
  for i = 1, #ms do
    if untils[i] and tonumber(untils[i]) > now then
      out[#out + 1] = {r[2 * i - 1], tonumber(r[2 * i])}
    end
  end
  return out
end

local function part_lapse(our, now, jobs)
  local w, z = our .. 'cpw', our .. 'cp:'
  if jobs then w, z = our .. 'jpw', our .. 'jp:' end
  local gone = redis.call('ZRANGEBYSCORE', w, '-inf', now, 'LIMIT', 0, 64)
  if #gone == 0 then return end
  for _, m in ipairs(gone) do
    local nl = string.find(m, '\n', 1, true)
    redis.call('ZREM', z .. string.sub(m, 1, nl - 1), string.sub(m, nl + 1))
  end
  redis.call('ZREM', w, unpack(gone))
  if not jobs then redis.call('ZREM', our .. 'cr', unpack(gone)) end
end
