-- callback.lua: a library. callback_due(task, id, due) records a delivery
-- of job id's callback, due now on Redis's clock, in the due set due: the
-- task hash's cb field, which names the upstream's due set when the job
-- has a callback_url (the caller reads it, with what else it reads of the
-- task, and declares the set in its KEYS; nil or false: no callback,
-- nothing to do). The script that makes a job final calls it, so the
-- finish and the record of its delivery are one atomic step and a crash
-- between them cannot lose it. The task's callback fields start over: cbs
-- (state) pending, cba (attempts) 0, cbe (last error) gone, and cbn (which
-- final state this is, the webhook-id's suffix) one more. The id is
-- published on the channel of the due set's own name, which deliverers
-- subscribe to. See callback_claim.lua for the rest.
--
-- callback_started(task, id, due) is callback_due for a caller that has
-- written cbs pending and cba 0 itself, in an HSET of its own (one command
-- fewer).
local function callback_started(task, id, due)
  redis.call('ZADD', due, shaper_int(shaper_now('')), id)
  redis.call('HDEL', task, 'cbe')
  redis.call('HINCRBY', task, 'cbn', '1')
  redis.call('PUBLISH', due, id)
end

local function callback_due(task, id, due)
  if not due then return end
  redis.call('HSET', task, 'cbs', 'pending', 'cba', '0')
  callback_started(task, id, due)
end
