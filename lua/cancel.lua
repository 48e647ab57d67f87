-- cancel.lua: cancel a pending, waiting or running run; issues a new fence (as claim does, from the
-- partition's counter) so a running worker is refused at its next heartbeat or commit.
--
-- uses: core, wake, fences, groups, records, events, workflows, slots
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  leases    zset    jq:{q#p}:leases   run_id -> lease expiry (ms)
-- KEYS[3]  done      zset    jq:{q#p}:done     run_id -> finish time (done and cancelled)
-- KEYS[4]  stats     hash    jq:{q#p}:stats    counters
-- KEYS[5]  fences    string  jq:{q#p}:fences   the last fence issued in the partition
-- KEYS[6]  parked    zset    jq:{q#p}:parked   run_id -> original due time: the runs
--                                              parked by a per-key or per-task cap
-- KEYS[7]  wake      list    jq:{q#p}:wake     wakes an idle worker for an unparked run
-- KEYS[8]  waiting   zset    jq:{q#p}:waiting  run_id -> creation time: the waiting runs
-- KEYS[9]  outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear, and
--                                              '!<run_id>' orders
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  run_id             the run
-- ARGV[4]  retention_ms       how long the cancelled record lives
-- ARGV[5]  reason             free text, stored as the error
-- ARGV[6]  running            '1': a running run is cancelled too; '0': it is left running
--                             (a workflow's cascade, see below)
-- Returns  {1, previous_state} when cancelled ('pending', 'waiting' or 'running');
--          {0, 'running'} when it runs and ARGV[6] is '0';
--          {0, 'unknown'} when there is no such run (or its key is not a run record);
--          {0, state} when it already finished ('done', 'dead' or 'cancelled'). Refused whole
--          (an error reply, nothing changed) when a key is not on this node or an index key
--          holds another type.
--
-- The done index lists cancelled runs too: entries older than the retention are trimmed here
-- as well, since a partition may see cancellations and no completions.
--
-- A run taking slots of per-key or per-task caps (record field 'held', see claim.lua) frees
-- them here, and the oldest parked run of each such group is put back at its original due
-- time (waking an idle worker), with its priority hint in jq:{q#p}:prio (reached by the
-- prefix) when it has a priority; an occupant (held:<group>), parked or prio key of another
-- type refuses the call whole.
-- A parked run cancelled leaves its parked entries.
-- A pending run of a fair-shares partition (see group_of in lib/groups.lua) leaves its group's
-- queue jq:{q#p}:gq:<group> and jq:{q#p}:gof, so that the group's max_size no longer counts
-- it; a gof or gq key of another type refuses the call whole. (The group stays in the ring
-- until a claim finds its queue empty.)
--
-- Workflows (see finish_record in lib/workflows.lua): a run others wait on goes to the outbox
-- and keeps its record until relayed. A waiting run (its dependencies unfinished) leaves
-- the waiting index, and an order '!<run_id>' goes to the outbox: the relay cancels its unfinished dependencies (cancelling a parent cancels its
-- pending children). A waiting or outbox key of another type refuses the call whole.
-- Events (see event_log in lib/events.lua): 'cancelled' ('<reason head>').

local now = clock(ARGV[1])
local prefix, run_id, retention, reason = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local key = prefix .. 'run:' .. run_id
local CANCELLABLE = {pending = true, running = ARGV[6] ~= '0', waiting = true}

local ok, plan = reading(function()
  local p = {run = load_run(key, 'state', 'fence', 'held', 'task', 'limit_key', 'parked',
                            'parents')}
  if p.run and CANCELLABLE[p.run.state] then
    p.outbox = outbox_entry(KEYS[9], p.run, run_id, now)
    if p.run.state == 'waiting' then
      expect(KEYS[8], 'zset')
      p.order = outbox_entry(KEYS[9], {parents = '!'}, '!' .. run_id, now)
    end
    expect(KEYS[1], 'zset')
    expect(KEYS[2], 'zset')
    expect(KEYS[3], 'zset')
    p.stats = counters(KEYS[4], 'cancelled')
    p.fences = fence_counter(KEYS[5])
    p.hist = history_ok(prefix, run_id)
    p.freer = slot_freer(prefix, KEYS[1], KEYS[6])
    if p.run.state == 'running' then p.freer.free(run_id, slot_groups(p.run)) end
    if p.run.parked then
      expect(KEYS[6], 'zset')
      expect(prefix .. 'parked:' .. p.run.parked, 'zset')
    end
    if p.run.state == 'pending' then
      p.group = group_waited(prefix, run_id)
    end
    p.wake = waker(KEYS[7])
    p.log = event_log(prefix)
  end
  return p
end)
if not ok then return plan end
local run = plan.run
if not run or not run.state then return {0, 'unknown'} end
if not CANCELLABLE[run.state] then return {0, run.state} end

local fence = issue_fence(plan.fences, run.fence)
save_fences(plan.fences)
redis.call('HSET', key, 'state', 'cancelled', 'fence', int(fence), 'finished', now,
           'error', reason)
redis.call('HDEL', key, 'lease_until', 'held', 'parked')
if plan.hist then
  -- A running run's claim had the fence replaced here: the history keeps it.
  local was = run.state
  if was == 'running' then was = was .. ', fence=' .. (run.fence or '0') end
  history(prefix, run_id, now .. ' cancelled (was ' .. was .. '): ' .. utf8_head(reason, 200))
end
finish_record(prefix, run_id, retention, plan.hist, plan.outbox)
if run.state == 'waiting' then
  redis.call('ZREM', KEYS[8], run_id)
  to_outbox(plan.order)
end
redis.call('ZADD', KEYS[3], now, run_id)
trim_index(KEYS[3], now, retention)
if run.state == 'running' then wake(plan.wake, free_slots(plan.freer, prefix, KEYS[1], KEYS[6])) end
if run.parked then
  redis.call('ZREM', prefix .. 'parked:' .. run.parked, run_id)
  redis.call('ZREM', KEYS[6], run_id)
end
if plan.group then group_leave(prefix, plan.group, run_id) end
redis.call('ZREM', KEYS[1], run_id)
redis.call('ZREM', KEYS[2], run_id)
bump(plan.stats, 'cancelled', 1)
emit(plan.log, 'cancelled', run_id, utf8_head(reason, EVENT_TEXT))
trim_events(plan.log)
return {1, run.state}
