-- sched_create.lua: create the scheduled runs of one queue partition, SET NX semantics on the
-- run id, for the scheduler. The same record as create_run writes (only what differs from the
-- defaults; no history entry); the difference is the wire format: runs that share a task,
-- payload and fire instant (a herd) come as one group whose shared fields are sent once, and
-- each run id '<job_id>@<fire instant>' is built here (fire_run_id).
--
-- uses: core, wake, records, events
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  wake      list    jq:{q#p}:wake     wakes idle workers
-- KEYS[3]  stats     hash    jq:{q#p}:stats    counters
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3..] groups            8 header fields followed by 2 fields per run (at most 2,000
--                             runs): count, task, payload (JSON), max_attempts, lease_ms,
--                             timeout_ms, fire instant (UTC text, as run ids spell it),
--                             scheduled_for (ms); then per run: job_id, due (ms; a buffered
--                             buffer-one run is due at the far HOLD time)
-- Returns  {now, created}: how many runs this call created (the others existed already and
--          were left untouched). Refused whole (an error reply, nothing created) when a key
--          is not on this node or an index key holds another type.
-- Events (see event_log in lib/events.lua): 'created' ('<due ms>|<task>') per run created.

local now = clock(ARGV[1])
local run_prefix = ARGV[2] .. 'run:'
local HEADER = 8

local ok, plan = reading(function()
  local p = {exists = {}}
  expect(KEYS[1], 'zset')
  p.wake = waker(KEYS[2])
  p.stats = counters(KEYS[3], 'created')
  p.log = event_log(ARGV[2])
  local i = 3
  while i <= #ARGV do
    local count, instant = tonumber(ARGV[i]), ARGV[i + 6]
    local j = i + HEADER
    -- The runs of a fire time are nearly always all new: one EXISTS over the group's keys,
    -- and the per-run check only when some exist already (another scheduler, a crash, a
    -- backfill).
    local keys = {}
    for k = 1, count do keys[k] = run_prefix .. fire_run_id(ARGV[j + 2 * k - 2], instant) end
    local some = 0
    for lo = 1, count, 1000 do
      some = some + read('EXISTS', unpack(keys, lo, math.min(count, lo + 999)))
    end
    for k = 1, count do
      p.exists[j + 2 * k - 2] = some > 0 and read('EXISTS', keys[k]) == 1
    end
    i = j + 2 * count
  end
  return p
end)
if not ok then return plan end

local created = 0
local zadd = {} -- one ZADD for the call
local i = 3
while i <= #ARGV do
  local count = tonumber(ARGV[i])
  local task, payload, attempts = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local lease, timeout, instant, sched_for = ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7]
  local j = i + HEADER
  for _ = 1, count do
    if not plan.exists[j] then
      local job, due = ARGV[j], ARGV[j + 1]
      local run_id = fire_run_id(job, instant)
      write_pending(run_prefix .. run_id, now, due, task, payload, attempts, lease, timeout, job,
                    sched_for)
      created = created + 1
      zadd[2 * created - 1] = due
      zadd[2 * created] = run_id
      emit(plan.log, 'created', run_id, due .. '|' .. task)
    end
    j = j + 2
  end
  i = j
end

if created > 0 then
  bulk('ZADD', KEYS[1], zadd, 2000)
  bump(plan.stats, 'created', created)
  wake(plan.wake, created)
  trim_events(plan.log)
end
return {now, created}
