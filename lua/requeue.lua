-- requeue.lua: put a finished run (dead, cancelled or done) back to pending, attempts reset.
--
-- KEYS[1]  due zset      jq:{q#p}:due
-- KEYS[2]  dead zset     jq:{q#p}:dead
-- KEYS[3]  done zset     jq:{q#p}:done
-- KEYS[4]  wake list     jq:{q#p}:wake
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  key prefix    jq:{q#p}:
-- ARGV[3]  run_id
-- Returns  {1, previous_state} when requeued; {0, 'unknown'} when there is no such run;
--          {0, state} when it is still pending or running (nothing to requeue).
--
-- The fence is kept (it only ever grows), so nothing stale can commit into the new life.

local now = clock(ARGV[1])
local prefix, run_id = ARGV[2], ARGV[3]
local key = prefix .. 'run:' .. run_id
local run = load_run(key, 'state')
if not run.state then return {0, 'unknown'} end
if run.state == 'pending' or run.state == 'running' then return {0, run.state} end

redis.call('HSET', key, 'state', 'pending', 'attempt', 0, 'due', now)
redis.call('HDEL', key, 'finished', 'result', 'owner', 'lease_until')
redis.call('PERSIST', key)
redis.call('PERSIST', prefix .. 'hist:' .. run_id)
redis.call('ZREM', KEYS[2], run_id)
redis.call('ZREM', KEYS[3], run_id)
redis.call('ZADD', KEYS[1], now, run_id)
history(prefix, run_id, now .. ' requeued (was ' .. run.state .. ')')
redis.call('LPUSH', KEYS[4], '1')
redis.call('LTRIM', KEYS[4], 0, 15)
return {1, run.state}
