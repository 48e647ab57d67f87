-- bounce.lua: a worker that has no code for a run's task hands the run back for a worker that
-- has (a rolling deploy: new code enqueues a task the old workers do not know yet; two apps
-- sharing a queue). The attempt is not counted; the run is due again after a delay that
-- doubles at each hand-back, and it is buried only when hand-backs have gone on for the whole
-- window. Only from the holder of the current fence.
--
-- uses: core, wake, fences, priority, groups, records, events, workflows, bury, slots
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  leases    zset    jq:{q#p}:leases   run_id -> lease expiry (ms)
-- KEYS[3]  dead      zset    jq:{q#p}:dead     run_id -> time it died
-- KEYS[4]  stats     hash    jq:{q#p}:stats    counters ('bounced', 'dead')
-- KEYS[5]  wake      list    jq:{q#p}:wake     a freed slot wakes an idle worker
-- KEYS[6]  prio      zset    jq:{q#p}:prio     run_id -> (9 - priority) * 2^43 + due time,
--                                              the runs above the default priority
-- KEYS[7]  parked    zset    jq:{q#p}:parked   run_id -> original due time: the runs
--                                              parked by a per-key or per-task cap
-- KEYS[8]  outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  run_id             the run
-- ARGV[4]  fence              fence the worker claimed with
-- ARGV[5]  owner              the worker handing it back (for the history)
-- ARGV[6]  delay_ms           the delay after the first hand-back; it doubles at each
-- ARGV[7]  delay_cap_ms       the longest delay
-- ARGV[8]  window_ms          how long hand-backs may go on (from the first) before burial
-- ARGV[9]  dead_retention_ms  how long dead records live
-- ARGV[10] error              why (e.g. "no worker has task 'sync'"): the history's and, at
--                             burial, the record's error, followed by the window's figures
-- ARGV[11] min_hand_backs     the fewest hand-backs before a burial (with the window: a run
--                             claimed rarely, behind a long backlog, is not buried at its
--                             second hand-back)
-- Returns  {1, 'bounced', due, hand_backs} when the run is pending again, due at due;
--          {1, 'dead', hand_backs} when the window is over, after at least min_hand_backs,
--          and it is buried;
--          {0, reason, current_fence} when refused (reason as in heartbeat.lua). Refused whole
--          (an error reply, nothing changed) when a key is not on this node, an index key
--          holds another type, or an argument other than the fence is not a whole number (a
--          garbage fence is refused as 'fenced', as in heartbeat.lua).
--
-- The record keeps 'unknown_since' (the first hand-back's time) and 'bounces' (how many);
-- a worker that had the task (fail.lua's retry, release.lua), a claim taking back an expired
-- lease (its holder may have had it) and a requeue clear them, so a later hand-back starts a
-- new window. The fence is not changed here: the next claim issues
-- a new one. Slots of per-key or per-task caps are freed as in release.lua. A run handed back
-- keeps its priority (the prio zset), or with fair shares on goes back to its group's queue
-- (group_enter in lib/groups.lua; a gconf, gq, gof or gwait key of another type refuses the
-- call whole).
-- Events (see event_log in lib/events.lua): 'bounced' ('<hand_backs>|<worker>') or 'dead', and
-- 'refused' for a refused call whose record exists.

local now = clock(ARGV[1])
local prefix, run_id, fence, owner = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local key = prefix .. 'run:' .. run_id

local ok, plan = reading(function()
  for _, a in ipairs({{6, 'delay_ms'}, {7, 'delay_cap_ms'}, {8, 'window_ms'},
                      {9, 'dead_retention_ms'}, {11, 'min_hand_backs'}}) do
    if not whole(ARGV[a[1]], 0) then
      refuse('ERR jobqueue: ' .. a[2] .. ' is a whole number, not ' .. tostring(ARGV[a[1]]))
    end
  end
  if type(ARGV[5]) ~= 'string' or type(ARGV[10]) ~= 'string' then
    refuse('ERR jobqueue: bounce needs the owner and the error text')
  end
  local p = {run = load_run(key, 'state', 'fence', 'attempt', 'owner', 'priority', 'held',
                            'task', 'limit_key', 'unknown_since', 'bounces', 'parents')}
  p.why = refusal(p.run, fence)
  p.log = event_log(prefix)
  p.stats = counters(KEYS[4], 'bounced', 'dead')
  if not p.why then
    expect(KEYS[1], 'zset')
    expect(KEYS[2], 'zset')
    expect(KEYS[3], 'zset')
    expect(KEYS[6], 'zset')
    p.wake = waker(KEYS[5])
    p.hist = history_ok(prefix, run_id)
    p.group = group_of(prefix, p.run.limit_key, fair_partition(prefix))
    p.freer = slot_freer(prefix, KEYS[1], KEYS[7])
    p.freer.free(run_id, slot_groups(p.run))
    -- (read whether or not it is buried: a version nobody uses is harmless)
    p.outbox = outbox_entry(KEYS[8], p.run, run_id, now)
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

local run = plan.run
local delay, cap = tonumber(ARGV[6]), tonumber(ARGV[7])
local window, retention = tonumber(ARGV[8]), tonumber(ARGV[9])
local since = whole_or(run.unknown_since, 0, now)
if since > now then since = now end -- a garbage or future field starts the window now
local n = math.min(whole_or(run.bounces, 0, 0), 1e9) + 1 -- (garbage: a bounded count)
local by = ' fence=' .. int(fence) .. ' owner=' .. owner .. ': '

redis.call('ZREM', KEYS[2], run_id)
bump(plan.stats, 'bounced', 1)
local attempt = math.max((tonumber(run.attempt) or 1) - 1, 0)
local function secs(ms)
  if ms % 1000 == 0 then return int(ms / 1000) end
  return string.format('%.1f', ms / 1000)
end

if now - since >= window and n >= tonumber(ARGV[11]) then
  local times = n == 1 and ' once' or (' ' .. int(n) .. ' times')
  local err = ARGV[10] .. ' (handed back' .. times .. ' over ' .. secs(now - since) ..
              ' s, the window is ' .. secs(window) .. ' s)'
  redis.call('HSET', key, 'attempt', attempt)
  redis.call('HDEL', key, 'held', 'unknown_since', 'bounces')
  bury(KEYS[3], prefix, run_id, now, err, by .. utf8_head(err, 300), retention, plan.hist,
       plan.outbox, plan.log, attempt)
  trim_events(plan.log)
  trim_index(KEYS[3], now, retention)
  bump(plan.stats, 'dead', 1)
  wake(plan.wake, 1 + free_slots(plan.freer, prefix, KEYS[1], KEYS[7]))
  return {1, 'dead', int(n)}
end

-- delay * 2^(n-1), at most cap (the exponent bounded: no overflow to inf)
local due = now + math.min(cap, delay * 2 ^ math.min(n - 1, 40))
redis.call('HSET', key, 'state', 'pending', 'attempt', attempt, 'due', due,
           'unknown_since', int(since), 'bounces', int(n))
redis.call('HDEL', key, 'lease_until', 'owner', 'held')
if plan.hist then
  history(prefix, run_id, now .. ' handed back' .. by .. utf8_head(ARGV[10], 200) ..
          ' (attempt not counted; due at ' .. int(due) .. ')')
end
redis.call('ZADD', KEYS[1], due, run_id)
local level = priority_of(run.priority)
if plan.group then -- (fair shares: back in its group's queue, lib/groups.lua)
  group_enter(prefix, plan.group, run_id, prio_score(level, due), due)
elseif level > 0 then
  redis.call('ZADD', KEYS[6], prio_score(level, due), run_id)
end
wake(plan.wake, 1 + free_slots(plan.freer, prefix, KEYS[1], KEYS[7]))
emit(plan.log, 'bounced', run_id, int(n) .. '|' .. owner)
trim_events(plan.log)
return {1, 'bounced', due, int(n)}
