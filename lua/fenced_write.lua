-- fenced_write.lua: write a task's side effect to a resource only from the current holder of
-- its run's lease, and only if no newer fence has written that resource (ctx.fenced_write).
--
-- KEYS[1]  resource hash jq:{q#p}:fenced:<name>  (fields: fence, value, run, at)
-- KEYS[2]  run hash      jq:{q#p}:run:<run_id>   (the writer's run)
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  fence of the writer (the run's current claim)
-- ARGV[3]  value
-- ARGV[4]  run_id of the writer (stored for inspection)
-- ARGV[5]  ttl ms of the resource, or 0 to keep it (each accepted write sets it afresh)
-- Returns  {1, fence} when written;
--          {0, run_fence} when refused because the writer no longer holds its run (the run
--          was reclaimed, cancelled or finished: run_fence is the run's current fence);
--          {0, last_fence} when refused because a newer fence already wrote the resource.
--
-- Fences come from one counter per partition (claim.lua), so they order the claims of every
-- run of the partition: a resource shared by runs keeps the write of the latest claim.

local now = clock(ARGV[1])
local fence, ttl = tonumber(ARGV[2]), tonumber(ARGV[5]) or 0
local run = load_run(KEYS[2], 'state', 'fence')
local current = tonumber(run.fence) or 0
if run.state ~= 'running' or current ~= fence then return {0, current} end
local last = tonumber(redis.call('HGET', KEYS[1], 'fence')) or -1
if fence < last then return {0, last} end
redis.call('HSET', KEYS[1], 'fence', fence, 'value', ARGV[3], 'run', ARGV[4], 'at', now)
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return {1, fence}
