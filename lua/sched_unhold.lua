-- sched_unhold.lua: forget buffer-one held entries whose run was released (or is gone),
-- compare-and-set, so a slow scheduler never drops a newer entry recorded meanwhile.
--
-- KEYS[1]  held hash     jq:{sched#k}:held   job_id -> 'fire pred_fire due queue [pred_queue]'
-- ARGV[1]  now ms, or '' for the server clock (unused but for the reply: one clock)
-- ARGV[2..] 2 fields per entry: job_id, the held text the caller read
-- Returns  {now, removed}

local now = clock(ARGV[1])
local removed = 0
for i = 2, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    removed = removed + 1
  end
end
return {now, removed}
