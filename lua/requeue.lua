-- requeue.lua: put a finished run (dead, cancelled, or done when forced) back to pending,
-- attempts reset.
--
-- uses: core, wake, priority, groups, records, sequence, events
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  dead      zset    jq:{q#p}:dead     run_id -> time it died
-- KEYS[3]  done      zset    jq:{q#p}:done     run_id -> finish time
-- KEYS[4]  wake      list    jq:{q#p}:wake     wakes an idle worker to take it
-- KEYS[5]  prio      zset    jq:{q#p}:prio     run_id -> (9 - priority) * 2^43 + due time,
--                                              the runs above the default priority
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  run_id             the run
-- ARGV[4]  force              '1': a done run too (it runs again); '0': done runs are refused
-- Returns  {1, previous_state} when requeued; {0, 'unknown'} when there is no such run (or
--          its key is not a run record); {0, state} when it is still pending, running or
--          waiting, or done without force; {0, 'workflow-step'} for a workflow step that
--          waited on other runs (its arguments came from them: create the workflow again
--          instead), or one of a workflow whose creation is not committed ('staged'). Nothing requeued then. Refused whole (an error reply, nothing
--          changed) when a key is not on this node or an index key holds another type.
--
-- The fence is kept (it only ever grows), so nothing stale can commit into the new life. The
-- record keeps no field of the life that ended (result, error, owner, start, finish,
-- progress): the
-- history keeps how it ended, so that every earlier attempt stays in the run's story. A run
-- above the default priority goes back to the prio zset too: it keeps its priority (with
-- fair shares on, its group's queue instead: group_enter in lib/groups.lua; a gconf, gq, gof or
-- gwait key of another type refuses the call whole). A run
-- cancelled before its due time (a delayed run, or one waiting out a retry's back-off) is
-- due at that time again, not at once; any other is due now, a buffered buffer-one run too (its
-- due field, the far hold time, is past MAX_DUE_MS). A hand-back window (bounce.lua) starts
-- anew.
-- Events (see event_log in lib/events.lua): 'requeued' ('<the state it had>').

local now = clock(ARGV[1])
local prefix, run_id, force = ARGV[2], ARGV[3], ARGV[4] == '1'
local key = prefix .. 'run:' .. run_id

local ok, plan = reading(function()
  local p = {run = load_run(key, 'state', 'attempt', 'owner', 'started', 'finished', 'fence',
                            'result', 'priority', 'due', 'left', 'staged', 'limit_key')}
  local state = p.run and p.run.state
  -- A workflow step that waited on others ('left') has a payload built from what it heard
  -- of them, or none yet: run again alone it would get the wrong arguments. A staged one
  -- (its workflow not committed, see flow_commit.lua) must not run at all.
  if p.run and (p.run.left or p.run.staged) then p.step = true end
  if state and not p.step and state ~= 'pending' and state ~= 'running' and
     state ~= 'waiting' and (state ~= 'done' or force) then
    expect(KEYS[1], 'zset')
    expect(KEYS[2], 'zset')
    expect(KEYS[3], 'zset')
    expect(KEYS[5], 'zset')
    p.wake = waker(KEYS[4])
    p.hist = history_ok(prefix, run_id)
    p.log = event_log(prefix)
    p.group = group_of(prefix, p.run.limit_key, fair_partition(prefix))
  end
  return p
end)
if not ok then return plan end
local run = plan.run
if not run or not run.state then return {0, 'unknown'} end
if run.state == 'pending' or run.state == 'running' or run.state == 'waiting' then
  return {0, run.state}
end
if plan.step then return {0, 'workflow-step'} end
if run.state == 'done' and not force then return {0, 'done'} end

local due = now
if run.state == 'cancelled' then
  -- (not a buffered buffer-one run's far hold time: nothing would release it any more)
  local own = whole_or(run.due, 0, now)
  if own > now and own < MAX_DUE_MS then due = own end
end
redis.call('HSET', key, 'state', 'pending', 'attempt', 0, 'due', due)
redis.call('HDEL', key, 'finished', 'result', 'error', 'owner', 'started', 'lease_until',
           'progress', 'progress_message', 'progress_at', 'progress_attempt', 'unknown_since',
           'bounces')
redis.call('PERSIST', key)
if plan.hist then
  redis.call('PERSIST', prefix .. 'hist:' .. run_id)
  -- What the record showed of the life that ended (its latest claim, a success) goes to the
  -- history, as the timeline showed it; a cancel already wrote the fence its claim had.
  if run.owner and run.started and (tonumber(run.attempt) or 0) >= 1 then
    local fence = ''
    if run.state ~= 'cancelled' then fence = ' fence=' .. (run.fence or '0') end
    history(prefix, run_id, run.started .. ' claimed' .. fence .. ' attempt=' .. run.attempt ..
            ' owner=' .. run.owner)
  end
  if run.state == 'done' and run.finished then
    history(prefix, run_id, run.finished .. ' done fence=' .. (run.fence or '0') .. ': ' ..
            utf8_head(run.result or '', 200))
  end
  history(prefix, run_id, now .. ' requeued (was ' .. run.state .. ')')
end
redis.call('ZADD', KEYS[1], due, run_id)
local level = priority_of(run.priority)
if plan.group then -- (fair shares: back in its group's queue, lib/groups.lua)
  group_enter(prefix, plan.group, run_id, prio_score(level, due), due)
elseif level > 0 then
  redis.call('ZADD', KEYS[5], prio_score(level, due), run_id)
end
redis.call('ZREM', KEYS[2], run_id)
redis.call('ZREM', KEYS[3], run_id)
wake(plan.wake, 1)
emit(plan.log, 'requeued', run_id, run.state)
trim_events(plan.log)
return {1, run.state}
