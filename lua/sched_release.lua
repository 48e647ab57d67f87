-- sched_release.lua: overlap policy buffer-one. A buffered run is created due at the far
-- HOLD time, so no claim can take it; this script releases it, due at its real due time,
-- once the job's previous run has finished. Both runs belong to one job, hence to one queue
-- partition (partitions go by job id): the check and the release are one atomic step in one
-- slot, so the buffered run can never start while its predecessor is pending or running.
-- Only when the job's queue changed between the two fires is the predecessor in another slot:
-- the scheduler then reads its state there first and calls this with no predecessor ('')
-- once it has finished.
--
-- uses: core, wake, records
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  wake      list    jq:{q#p}:wake     wakes idle workers
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  hold_ms            HOLD, the due time (ms) of a buffered run
-- ARGV[4..] buffered          3 fields per buffered run: its run id, predecessor run id
--                             ('' = none), real due (ms)
-- Returns  {now, r1, r2, ...}: per run 0 = still buffered (predecessor pending or running),
--          1 = released now, 2 = nothing to hold any more (already released, cancelled,
--          finished or gone): in both 1 and 2 the caller drops its buffered entry. Refused whole
--          (an error reply, nothing changed) when a key is not on this node or the due index
--          holds another type.

local now = clock(ARGV[1])
local prefix, hold = ARGV[2], tonumber(ARGV[3])

local ok, plan = reading(function()
  local p = {wake = waker(KEYS[2]), runs = {}}
  expect(KEYS[1], 'zset')
  for i = 4, #ARGV, 3 do
    local run_id, pred, due = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
    local run = load_run(prefix .. 'run:' .. run_id, 'state')
    local score = tonumber(read('ZSCORE', KEYS[1], run_id))
    local r = {id = run_id, due = due, verdict = 2}
    if run and run.state == 'pending' and score == hold then
      local before = pred ~= '' and load_run(prefix .. 'run:' .. pred, 'state')
      if before and (before.state == 'pending' or before.state == 'running') then
        r.verdict = 0
      else
        r.verdict, r.hist = 1, history_ok(prefix, run_id)
      end
    end
    p.runs[#p.runs + 1] = r
  end
  return p
end)
if not ok then return plan end

local out = {now}
local released = 0
for _, r in ipairs(plan.runs) do
  if r.verdict == 1 then
    redis.call('HSET', prefix .. 'run:' .. r.id, 'due', r.due)
    redis.call('ZADD', KEYS[1], r.due, r.id)
    if r.hist then
      history(prefix, r.id, now .. ' released due=' .. r.due .. ' (previous run finished)')
    end
    released = released + 1
  end
  out[#out + 1] = r.verdict
end
wake(plan.wake, released)
return out
