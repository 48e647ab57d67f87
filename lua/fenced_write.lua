-- fenced_write.lua: a resource that accepts a write only with a fence >= the last one it saw,
-- so a task's side effect made from a stale attempt is refused (the ctx.fenced_write helper).
--
-- KEYS[1]  resource hash jq:{q#p}:fenced:<name>  (fields: fence, value, run)
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  fence of the writer (the run's current claim)
-- ARGV[3]  value
-- ARGV[4]  run_id of the writer (stored for inspection)
-- Returns  {1, fence} when written; {0, last_fence} when refused because a newer fence wrote.

local now = clock(ARGV[1])
local fence = tonumber(ARGV[2])
local last = tonumber(redis.call('HGET', KEYS[1], 'fence')) or -1
if fence < last then return {0, last} end
redis.call('HSET', KEYS[1], 'fence', fence, 'value', ARGV[3], 'run', ARGV[4], 'at', now)
return {1, fence}
