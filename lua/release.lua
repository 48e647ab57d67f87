-- release.lua: hand a running run back to the queue without counting an attempt (graceful
-- shutdown); only from the holder of the current fence.
--
-- uses: core, wake, fences, priority, groups, records, events, slots
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  leases    zset    jq:{q#p}:leases   run_id -> lease expiry (ms)
-- KEYS[3]  wake      list    jq:{q#p}:wake     wakes an idle worker to take it
-- KEYS[4]  prio      zset    jq:{q#p}:prio     run_id -> (9 - priority) * 2^43 + due time,
--                                              the runs above the default priority
-- KEYS[5]  parked    zset    jq:{q#p}:parked   run_id -> original due time: the runs
--                                              parked by a per-key or per-task cap
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  run_id             the run
-- ARGV[4]  fence              fence the worker claimed with
-- Returns  {1, 'released'}, or {0, reason, current_fence} when refused (as in heartbeat.lua).
--          Refused whole (an error reply, nothing changed) when a key is not on this node or
--          an index key holds another type.
--
-- The fence is not changed here: the next claim issues a new one, and until then the run is
-- pending, so the releasing worker can no longer heartbeat or commit. A run above the
-- default priority goes back to the prio zset too: it keeps its priority. With fair shares
-- on, it goes back to its group's queue instead (group_enter in lib/groups.lua; a gconf, gq,
-- gof or gwait key of another type refuses the call whole).
--
-- A run taking slots of per-key or per-task caps (record field 'held', see claim.lua) frees
-- them here, and the oldest parked run of each such group is put back at its original due
-- time (waking an idle worker), with its priority hint in jq:{q#p}:prio (reached by the
-- prefix) when it has a priority; an occupant (held:<group>), parked or prio key of another
-- type refuses the call whole.
-- Events (see event_log in lib/events.lua): 'released' ('<attempt given back>|<worker>'), and
-- 'refused' for a refused call whose record exists.

local now = clock(ARGV[1])
local prefix, run_id, fence = ARGV[2], ARGV[3], tonumber(ARGV[4])
local key = prefix .. 'run:' .. run_id

local ok, plan = reading(function()
  local p = {run = load_run(key, 'state', 'fence', 'attempt', 'owner', 'priority', 'held',
                            'task', 'limit_key')}
  p.why = refusal(p.run, fence)
  p.log = event_log(prefix)
  if not p.why then
    expect(KEYS[1], 'zset')
    expect(KEYS[2], 'zset')
    expect(KEYS[4], 'zset')
    p.wake = waker(KEYS[3])
    p.hist = history_ok(prefix, run_id)
    p.group = group_of(prefix, p.run.limit_key, fair_partition(prefix))
    p.freer = slot_freer(prefix, KEYS[1], KEYS[5])
    p.freer.free(run_id, slot_groups(p.run))
  end
  return p
end)
if not ok then return plan end
if plan.why then
  if plan.why ~= 'unknown' then
    emit(plan.log, 'refused', run_id, plan.why)
    trim_events(plan.log)
  end
  return {0, plan.why, plan.run and whole_or(plan.run.fence, 0, 0) or 0}
end

local attempt = math.max((tonumber(plan.run.attempt) or 1) - 1, 0)
redis.call('HSET', key, 'state', 'pending', 'attempt', attempt, 'due', now)
-- a worker that had the task: a later hand-back (bounce.lua) starts a new window
redis.call('HDEL', key, 'lease_until', 'owner', 'held', 'unknown_since', 'bounces')
if plan.hist then
  history(prefix, run_id, now .. ' released fence=' .. int(fence) .. ' owner=' ..
          (plan.run.owner or '?') .. ' (attempt not counted)')
end
redis.call('ZADD', KEYS[1], now, run_id)
local level = priority_of(plan.run.priority)
if plan.group then -- (fair shares: back in its group's queue, lib/groups.lua)
  group_enter(prefix, plan.group, run_id, prio_score(level, now), now)
elseif level > 0 then
  redis.call('ZADD', KEYS[4], prio_score(level, now), run_id)
end
redis.call('ZREM', KEYS[2], run_id)
wake(plan.wake, 1 + free_slots(plan.freer, prefix, KEYS[1], KEYS[5]))
-- the attempt that was given back (not counted: the record's attempt is one less now)
emit(plan.log, 'released', run_id, int(whole_or(plan.run.attempt, 0, 0)) .. '|' ..
     (plan.run.owner or ''))
trim_events(plan.log)
return {1, 'released'}
