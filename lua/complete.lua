-- complete.lua: accept runs' successes, each only from the holder of its current fence.
--
-- uses: core, wake, fences, records, sequence, events, workflows, waiting, slots
--
-- KEYS[1]  leases    zset    jq:{q#p}:leases   run_id -> lease expiry (ms)
-- KEYS[2]  done      zset    jq:{q#p}:done     run_id -> finish time (ms)
-- KEYS[3]  stats     hash    jq:{q#p}:stats    counters
-- KEYS[4]  limits    hash    jq:{q#p}:limits   flow limits: under a concurrency limit, each
--                                              completion frees a slot
-- KEYS[5]  wake      list    jq:{q#p}:wake     ... and wakes an idle worker to take it
-- KEYS[6]  due       zset    jq:{q#p}:due      run_id -> due time (ms): a parked run goes
--                                              back here at its due time
-- KEYS[7]  parked    zset    jq:{q#p}:parked   run_id -> original due time: the runs
--                                              parked by a per-key or per-task cap
-- KEYS[8]  outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear
-- KEYS[9]  waiting   zset    jq:{q#p}:waiting  run_id -> creation time: the waiting runs
-- KEYS[10] dead      zset    jq:{q#p}:dead     run_id -> time it died (a waiting run of the
--                                              partition released here may die instead)
-- KEYS[11] seq       hash    jq:{q#p}:seq      {ms, n}: runs made due in the current ms
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  retention_ms       how long finished records live
-- ARGV[4]  dead_retention_ms  how long a dead record lives (as in deliver.lua)
-- ARGV[5]  max_bytes          the most a released run's payload may hold (as in deliver.lua)
-- ARGV[6..] runs              3 fields per run: run_id, fence the worker claimed with,
--                             result (JSON)
-- Returns  one outcome per run, in order: {1, 'done'} when accepted ({1, 'done', 1, parents,
--          version} when runs of other partitions wait on it: it is in the outbox at that
--          version (score), for the relay, and its record's 'parents' lists them); {0, reason,
--          current_fence} when refused (reason as in heartbeat.lua). A refused commit changes
--          nothing: at most one completion per run is ever accepted. Refused whole (an error
--          reply, nothing changed) when a key is not on this node or an index key holds
--          another type.
-- Events (jq:{q#p}:events, see event_log in lib/events.lua): 'completed' per accepted run,
-- 'refused' per refused one whose record exists; 'ready', 'dead' or 'cancelled' per waiting
-- run of the partition that this call released, killed or skipped.
--
-- Batched: a worker commits every run that finished since its last commit in one call per
-- partition. A run others wait on (record field 'parents'): the waiting runs of this
-- partition hear of it in this call, as deliver.lua would tell them (counted by membership;
-- released, or dying of a payload past max_bytes, or skipped: see waiting_hear in
-- lib/waiting.lua); when runs of other partitions wait on it too (or 'parents' is not the list
-- jobqueue writes, or a waiting run's keys hold another type, or its outbox entry of an
-- earlier life was not relayed yet), it goes to the partition's
-- outbox (another type there refuses the call whole) and keeps its record until relayed
-- (see finish_record in lib/workflows.lua), and the relay tells those (the others have counted it
-- already: nothing changes for them). No history entry: the record's state, owner, fence, attempt, started and
-- finished fields tell a successful attempt; the history keeps what they cannot.
--
-- Under a concurrency limit (claim.lua), a worker whose claim found no room sleeps on the wake
-- list: each accepted completion pushes a token (a limits key of another type counts as no
-- limit here: commits never wait on it).
--
-- A run taking slots of per-key or per-task caps (record field 'held', see claim.lua) frees
-- them here, and the oldest parked run of each such group is put back at its original due
-- time (waking an idle worker), with its priority hint in jq:{q#p}:prio (reached by the
-- prefix) when it has a priority; an occupant (held:<group>), parked or prio key of another
-- type refuses the call whole.

local now = clock(ARGV[1])
local prefix, retention = ARGV[2], tonumber(ARGV[3])
local queue = string.match(prefix, '^jq:{([^#}]*)#')
local FIRST = 6

-- Phase 1: the waiting runs of this partition among a finished run's parents, heard of now;
-- true when every parent was handled here (else the outbox tells the others).
local function hear_here(p, run_id, parents, outcome)
  local entries, here = {}, true
  for q, id in string.gmatch(parents, '%["([^"]*)","([^"]*)"%]') do
    entries[#entries + 1] = '["' .. q .. '","' .. id .. '"]'
    local w = q == queue and p.waiting[id]
    if q == queue and w == nil then
      w = false
      local record = read('TYPE', prefix .. 'run:' .. id)
      record = type(record) == 'table' and record.ok or record
      local deps = read('TYPE', prefix .. 'deps:' .. id)
      deps = type(deps) == 'table' and deps.ok or deps
      local got = read('TYPE', prefix .. 'got:' .. id)
      got = type(got) == 'table' and got.ok or got
      -- (foreign keys: the relay's deliver reports them; the commit is never refused)
      if record == 'hash' and (deps == 'hash' or deps == 'none') and
         (got == 'hash' or got == 'none') then
        if not p.ctx then
          expect(KEYS[9], 'zset')
          expect(KEYS[10], 'zset')
          p.ctx = {prefix = prefix, now = now, log = p.log, outbox = KEYS[8], due = KEYS[6],
                   waiting = KEYS[9], dead = KEYS[10], done = KEYS[2],
                   seq = sequencer(KEYS[11], now), max_bytes = tonumber(ARGV[5]),
                   retention = retention, dead_retention = tonumber(ARGV[4]), due_pairs = {}}
          p.wake = p.wake or waker(KEYS[5])
        end
        w = waiting_plan(prefix, id)
        p.order[#p.order + 1] = w
      end
      p.waiting[id] = w
    end
    if w then waiting_hear(w, run_id, outcome) else here = false end
  end
  return here and '[' .. table.concat(entries, ',') .. ']' == parents
end

local ok, plan = reading(function()
  -- A foreign caller's bad number would fail PEXPIRE after the record was written.
  for a = 3, 5 do
    if not whole(ARGV[a], 0) then
      refuse('ERR jobqueue: complete: retention_ms, dead_retention_ms and max_bytes are ' ..
             'whole numbers, not ' .. tostring(ARGV[a]))
    end
  end
  local p = {runs = {}, freer = slot_freer(prefix, KEYS[6], KEYS[7]), log = event_log(prefix),
             waiting = {}, order = {}}
  expect(KEYS[1], 'zset')
  expect(KEYS[2], 'zset')
  p.stats = counters(KEYS[3], 'completed', 'rejected', 'released', 'dead', 'cancelled')
  local cap = checked(redis.pcall('HGET', KEYS[4], 'concurrency'), KEYS[4], true)
  if count(cap, 0) then p.wake = waker(KEYS[5]) end
  for i = FIRST, #ARGV, 3 do
    local run_id, fence = ARGV[i], tonumber(ARGV[i + 1])
    -- A key of another type answers 'unknown' for its run alone.
    local run = load_run(prefix .. 'run:' .. run_id, 'state', 'fence', 'hist', 'held', 'task',
                         'limit_key', 'parents', 'attempt')
    local r = {id = run_id, result = ARGV[i + 2], why = refusal(run, fence),
               current = run and whole_or(run.fence, 0, 0) or 0}
    r.attempt = run and run.attempt or '0'
    r.hist = r.why == nil and run.hist ~= nil and history_ok(prefix, run_id)
    if r.why == nil and type(run.parents) == 'string' and run.parents ~= '' then
      local here = hear_here(p, run_id, run.parents, 'd' .. r.result)
      expect(KEYS[8], 'zset')
      -- (an entry of an earlier life, not relayed yet: the record stays for the relay)
      if not here or read('ZSCORE', KEYS[8], run_id) then
        r.outbox = outbox_entry(KEYS[8], run, run_id, now)
        r.parents = run.parents
      end
    end
    if r.why == nil and run.held then
      r.freed = true
      p.freer.free(run_id, slot_groups(run))
      p.wake = p.wake or waker(KEYS[5])
    end
    p.runs[#p.runs + 1] = r
  end
  for _, w in ipairs(p.order) do waiting_settle(w, p.ctx) end
  return p
end)
if not ok then return plan end

local out = {}
local ids, finished = {}, {} -- one ZREM and one ZADD for the call
local refused = 0
for _, r in ipairs(plan.runs) do
  if r.why then
    refused = refused + 1
    out[#out + 1] = {0, r.why, r.current}
    if r.why ~= 'unknown' then emit(plan.log, 'refused', r.id, r.why) end
  else
    local key = prefix .. 'run:' .. r.id
    redis.call('HSET', key, 'state', 'done', 'result', r.result, 'finished', now)
    redis.call('HDEL', key, 'lease_until')
    if r.freed then redis.call('HDEL', key, 'held') end
    finish_record(prefix, r.id, retention, r.hist, r.outbox)
    out[#out + 1] = r.outbox and {1, 'done', 1, r.parents, r.outbox.at} or {1, 'done'}
    emit(plan.log, 'completed', r.id, r.attempt)
    ids[#ids + 1] = r.id
    finished[#finished + 1] = now
    finished[#finished + 1] = r.id
  end
end

if #ids > 0 then
  bulk('ZADD', KEYS[2], finished, 2000)
  bulk('ZREM', KEYS[1], ids, 1000)
  wake(plan.wake, #ids)
end
-- The waiting runs of this partition that heard of them: released, dead or skipped now.
local became = {released = 0, died = 0, skipped = 0}
for _, w in ipairs(plan.order) do
  local b = waiting_write(w, plan.ctx)
  if b then became[b] = became[b] + 1 end
end
if became.died > 0 then trim_index(KEYS[10], now, plan.ctx.dead_retention) end
if became.released > 0 then
  bulk('ZADD', KEYS[6], plan.ctx.due_pairs, 2000)
  save_sequence(plan.ctx.seq)
  wake(plan.wake, became.released)
end
if #ids > 0 or became.skipped > 0 then
  trim_index(KEYS[2], now, retention) -- the done index only lists records that still exist
end
wake(plan.wake, free_slots(plan.freer, prefix, KEYS[6], KEYS[7]))
bump(plan.stats, 'completed', #ids)
bump(plan.stats, 'rejected', refused)
bump(plan.stats, 'released', became.released)
bump(plan.stats, 'dead', became.died)
bump(plan.stats, 'cancelled', became.skipped)
trim_events(plan.log)
return out
