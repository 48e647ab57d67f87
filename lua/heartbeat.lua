-- heartbeat.lua: extend the leases a worker holds in one partition, fence by fence.
--
-- KEYS[1]  leases zset   jq:{q#p}:leases
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  key prefix    jq:{q#p}:
-- ARGV[3]  default lease ms (used when the run has no lease of its own)
-- ARGV[4..] pairs: run_id, fence
-- Returns  {now, r1, r2, ...}: per run the new lease expiry (ms), or a refusal string:
--          'fenced' (another claim took the run), 'cancelled', 'finished', 'not-running'
--          (released or back to pending) or 'unknown' (no such run). A refused worker must
--          stop the work: its commit will be refused too.

local now = clock(ARGV[1])
local prefix, default_lease = ARGV[2], tonumber(ARGV[3])
local out = {now}

for i = 4, #ARGV, 2 do
  local run_id, fence = ARGV[i], tonumber(ARGV[i + 1])
  local key = prefix .. 'run:' .. run_id
  local run = load_run(key, 'state', 'fence', 'lease_ms')
  local why = refusal(run, fence)
  if why then
    out[#out + 1] = why
  else
    local lease = tonumber(run.lease_ms) or 0
    if lease <= 0 then lease = default_lease end
    local lease_until = now + lease
    redis.call('HSET', key, 'lease_until', lease_until)
    redis.call('ZADD', KEYS[1], lease_until, run_id)
    out[#out + 1] = lease_until
  end
end
return out
