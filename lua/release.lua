-- release.lua: hand a running run back to the queue without counting an attempt
-- (graceful shutdown); only from the holder of the current fence.
--
-- KEYS[1]  due zset      jq:{q#p}:due
-- KEYS[2]  leases zset   jq:{q#p}:leases
-- KEYS[3]  wake list     jq:{q#p}:wake
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  key prefix    jq:{q#p}:
-- ARGV[3]  run_id
-- ARGV[4]  fence the worker claimed with
-- Returns  {1, 'released'}, or {0, reason, current_fence} when refused (as in heartbeat.lua).
--
-- The fence is not changed here: the next claim increments it, and until then the run is
-- pending, so the releasing worker can no longer heartbeat or commit.

local now = clock(ARGV[1])
local prefix, run_id, fence = ARGV[2], ARGV[3], tonumber(ARGV[4])
local key = prefix .. 'run:' .. run_id
local run = load_run(key, 'state', 'fence', 'attempt', 'owner')
local why = refusal(run, fence)
if why then return {0, why, tonumber(run.fence) or 0} end

local attempt = math.max((tonumber(run.attempt) or 1) - 1, 0)
redis.call('HSET', key, 'state', 'pending', 'attempt', attempt, 'due', now)
redis.call('HDEL', key, 'lease_until', 'owner')
redis.call('ZREM', KEYS[2], run_id)
redis.call('ZADD', KEYS[1], now, run_id)
history(prefix, run_id, now .. ' released fence=' .. fence .. ' owner=' .. (run.owner or '?') ..
        ' (attempt not counted)')
redis.call('LPUSH', KEYS[3], '1')
redis.call('LTRIM', KEYS[3], 0, 15)
return {1, 'released'}
