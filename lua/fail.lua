-- fail.lua: record a failed attempt, only from the holder of the current fence; retry or bury.
--
-- KEYS[1]  due zset      jq:{q#p}:due
-- KEYS[2]  leases zset   jq:{q#p}:leases
-- KEYS[3]  dead zset     jq:{q#p}:dead
-- KEYS[4]  stats hash    jq:{q#p}:stats
-- KEYS[5]  wake list     jq:{q#p}:wake  (a retry wakes an idle worker to re-plan its sleep)
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  key prefix    jq:{q#p}:
-- ARGV[3]  run_id
-- ARGV[4]  fence the worker claimed with
-- ARGV[5]  error text
-- ARGV[6]  retry delay ms (the caller's backoff for this attempt), or '' for no retry at all
-- ARGV[7]  dead retention ms
-- Returns  {1, 'retry', due} when the run goes back to pending at due;
--          {1, 'dead'} when attempts are exhausted (or no retry was asked) and it is buried;
--          {0, reason, current_fence} when refused (reason as in heartbeat.lua).

local now = clock(ARGV[1])
local prefix, run_id, fence, err = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local delay, dead_retention = tonumber(ARGV[6]), tonumber(ARGV[7])
local key = prefix .. 'run:' .. run_id
local run = load_run(key, 'state', 'fence', 'attempt', 'max_attempts', 'owner')
local why = refusal(run, fence)
if why then
  redis.call('HINCRBY', KEYS[4], 'rejected', 1)
  return {0, why, tonumber(run.fence) or 0}
end

redis.call('ZREM', KEYS[2], run_id)
redis.call('HDEL', key, 'lease_until')
local attempt, max_attempts = tonumber(run.attempt) or 0, tonumber(run.max_attempts) or 1
redis.call('HINCRBY', KEYS[4], 'failed', 1)

if delay and attempt < max_attempts then
  local due = now + delay
  redis.call('HSET', key, 'state', 'pending', 'error', err, 'due', due)
  redis.call('ZADD', KEYS[1], due, run_id)
  history(prefix, run_id, now .. ' failed fence=' .. fence .. ' attempt=' .. attempt ..
          ' owner=' .. (run.owner or '?') .. ' retry at ' .. due .. ': ' .. string.sub(err, 1, 200))
  redis.call('HINCRBY', KEYS[4], 'retried', 1)
  redis.call('LPUSH', KEYS[5], '1')
  redis.call('LTRIM', KEYS[5], 0, 15)
  return {1, 'retry', due}
end

redis.call('HSET', key, 'state', 'dead', 'error', err, 'finished', now)
redis.call('ZADD', KEYS[3], now, run_id)
if dead_retention and dead_retention > 0 then -- entries whose records expired
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - dead_retention)
end
history(prefix, run_id, now .. ' dead fence=' .. fence .. ' attempt=' .. attempt ..
        ' owner=' .. (run.owner or '?') .. ': ' .. string.sub(err, 1, 200))
expire_record(prefix, run_id, dead_retention)
redis.call('HINCRBY', KEYS[4], 'dead', 1)
return {1, 'dead'}
