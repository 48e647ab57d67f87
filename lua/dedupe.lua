-- dedupe.lua: enqueue one run under a deduplication key: create it, or fold it into the run
-- that owns the key (throttle: this one is dropped; debounce: the owning run, still pending,
-- takes this one's payload, meta and due time).
--
-- uses: core, wake, priority, groups, records, sequence, events
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  wake      list    jq:{q#p}:wake     wakes idle workers
-- KEYS[3]  stats     hash    jq:{q#p}:stats    counters
-- KEYS[4]  prio      zset    jq:{q#p}:prio     run_id -> (9 - priority) * 2^43 + due time,
--                                              the runs above the default priority
-- KEYS[5]  dedupe    string  jq:{q#p}:dedupe:<key>  the id of the run owning the key
-- KEYS[6]  seq       hash    jq:{q#p}:seq      {ms, n}: runs created in the current ms, for
--                                              their order (as create_run.lua)
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  mode               'throttle' or 'debounce'
-- ARGV[4]  ttl_ms             the window in ms from the owning run's enqueue, or '' for:
--                             while the owning run waits for its first claim
-- ARGV[5]  key                the deduplication key (stored on the run as 'dedupe')
-- ARGV[6]  run_id             the run to create
-- ARGV[7]  task               its task
-- ARGV[8]  payload            its payload (JSON)
-- ARGV[9]  due_at             absolute due time (ms), or ''
-- ARGV[10] delay_ms           delay from now when due_at is ''
-- ARGV[11] max_attempts       as create_run
-- ARGV[12] lease_ms           as create_run (0: the worker's)
-- ARGV[13] timeout_ms         as create_run (0: none)
-- ARGV[14] priority           0..9 (anything else counts as 0)
-- ARGV[15] meta               JSON object from the enqueue hooks, or ''
-- ARGV[16] limit_key          the key of per-key limits (stored as 'limit_key'), or ''
-- Returns  {now, outcome, run_id}: 'created' (run_id created, and it now owns the key);
--          'existed' (run_id exists already: nothing written); 'deduplicated' (throttle: the
--          owning run_id is kept as it is, nothing written); 'replaced' (debounce: the
--          pending owning run_id now has this payload, meta and due time; its task, attempts
--          and priority stay). Refused whole (an error reply, nothing changed) when a key is
--          not on this node or an index key or the dedupe key holds another type (a wake,
--          stats or seq key of another type is passed over: no token, count or order).
--
-- A run owns the key while the key exists and names it: without a ttl, only while that run
-- is pending (claim deletes the key at the run's first claim); with a ttl, for ttl_ms from the
-- owning run's enqueue (the key expires), whatever its state since, except that
-- debounce can only replace a pending run: past its first claim, a new run takes the key.
-- A key naming no run record (expired, purged, a key of another type) is owned by nobody.
-- With fair shares on, a created run waits in its group's queue (group_enter, lib/groups.lua)
-- and a replaced one moves there to its new due time, instead of the prio zset; a creation
-- past its group's max_size is refused whole ('ERR jobqueue: group full: ...', as
-- create_run.lua); a gconf, gq, gof or gwait key of another type refuses the call whole.
-- Events (see event_log in lib/events.lua): 'created' ('<due ms>|<task>') or 'replaced' ('<due
-- ms>', for the owning run).

local now = clock(ARGV[1])
local prefix, mode, ttl, dkey = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local run_id = ARGV[6]
local key = prefix .. 'run:' .. run_id
local due = tonumber(ARGV[9]) or (now + (tonumber(ARGV[10]) or 0))

local ok, plan = reading(function()
  local p = {}
  expect(KEYS[1], 'zset')
  expect(KEYS[4], 'zset')
  p.wake = waker(KEYS[2])
  p.stats = counters(KEYS[3], 'created', 'deduplicated', 'replaced')
  p.seq = sequencer(KEYS[6], now)
  p.owner_id = read('GET', KEYS[5]) or nil
  local fair = fair_partition(prefix)
  if p.owner_id then
    p.owner_run = load_run(prefix .. 'run:' .. p.owner_id, 'state', 'priority', 'limit_key')
    if p.owner_run and p.owner_run.state == 'pending' then
      p.hist = history_ok(prefix, p.owner_id)
      p.owner_group = group_of(prefix, p.owner_run.limit_key, fair)
    end
  end
  p.exists = read('EXISTS', key) == 1
  p.log = event_log(prefix)
  local owned = p.owner_run and p.owner_run.state ~= nil
  local folds = p.owner_id and ((owned and p.owner_run.state == 'pending') or
                                (ttl and owned and mode == 'throttle'))
  if not folds and not p.exists then -- it creates the run: its group, and the group's max_size
    p.group = group_of(prefix, ARGV[16], fair)
    local max = p.group and read('HGET', prefix .. 'gconf', 'max:' .. p.group)
    if whole(max, 0) then
      local n = read('ZCARD', prefix .. 'gq:' .. p.group)
      if n >= tonumber(max) then
        refuse('ERR jobqueue: group full: group ' .. p.group .. ' of this queue has ' .. n ..
               ' runs waiting, its max_size is ' .. max .. '; nothing was created')
      end
    end
  end
  return p
end)
if not ok then return plan end

local pending = plan.owner_run and plan.owner_run.state == 'pending'
local alive = plan.owner_run and plan.owner_run.state ~= nil
if plan.owner_id and (pending or (ttl and alive and mode == 'throttle')) then
  if mode == 'throttle' then
    bump(plan.stats, 'deduplicated', 1)
    return {now, 'deduplicated', plan.owner_id}
  end
  if pending then
    local owner_key = prefix .. 'run:' .. plan.owner_id
    redis.call('HSET', owner_key, 'payload', ARGV[8], 'due', due)
    if ARGV[15] ~= '' then
      redis.call('HSET', owner_key, 'meta', ARGV[15])
    else
      redis.call('HDEL', owner_key, 'meta')
    end
    redis.call('ZADD', KEYS[1], due, plan.owner_id)
    local level = priority_of(plan.owner_run.priority)
    if plan.owner_group then -- (fair shares: its group's queue, at its new due time)
      group_enter(prefix, plan.owner_group, plan.owner_id, prio_score(level, due), due)
    elseif level > 0 then
      redis.call('ZADD', KEYS[4], prio_score(level, due), plan.owner_id)
    end
    if plan.hist then
      history(prefix, plan.owner_id, now .. ' replaced by a debounced enqueue, due ' .. int(due))
    end
    bump(plan.stats, 'replaced', 1)
    wake(plan.wake, 1)
    emit(plan.log, 'replaced', plan.owner_id, int(due))
    trim_events(plan.log)
    return {now, 'replaced', plan.owner_id}
  end
end

if plan.exists then return {now, 'existed', run_id} end
write_pending(key, now, due, ARGV[7], ARGV[8], ARGV[11], ARGV[12], ARGV[13], '', '')
redis.call('HSET', key, 'dedupe', dkey)
if ARGV[15] ~= '' then redis.call('HSET', key, 'meta', ARGV[15]) end
if ARGV[16] ~= '' then redis.call('HSET', key, 'limit_key', ARGV[16]) end
local level = priority_of(ARGV[14])
local slot = next_slot(plan.seq)
if level > 0 then redis.call('HSET', key, 'priority', level) end
if plan.group then -- (fair shares: its group's queue, as create_run.lua)
  group_enter(prefix, plan.group, run_id, prio_slot_score(level, due, slot), due)
elseif level > 0 then
  redis.call('ZADD', KEYS[4], prio_slot_score(level, due, slot), run_id)
end
redis.call('ZADD', KEYS[1], due_score(due, slot), run_id)
save_sequence(plan.seq)
local owned_key = KEYS[5] -- (named: a SET on KEYS is the fence counter's step elsewhere)
if ttl and ttl > 0 then
  redis.call('SET', owned_key, run_id, 'PX', int(ttl))
else
  redis.call('SET', owned_key, run_id)
end
bump(plan.stats, 'created', 1)
wake(plan.wake, 1)
emit(plan.log, 'created', run_id, int(due) .. '|' .. ARGV[7])
trim_events(plan.log)
return {now, 'created', run_id}
