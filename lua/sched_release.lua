-- sched_release.lua: overlap policy buffer-one. A buffered run is created held (due at the far
-- HOLD time, so no claim can take it); this script releases it, due at its real due time,
-- once the job's previous run has finished. Both runs belong to one job, hence to one queue
-- partition (partitions go by job id): the check and the release are one atomic step in one
-- slot, so the buffered run can never start while its predecessor is pending or running.
-- Only when the job's queue changed between the two fires is the predecessor in another slot:
-- the scheduler then reads its state there first and calls this with no predecessor ('')
-- once it has finished.
--
-- KEYS[1]  due zset      jq:{q#p}:due
-- KEYS[2]  wake list     jq:{q#p}:wake
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  key prefix    jq:{q#p}:
-- ARGV[3]  HOLD, the due time (ms) of a held run
-- ARGV[4..] 3 fields per held run: held run id, predecessor run id ('' = none), real due (ms)
-- Returns  {now, r1, r2, ...}: per run 0 = still held (predecessor pending or running),
--          1 = released now, 2 = nothing to hold any more (already released, cancelled,
--          finished or gone): in both 1 and 2 the caller drops its held entry.

local now = clock(ARGV[1])
local prefix, hold = ARGV[2], tonumber(ARGV[3])
local out = {now}
local released = 0

for i = 4, #ARGV, 3 do
  local run_id, pred, due = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local key = prefix .. 'run:' .. run_id
  local state = redis.call('HGET', key, 'state')
  local score = tonumber(redis.call('ZSCORE', KEYS[1], run_id))
  if state ~= 'pending' or score ~= hold then
    out[#out + 1] = 2
  else
    local before = pred ~= '' and redis.call('HGET', prefix .. 'run:' .. pred, 'state')
    if before == 'pending' or before == 'running' then
      out[#out + 1] = 0
    else
      redis.call('ZADD', KEYS[1], due, run_id)
      redis.call('HSET', key, 'due', due)
      history(prefix, run_id, now .. ' released due=' .. due .. ' (previous run finished)')
      released = released + 1
      out[#out + 1] = 1
    end
  end
end

if released > 0 then
  for _ = 1, math.min(released, 8) do redis.call('LPUSH', KEYS[2], '1') end
  redis.call('LTRIM', KEYS[2], 0, 15)
end
return out
