-- complete.lua: accept runs' successes, each only from the holder of its current fence.
--
-- KEYS[1]  leases zset   jq:{q#p}:leases
-- KEYS[2]  done zset     jq:{q#p}:done
-- KEYS[3]  stats hash    jq:{q#p}:stats
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  key prefix    jq:{q#p}:
-- ARGV[3]  retention ms of the finished records
-- ARGV[4..] 3 fields per run: run_id, fence the worker claimed with, result (JSON)
-- Returns  one outcome per run, in order: {1, 'done'} when accepted; {0, reason,
--          current_fence} when refused (reason as in heartbeat.lua). A refused commit changes
--          nothing: at most one completion per run is ever accepted.
--
-- Batched: a worker commits every run that finished since its last commit in one call per
-- partition. No history entry: the record's state, owner, fence, attempt, started and
-- finished fields tell a successful attempt; the history keeps what they cannot.

local now = clock(ARGV[1])
local prefix, retention = ARGV[2], tonumber(ARGV[3])
local out = {}
local ids, finished = {}, {} -- for one ZREM and one ZADD for the call
local accepted, refused = 0, 0

for i = 4, #ARGV, 3 do
  local run_id, fence = ARGV[i], tonumber(ARGV[i + 1])
  local key = prefix .. 'run:' .. run_id
  -- refusal() inlined, on the three fields: this loop is the commit path of every run.
  -- pcall: a key that is not a hash answers 'unknown' for its run alone; an error would
  -- abort the script half-way through the batch (Redis does not roll back).
  local v = redis.pcall('HMGET', key, 'state', 'fence', 'hist')
  if v.err then v = {false, false, false} end
  local state, current = v[1], tonumber(v[2]) or 0
  local why = nil
  if not state then why = 'unknown'
  elseif state == 'cancelled' then why = 'cancelled'
  elseif current ~= fence then why = 'fenced'
  elseif state == 'done' or state == 'dead' then why = 'finished'
  elseif state ~= 'running' then why = 'not-running'
  end
  if why then
    refused = refused + 1
    out[#out + 1] = {0, why, current}
  else
    redis.call('HSET', key, 'state', 'done', 'result', ARGV[i + 2], 'finished', now)
    redis.call('HDEL', key, 'lease_until')
    expire_record(prefix, run_id, retention, v[3] ~= false)
    accepted = accepted + 1
    out[#out + 1] = {1, 'done'}
    ids[accepted] = run_id
    finished[2 * accepted - 1] = now
    finished[2 * accepted] = run_id
  end
end

if accepted > 0 then
  bulk('ZREM', KEYS[1], ids, 1000)
  bulk('ZADD', KEYS[2], finished, 2000)
  -- The done index only lists records that still exist: trim what retention expired.
  if retention and retention > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - retention)
  end
  redis.call('HINCRBY', KEYS[3], 'completed', accepted)
end
if refused > 0 then redis.call('HINCRBY', KEYS[3], 'rejected', refused) end
return out
