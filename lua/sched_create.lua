-- sched_create.lua: create the scheduled runs of one queue partition, SET NX semantics on the
-- run id, for the scheduler. The same record as create_run writes (only what differs from the
-- defaults; no history entry: creation is the record's created and due fields); the
-- difference is the wire format: runs that share a task, payload and fire instant (a herd)
-- come as one group whose shared fields are sent once, and the run id
-- '<job_id>@<fire instant>' is built here.
--
-- KEYS[1]  due zset      jq:{q#p}:due
-- KEYS[2]  wake list     jq:{q#p}:wake
-- KEYS[3]  stats hash    jq:{q#p}:stats
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  key prefix    jq:{q#p}:
-- ARGV[3..] groups of 8 header fields followed by 2 fields per run (at most 2,000 runs):
--          count, task, payload (JSON), max_attempts, lease_ms, timeout_ms,
--          run id suffix ('@<fire instant>'), scheduled_for (ms);
--          then per run: job_id, due (ms; a held buffer-one run is due at the far HOLD time)
-- Returns  {now, created}: how many runs this call created (the others existed already and
--          were left untouched).

local now = clock(ARGV[1])
local run_prefix = ARGV[2] .. 'run:'
local HEADER = 8
local created = 0
local zadd = {} -- one ZADD for the call (at most 2,000 runs: unpack has a stack limit)

local i = 3
while i <= #ARGV do
  local count = tonumber(ARGV[i])
  local task, payload, attempts = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local lease, timeout, suffix, sched_for = ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7]
  local j = i + HEADER
  -- The runs of a fire time are nearly always all new: one EXISTS over the group's keys, and
  -- the per-run check only when some exist already (another scheduler, a crash, a backfill).
  local run_ids, keys = {}, {}
  for k = 1, count do
    run_ids[k] = ARGV[j + 2 * k - 2] .. suffix
    keys[k] = run_prefix .. run_ids[k]
  end
  local some_exist = false
  for lo = 1, count, 1000 do
    if redis.call('EXISTS', unpack(keys, lo, math.min(count, lo + 999))) > 0 then
      some_exist = true
    end
  end
  for k = 1, count do
    local job, due = ARGV[j], ARGV[j + 1]
    local key = keys[k]
    if not some_exist or redis.call('EXISTS', key) == 0 then
      redis.call('HSET', key, 'state', 'pending', 'task', task, 'payload', payload,
        'due', due, 'max_attempts', attempts, 'created', now, 'job', job,
        'scheduled_for', sched_for)
      if lease ~= '0' then redis.call('HSET', key, 'lease_ms', lease) end
      if timeout ~= '0' then redis.call('HSET', key, 'timeout_ms', timeout) end
      created = created + 1
      zadd[2 * created - 1] = due
      zadd[2 * created] = run_ids[k]
    end
    j = j + 2
  end
  i = j
end

if created > 0 then
  redis.call('ZADD', KEYS[1], unpack(zadd))
  redis.call('HINCRBY', KEYS[3], 'created', created)
  -- A few tokens at most: enough to wake several idle workers, never a growing list.
  for _ = 1, math.min(created, 8) do redis.call('LPUSH', KEYS[2], '1') end
  redis.call('LTRIM', KEYS[2], 0, 15)
end
return {now, created}
