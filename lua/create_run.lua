-- create_run.lua: create runs with SET NX semantics on the run id; batched for one partition.
--
-- KEYS[1]  due zset      jq:{q#p}:due
-- KEYS[2]  wake list     jq:{q#p}:wake
-- KEYS[3]  stats hash    jq:{q#p}:stats
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  key prefix    jq:{q#p}:
-- ARGV[3]  queue name
-- ARGV[4..] 10 fields per run:
--          run_id, task, payload (JSON), due_at (absolute ms or ''), delay_ms,
--          max_attempts, lease_ms, timeout_ms, job_id, scheduled_for (ms or '')
-- Returns  {now, r1, r2, ...}: per run 1 = created, 0 = already exists (nothing written).
--
-- A created run is pending, in the due zset at due_at or now + delay_ms, and a wake token is
-- pushed so an idle worker blocked on the wake list claims it at once.

local now = clock(ARGV[1])
local prefix, queue = ARGV[2], ARGV[3]
local STRIDE = 10
local out = {now}
local created = 0

for i = 4, #ARGV, STRIDE do
  local run_id = ARGV[i]
  local key = prefix .. 'run:' .. run_id
  if redis.call('EXISTS', key) == 1 then
    out[#out + 1] = 0
  else
    local due = tonumber(ARGV[i + 3]) or (now + (tonumber(ARGV[i + 4]) or 0))
    redis.call('HSET', key,
      'state', 'pending', 'queue', queue, 'task', ARGV[i + 1], 'payload', ARGV[i + 2],
      'due', due, 'attempt', 0, 'max_attempts', ARGV[i + 5], 'fence', 0,
      'lease_ms', ARGV[i + 6], 'timeout_ms', ARGV[i + 7], 'job', ARGV[i + 8],
      'created', now)
    if ARGV[i + 9] ~= '' then redis.call('HSET', key, 'scheduled_for', ARGV[i + 9]) end
    redis.call('ZADD', KEYS[1], due, run_id)
    history(prefix, run_id, now .. ' created due=' .. due)
    created = created + 1
    out[#out + 1] = 1
  end
end

if created > 0 then
  redis.call('HINCRBY', KEYS[3], 'created', created)
  -- A few tokens at most: enough to wake several idle workers, never a growing list.
  for _ = 1, math.min(created, 8) do redis.call('LPUSH', KEYS[2], '1') end
  redis.call('LTRIM', KEYS[2], 0, 15)
end
return out
