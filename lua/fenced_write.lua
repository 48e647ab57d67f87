-- fenced_write.lua: write a task's side effect to a resource only from the current holder of
-- its run's lease, and only if no newer claim has written that resource (ctx.fenced_write).
--
-- uses: core
--
-- KEYS[1]  resource  hash    jq:{q#p}:fenced:<name>  fields: fence, value, run, at
-- KEYS[2]  run       hash    jq:{q#p}:run:<run_id>   the writer's run
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  fence              fence of the writer (the run's current claim)
-- ARGV[3]  value              the value to write
-- ARGV[4]  run_id             the writer's run id (stored: an equal fence must come from it)
-- ARGV[5]  ttl_ms             ttl of the resource, or 0 to keep it (set afresh on each write)
-- Returns  {1, fence} when written;
--          {0, run_fence} when refused because the writer no longer holds its run (the run
--          was reclaimed, cancelled or finished: run_fence is the run's current fence);
--          {0, last_fence} when refused because a newer fence already wrote the resource, or
--          the same fence from another run. Refused whole (an error reply, nothing changed)
--          when the resource holds foreign data or a key is not on this node. A fence that is
--          not a whole number (garbage) reads as none: 0 in the run, never written in the
--          resource.
--
-- Fences come from one counter per partition (claim.lua), so they order the claims of every
-- run of the partition: a resource shared by runs keeps the write of the latest claim.

local now = clock(ARGV[1])
local fence, value, run_id, ttl = tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5]) or 0

local ok, plan = reading(function()
  local p = {run = load_run(KEYS[2], 'state', 'fence') or {}}
  local r = read('HMGET', KEYS[1], 'fence', 'run')
  p.last, p.last_run = whole_or(r[1], 0, -1), r[2] or nil
  return p
end)
if not ok then return plan end

local current = whole_or(plan.run.fence, 0, 0)
if plan.run.state ~= 'running' or current ~= fence then return {0, current} end
if fence < plan.last then return {0, plan.last} end
if fence == plan.last and plan.last_run ~= run_id then return {0, plan.last} end
redis.call('HSET', KEYS[1], 'fence', int(fence), 'value', value, 'run', run_id, 'at', now)
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return {1, fence}
