-- complete.lua: accept a run's success, only from the holder of the current fence.
--
-- KEYS[1]  leases zset   jq:{q#p}:leases
-- KEYS[2]  done zset     jq:{q#p}:done
-- KEYS[3]  stats hash    jq:{q#p}:stats
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  key prefix    jq:{q#p}:
-- ARGV[3]  run_id
-- ARGV[4]  fence the worker claimed with
-- ARGV[5]  result (JSON)
-- ARGV[6]  retention ms of the finished record
-- Returns  {1, 'done'} when accepted;
--          {0, reason, current_fence} when refused (reason as in heartbeat.lua). A refused
--          commit changes nothing: at most one completion per run is ever accepted.

local now = clock(ARGV[1])
local prefix, run_id, fence = ARGV[2], ARGV[3], tonumber(ARGV[4])
local retention = tonumber(ARGV[6])
local key = prefix .. 'run:' .. run_id
local run = load_run(key, 'state', 'fence')
local why = refusal(run, fence)
if why then
  redis.call('HINCRBY', KEYS[3], 'rejected', 1)
  return {0, why, tonumber(run.fence) or 0}
end

redis.call('HSET', key, 'state', 'done', 'result', ARGV[5], 'finished', now)
redis.call('HDEL', key, 'lease_until')
redis.call('ZREM', KEYS[1], run_id)
redis.call('ZADD', KEYS[2], now, run_id)
-- The done index only lists records that still exist: trim what retention expired.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - retention)
history(prefix, run_id, now .. ' done fence=' .. fence)
expire_record(prefix, run_id, retention)
redis.call('HINCRBY', KEYS[3], 'completed', 1)
return {1, 'done'}
