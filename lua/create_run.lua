-- create_run.lua: create runs with SET NX semantics on the run id; batched for one partition.
--
-- uses: core, wake, priority, groups, records, sequence, events
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  wake      list    jq:{q#p}:wake     wakes idle workers
-- KEYS[3]  stats     hash    jq:{q#p}:stats    counters
-- KEYS[4]  prio      zset    jq:{q#p}:prio     run_id -> (9 - priority) * 2^43 + due time,
--                                              the runs above the default priority
-- KEYS[5]  seq       hash    jq:{q#p}:seq      {ms, n}: runs created in the current ms, for
--                                              their order (the n-th: due + n / 2048, see
--                                              lib/sequence.lua)
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3..] groups            6 header fields shared by the group's runs, then 8 per run:
--                             count, task, max_attempts, lease_ms, timeout_ms, priority
--                             (0..9, higher claimed first; anything else counts as 0);
--                             then per run: run_id, payload (JSON), due_at (absolute ms or
--                             ''), delay_ms, job_id, scheduled_for (ms or ''), meta (JSON
--                             object from the enqueue hooks, or ''), limit_key (the key of
--                             per-key limits, or '')
--                             (a batch is nearly always one group: a task's fields travel
--                             once, not per run)
-- Returns  {now, r1, r2, ...}: per run 1 = created, 0 = already exists (nothing written).
--          Refused whole (an error reply, nothing created) when a key is not on this node or
--          an index key holds another type.
--
-- A created run is pending, in the due zset at due_at or now + delay_ms, and wake tokens are
-- pushed so that idle workers blocked on the list claim at once. A run above priority 0 is
-- also in the prio zset at its level and due time: claim takes those first (claim.lua).
-- A run with a limit_key, and any run of a partition with groups, waits in its group's queue
-- instead of the prio zset (group_enter, lib/groups.lua): claim serves the groups in turn.
-- Refused whole ('ERR jobqueue: group full: ...') when a run would make its group hold more
-- waiting runs than its max_size (gconf max:<group>, set by group_set.lua).
--
-- Events (see event_log in lib/events.lua): 'created' ('<due ms>|<task>') per run created.
--
-- The record holds only what differs from the defaults (write_pending): no queue (the key
-- says it), no attempt or fence (0 until the first claim), no lease_ms, timeout_ms or job when
-- 0 or empty, no meta or limit_key when '', no priority when 0, and no history entry (creation is the record's created and due fields; the
-- history starts at the first event that the record cannot show).

local now = clock(ARGV[1])
local prefix = ARGV[2]
local HEADER, STRIDE = 6, 8

local ok, plan = reading(function()
  local p = {exists = {}}
  expect(KEYS[1], 'zset')
  expect(KEYS[4], 'zset')
  p.wake = waker(KEYS[2])
  p.stats = counters(KEYS[3], 'created')
  p.seq = sequencer(KEYS[5], now)
  p.log = event_log(prefix)
  -- Groups (fair claims; lib/groups.lua): the group each new run waits in, and the groups'
  -- max_size (gconf max:<group>: at most that many runs waiting in the group).
  p.group, p.fair = {}, fair_partition(prefix)
  local waiting = {}
  local i, seen = 3, {}
  while i <= #ARGV do
    local count = tonumber(ARGV[i])
    local j = i + HEADER
    for _ = 1, count do
      local run_id = ARGV[j]
      -- The same id twice in one call: the first creates it.
      p.exists[j] = seen[run_id] or read('EXISTS', prefix .. 'run:' .. run_id) == 1
      seen[run_id] = true
      local group = not p.exists[j] and group_of(prefix, ARGV[j + 7], p.fair)
      if group then
        p.group[j] = group
        if waiting[group] == nil then
          local max = read('HGET', prefix .. 'gconf', 'max:' .. group)
          waiting[group] = whole(max, 0) and {max = tonumber(max),
                                              n = read('ZCARD', prefix .. 'gq:' .. group)}
                           or false
        end
        local w = waiting[group]
        if w then
          if w.n >= w.max then
            refuse('ERR jobqueue: group full: group ' .. group .. ' of this queue has ' .. w.n ..
                   ' runs waiting, its max_size is ' .. w.max .. '; nothing was created')
          end
          w.n = w.n + 1
        end
      end
      j = j + STRIDE
    end
    i = j
  end
  return p
end)
if not ok then return plan end

local out = {now}
local due_pairs = {} -- score, member: one ZADD for the call
local prio_pairs = {}
local created = 0
local i = 3
while i <= #ARGV do
  local count = tonumber(ARGV[i])
  local task, attempts, lease, timeout = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local level = priority_of(ARGV[i + 5])
  local j = i + HEADER
  for _ = 1, count do
    if plan.exists[j] then
      out[#out + 1] = 0
    else
      local run_id = ARGV[j]
      local key = prefix .. 'run:' .. run_id
      local due = tonumber(ARGV[j + 2]) or (now + (tonumber(ARGV[j + 3]) or 0))
      write_pending(key, now, due, task, ARGV[j + 1], attempts, lease, timeout, ARGV[j + 4],
                    ARGV[j + 5])
      if ARGV[j + 6] ~= '' then redis.call('HSET', key, 'meta', ARGV[j + 6]) end
      if ARGV[j + 7] ~= '' then redis.call('HSET', key, 'limit_key', ARGV[j + 7]) end
      local slot = next_slot(plan.seq)
      if level > 0 then redis.call('HSET', key, 'priority', level) end
      if plan.group[j] then -- (the ring orders its group by priority: no prio hint)
        group_enter(prefix, plan.group[j], run_id, prio_slot_score(level, due, slot), due)
      elseif level > 0 then
        prio_pairs[#prio_pairs + 1] = prio_slot_score(level, due, slot)
        prio_pairs[#prio_pairs + 1] = run_id
      end
      created = created + 1
      due_pairs[2 * created - 1] = due_score(due, slot)
      due_pairs[2 * created] = run_id
      emit(plan.log, 'created', run_id, int(due) .. '|' .. task)
      out[#out + 1] = 1
    end
    j = j + STRIDE
  end
  i = j
end

if created > 0 then
  bulk('ZADD', KEYS[1], due_pairs, 2000)
  if #prio_pairs > 0 then bulk('ZADD', KEYS[4], prio_pairs, 2000) end
  bump(plan.stats, 'created', created)
  save_sequence(plan.seq)
  wake(plan.wake, created)
  trim_events(plan.log)
end
return out
