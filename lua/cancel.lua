-- cancel.lua: cancel a pending or running run; issues a new fence (as claim does, from the
-- partition's counter) so a running worker is refused at its next heartbeat or commit.
--
-- KEYS[1]  due zset      jq:{q#p}:due
-- KEYS[2]  leases zset   jq:{q#p}:leases
-- KEYS[3]  done zset     jq:{q#p}:done
-- KEYS[4]  stats hash    jq:{q#p}:stats
-- KEYS[5]  fence counter jq:{q#p}:fences (the last fence issued in the partition)
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  key prefix    jq:{q#p}:
-- ARGV[3]  run_id
-- ARGV[4]  retention ms of the cancelled record
-- ARGV[5]  reason (free text, stored as the error)
-- Returns  {1, previous_state} when cancelled ('pending' or 'running');
--          {0, 'unknown'} when there is no such run;
--          {0, state} when it already finished ('done', 'dead' or 'cancelled').
--
-- The done index lists cancelled runs too: entries older than the retention are trimmed here
-- as well, since a partition may see cancellations and no completions.

local now = clock(ARGV[1])
local prefix, run_id, retention, reason = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local key = prefix .. 'run:' .. run_id
local run = load_run(key, 'state', 'fence')
if not run.state then return {0, 'unknown'} end
if run.state ~= 'pending' and run.state ~= 'running' then return {0, run.state} end

redis.call('ZREM', KEYS[1], run_id)
redis.call('ZREM', KEYS[2], run_id)
local fence = math.max(tonumber(redis.call('GET', KEYS[5])) or 0, tonumber(run.fence) or 0) + 1
redis.call('SET', KEYS[5], fence)
redis.call('HSET', key, 'state', 'cancelled', 'fence', fence, 'finished', now, 'error', reason)
redis.call('HDEL', key, 'lease_until')
redis.call('ZADD', KEYS[3], now, run_id)
if retention and retention > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - retention)
end
history(prefix, run_id, now .. ' cancelled (was ' .. run.state .. '): ' .. string.sub(reason, 1, 200))
expire_record(prefix, run_id, retention)
redis.call('HINCRBY', KEYS[4], 'cancelled', 1)
return {1, run.state}
