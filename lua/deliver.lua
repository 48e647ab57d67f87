-- deliver.lua: tell waiting runs of one partition that dependencies finished; each run counts
-- each dependency once, by its run id, whatever the number of deliveries.
--
-- uses: core, wake, records, sequence, events, waiting
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  waiting   zset    jq:{q#p}:waiting  run_id -> creation time: the waiting runs
-- KEYS[3]  wake      list    jq:{q#p}:wake     wakes idle workers for a released run
-- KEYS[4]  stats     hash    jq:{q#p}:stats    counters
-- KEYS[5]  seq       hash    jq:{q#p}:seq      {ms, n}: runs made due in the current ms
-- KEYS[6]  dead      zset    jq:{q#p}:dead     run_id -> time it died
-- KEYS[7]  outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear, and
--                                              '!<run_id>' orders (see below)
-- KEYS[8]  done      zset    jq:{q#p}:done     run_id -> finish time (done and cancelled)
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  dead_retention_ms  how long a dead record lives; a released run's dependency
--                             keys live as long
-- ARGV[4]  max_bytes          the most a released run's payload may hold with its
--                             dependencies' results (past it the run dies, saying so)
-- ARGV[5]  retention_ms       how long a cancelled (skipped) record lives; its dependency
--                             keys live as long
-- ARGV[6..] deliveries       3 fields each: waiting run_id, dependency run_id, outcome:
--                             'd' .. result JSON (done), 'x' .. error (dead), 'c' .. reason
--                             (cancelled)
-- Returns  one integer per delivery, in order: 1 when counted, 0 when not (the dependency was
--          counted before, is not one of the run's, or the run waits no more); then the
--          number of waiting runs that died or were cancelled here (their outbox entries are
--          for the relay: 0 means the outbox got nothing new). Refused whole
--          (an error reply, nothing changed) when a field is malformed, a key is not on this
--          node or a key holds another type.
--
-- A counted dependency is recorded in jq:{q#p}:got:<run_id> (hash: dependency -> outcome,
-- 'r' for a removed one), and the record's 'left' goes down by one: both in this script, so
-- 'left' always equals the dependencies not in got (a 'left' that is not a count is worked
-- out again from the two keys). A dependency that died (or was
-- cancelled) is handled by the policy its edge names in jq:{q#p}:deps:<run_id>:
--   fail      the waiting run dies ('dependency <id> died: <error>'), and an order
--             '!<run_id>' goes to the outbox: the relay cancels its unfinished dependencies
--             (pending and waiting ones; running ones too when its record says
--             cancel_running);
--   ignore    counted; the run runs once all are heard of, with the failure in got;
--   continue  counted, and the run is released now, whatever is left;
--   remove    counted as if the edge never was (got says 'r');
--   skip      the waiting run is cancelled ('dependency <id> died: <error>'): it never runs,
--             and nothing else is (a batch's on_success callback).
-- A run whose record says 'on_death_only' (a batch's on_dead callback, its edges 'continue')
-- runs only when a dependency died: once all are heard of as done it is cancelled instead.
-- Released (nothing left, or continue): pending and due now. A run whose record says
-- 'receives' gets its dependencies' results first in its arguments: 'one' the first
-- dependency's result, 'all' a list of them in the order they were given (null for a failed
-- one; removed ones left out); its payload becomes '{"args":[' .. results .. args_tail.
-- A waiting run that dies or finishes tells its own parents through the outbox
-- (finish_record in lib/workflows.lua). A run whose record says 'staged' (its workflow's
-- creation over several partitions is not committed yet) counts and dies as any other but
-- is not released: flow_commit.lua releases it at the commit ('ready' = 1: a 'continue'
-- released it early).
-- Events (see event_log in lib/events.lua): 'ready' per run released, 'dead' ('0|<error>') or
-- 'cancelled' ('<reason>') per waiting run that dies or is skipped.

local now = clock(ARGV[1])
local prefix = ARGV[2]
local FIRST = 6

local ok, plan = reading(function()
  if not whole(ARGV[3], 0) or not whole(ARGV[4], 0) or not whole(ARGV[5], 0) then
    refuse('ERR jobqueue: deliver: dead_retention_ms, max_bytes and retention_ms are whole ' ..
           'numbers')
  end
  if (#ARGV - FIRST + 1) % 3 ~= 0 then
    refuse('ERR jobqueue: deliver: 3 fields per delivery')
  end
  local p = {parents = {}, order = {}, out = {}}
  for i = 1, 8 do
    if i ~= 3 and i ~= 4 and i ~= 5 then expect(KEYS[i], 'zset') end
  end
  p.ctx = {prefix = prefix, now = now, log = event_log(prefix), outbox = KEYS[7],
           due = KEYS[1], waiting = KEYS[2], dead = KEYS[6], done = KEYS[8],
           seq = sequencer(KEYS[5], now), max_bytes = tonumber(ARGV[4]),
           retention = tonumber(ARGV[5]), dead_retention = tonumber(ARGV[3]), due_pairs = {}}
  p.wake = waker(KEYS[3])
  p.stats = counters(KEYS[4], 'released', 'dead', 'cancelled')
  for i = FIRST, #ARGV, 3 do
    local id, dep, outcome = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local kind = string.sub(outcome, 1, 1)
    if kind ~= 'd' and kind ~= 'x' and kind ~= 'c' then
      refuse('ERR jobqueue: deliver: an outcome starts with d, x or c')
    end
    local w = p.parents[id]
    if not w then
      w = waiting_plan(prefix, id)
      p.parents[id] = w
      p.order[#p.order + 1] = w
    end
    p.out[#p.out + 1] = waiting_hear(w, dep, outcome)
  end
  for _, w in ipairs(p.order) do waiting_settle(w, p.ctx) end
  return p
end)
if not ok then return plan end

local ctx = plan.ctx
local done = {released = 0, died = 0, skipped = 0}
for _, w in ipairs(plan.order) do
  local became = waiting_write(w, ctx)
  if became then done[became] = done[became] + 1 end
end
if done.died > 0 then trim_index(ctx.dead, now, ctx.dead_retention) end
if done.skipped > 0 then trim_index(ctx.done, now, ctx.retention) end
if done.released > 0 then
  bulk('ZADD', ctx.due, ctx.due_pairs, 2000)
  save_sequence(ctx.seq)
  wake(plan.wake, done.released)
end
bump(plan.stats, 'released', done.released)
bump(plan.stats, 'dead', done.died)
bump(plan.stats, 'cancelled', done.skipped)
trim_events(ctx.log)
plan.out[#plan.out + 1] = done.died + done.skipped
return plan.out
