-- fail.lua: record a failed attempt, only from the holder of the current fence; retry or bury.
--
-- uses: core, wake, fences, priority, groups, records, events, workflows, bury, slots
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  leases    zset    jq:{q#p}:leases   run_id -> lease expiry (ms)
-- KEYS[3]  dead      zset    jq:{q#p}:dead     run_id -> time it died
-- KEYS[4]  stats     hash    jq:{q#p}:stats    counters
-- KEYS[5]  wake      list    jq:{q#p}:wake     a retry wakes an idle worker to re-plan
-- KEYS[6]  limits    hash    jq:{q#p}:limits   flow limits: under a concurrency limit, a
--                                              burial frees a slot and wakes a worker too
-- KEYS[7]  prio      zset    jq:{q#p}:prio     run_id -> (9 - priority) * 2^43 + due time,
--                                              the runs above the default priority
-- KEYS[8]  parked    zset    jq:{q#p}:parked   run_id -> original due time: the runs
--                                              parked by a per-key or per-task cap
-- KEYS[9]  outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  run_id             the run
-- ARGV[4]  fence              fence the worker claimed with
-- ARGV[5]  error              error text
-- ARGV[6]  retry_delay_ms     the caller's backoff for this attempt, or '' for no retry
-- ARGV[7]  dead_retention_ms  how long dead records live
-- ARGV[8]  traceback          the attempt's traceback ('' for none), kept with its history
--                             entry after a newline and RS ('\n\030'), cut at 64 KiB
-- Returns  {1, 'retry', due} when the run goes back to pending at due (and, above the
--          default priority, to the prio zset: it keeps its priority; with fair shares on,
--          to its group's queue instead, group_enter in lib/groups.lua);
--          {1, 'dead'} when attempts are exhausted (or no retry was asked) and it is buried
--          ({1, 'dead', 1} when runs wait on it: it went to the outbox, see finish_record in
--          lib/workflows.lua; an outbox of another type refuses the call whole);
--          {0, reason, current_fence} when refused (reason as in heartbeat.lua). Refused
--          whole (an error reply, nothing changed) when a key is not on this node or an
--          index key holds another type.
--
-- A run taking slots of per-key or per-task caps (record field 'held', see claim.lua) frees
-- them here, and the oldest parked run of each such group is put back at its original due
-- time (waking an idle worker), with its priority hint in jq:{q#p}:prio (reached by the
-- prefix) when it has a priority; an occupant (held:<group>), parked or prio key of another
-- type refuses the call whole.
-- (A retried run takes a slot again at its next claim.)
-- Events (see event_log in lib/events.lua): 'retry' ('<attempt>|<due>') or 'dead', and 'refused'
-- for a refused call whose record exists.

local now = clock(ARGV[1])
local prefix, run_id, fence, err = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local delay, dead_retention = tonumber(ARGV[6]), tonumber(ARGV[7])
local tb = ARGV[8] or ''
-- the history entry's tail: the worker bounds it (Settings.traceback_max_*); this caps a
-- foreign caller's
if tb ~= '' then tb = '\n\030' .. utf8_tail(tb, 65536) end
local key = prefix .. 'run:' .. run_id

local ok, plan = reading(function()
  -- A foreign caller's bad number would fail a write half-way (ZADD due 'nan', PEXPIRE 1.5).
  if ARGV[6] ~= '' and not whole(ARGV[6], 0) then
    refuse('ERR jobqueue: retry_delay_ms is a whole number of ms or empty, not ' .. ARGV[6])
  end
  if not whole(ARGV[7], 0) then
    refuse('ERR jobqueue: dead_retention_ms is a whole number of ms, not ' .. tostring(ARGV[7]))
  end
  local p = {}
  p.run = load_run(key, 'state', 'fence', 'attempt', 'max_attempts', 'owner', 'priority',
                   'held', 'task', 'limit_key', 'parents')
  p.why = refusal(p.run, fence)
  p.log = event_log(prefix)
  p.stats = counters(KEYS[4], 'rejected', 'failed', 'retried', 'dead')
  if not p.why then
    expect(KEYS[1], 'zset')
    expect(KEYS[2], 'zset')
    expect(KEYS[3], 'zset')
    expect(KEYS[7], 'zset')
    p.wake = waker(KEYS[5])
    local cap = checked(redis.pcall('HGET', KEYS[6], 'concurrency'), KEYS[6], true)
    p.capped = count(cap, 0)
    p.hist = history_ok(prefix, run_id)
    p.group = group_of(prefix, p.run.limit_key, fair_partition(prefix))
    p.freer = slot_freer(prefix, KEYS[1], KEYS[8])
    p.freer.free(run_id, slot_groups(p.run))
    local attempt = tonumber(p.run.attempt) or 0
    if not (delay and attempt < (tonumber(p.run.max_attempts) or 1)) then -- it will be buried
      p.outbox = outbox_entry(KEYS[9], p.run, run_id, now)
    end
  end
  return p
end)
if not ok then return plan end

if plan.why then
  bump(plan.stats, 'rejected', 1)
  if plan.why ~= 'unknown' then
    emit(plan.log, 'refused', run_id, plan.why)
    trim_events(plan.log)
  end
  return {0, plan.why, plan.run and whole_or(plan.run.fence, 0, 0) or 0}
end

local run = plan.run
local attempt, max_attempts = tonumber(run.attempt) or 0, tonumber(run.max_attempts) or 1
local ended = ' fence=' .. int(fence) .. ' attempt=' .. attempt .. ' owner=' .. (run.owner or '?')

if delay and attempt < max_attempts then
  local due = now + delay
  redis.call('HSET', key, 'state', 'pending', 'error', err, 'due', due)
  -- a worker had the task: a later hand-back (bounce.lua) starts a new window
  redis.call('HDEL', key, 'lease_until', 'held', 'unknown_since', 'bounces')
  if plan.hist then
    history(prefix, run_id, now .. ' failed' .. ended .. ' retry at ' .. due .. ': ' ..
            utf8_head(err, 200) .. tb)
  end
  redis.call('ZADD', KEYS[1], due, run_id)
  local level = priority_of(run.priority)
  if plan.group then -- (fair shares: back in its group's queue, lib/groups.lua)
    group_enter(prefix, plan.group, run_id, prio_score(level, due), due)
  elseif level > 0 then
    redis.call('ZADD', KEYS[7], prio_score(level, due), run_id)
  end
  redis.call('ZREM', KEYS[2], run_id)
  bump(plan.stats, 'failed', 1)
  bump(plan.stats, 'retried', 1)
  wake(plan.wake, 1 + free_slots(plan.freer, prefix, KEYS[1], KEYS[8]))
  emit(plan.log, 'retry', run_id, attempt .. '|' .. int(due))
  trim_events(plan.log)
  return {1, 'retry', due}
end

bury(KEYS[3], prefix, run_id, now, err, ended .. ': ' .. utf8_head(err, 200) .. tb,
     dead_retention, plan.hist, plan.outbox, plan.log, attempt)
trim_index(KEYS[3], now, dead_retention)
redis.call('ZREM', KEYS[2], run_id)
if run.held then redis.call('HDEL', key, 'held') end
local unparked = free_slots(plan.freer, prefix, KEYS[1], KEYS[8])
bump(plan.stats, 'failed', 1)
bump(plan.stats, 'dead', 1)
if plan.capped then wake(plan.wake, 1) end
wake(plan.wake, unparked)
trim_events(plan.log)
return plan.outbox and {1, 'dead', 1} or {1, 'dead'}
