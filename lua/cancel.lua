-- cancel.lua: cancel a pending or running run; issues a new fence (as claim does, from the
-- partition's counter) so a running worker is refused at its next heartbeat or commit.
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  leases    zset    jq:{q#p}:leases   run_id -> lease expiry (ms)
-- KEYS[3]  done      zset    jq:{q#p}:done     run_id -> finish time (done and cancelled)
-- KEYS[4]  stats     hash    jq:{q#p}:stats    counters
-- KEYS[5]  fences    string  jq:{q#p}:fences   the last fence issued in the partition
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  run_id             the run
-- ARGV[4]  retention_ms       how long the cancelled record lives
-- ARGV[5]  reason             free text, stored as the error
-- Returns  {1, previous_state} when cancelled ('pending' or 'running');
--          {0, 'unknown'} when there is no such run (or its key is not a run record);
--          {0, state} when it already finished ('done', 'dead' or 'cancelled'). Refused whole
--          (an error reply, nothing changed) when a key is not on this node or an index key
--          holds another type.
--
-- The done index lists cancelled runs too: entries older than the retention are trimmed here
-- as well, since a partition may see cancellations and no completions.

local now = clock(ARGV[1])
local prefix, run_id, retention, reason = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local key = prefix .. 'run:' .. run_id

local ok, plan = reading(function()
  local p = {run = load_run(key, 'state', 'fence')}
  if p.run and (p.run.state == 'pending' or p.run.state == 'running') then
    expect(KEYS[1], 'zset')
    expect(KEYS[2], 'zset')
    expect(KEYS[3], 'zset')
    p.stats = counters(KEYS[4], 'cancelled')
    p.fences = fence_counter(KEYS[5])
    p.hist = history_ok(prefix, run_id)
  end
  return p
end)
if not ok then return plan end
local run = plan.run
if not run or not run.state then return {0, 'unknown'} end
if run.state ~= 'pending' and run.state ~= 'running' then return {0, run.state} end

local fence = issue_fence(plan.fences, run.fence)
save_fences(plan.fences)
redis.call('HSET', key, 'state', 'cancelled', 'fence', int(fence), 'finished', now,
           'error', reason)
redis.call('HDEL', key, 'lease_until')
if plan.hist then
  -- A running run's claim had the fence replaced here: the history keeps it.
  local was = run.state
  if was == 'running' then was = was .. ', fence=' .. (run.fence or '0') end
  history(prefix, run_id, now .. ' cancelled (was ' .. was .. '): ' .. utf8_head(reason, 200))
end
expire_record(prefix, run_id, retention, plan.hist)
redis.call('ZADD', KEYS[3], now, run_id)
trim_index(KEYS[3], now, retention)
redis.call('ZREM', KEYS[1], run_id)
redis.call('ZREM', KEYS[2], run_id)
bump(plan.stats, 'cancelled', 1)
return {1, run.state}
