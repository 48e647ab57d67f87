-- deliver.lua: tell waiting runs of one partition that dependencies finished; each run counts
-- each dependency once, by its run id, whatever the number of deliveries.
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
-- (finish_record in _prelude.lua). A run whose record says 'staged' (its workflow's
-- creation over several partitions is not committed yet) counts and dies as any other but
-- is not released: flow_commit.lua releases it at the commit ('ready' = 1: a 'continue'
-- released it early).
-- Events (see event_log in _prelude.lua): 'ready' per run released, 'dead' ('0|<error>') or
-- 'cancelled' ('<reason>') per waiting run that dies or is skipped.

local now = clock(ARGV[1])
local prefix = ARGV[2]
local dead_retention, max_bytes = tonumber(ARGV[3]), tonumber(ARGV[4])
local retention = tonumber(ARGV[5])
local FIRST = 6

local ok, plan = reading(function()
  if not whole(ARGV[3], 0) or not whole(ARGV[4], 0) or not whole(ARGV[5], 0) then
    refuse('ERR jobqueue: deliver: dead_retention_ms, max_bytes and retention_ms are whole ' ..
           'numbers')
  end
  if (#ARGV - FIRST + 1) % 3 ~= 0 then
    refuse('ERR jobqueue: deliver: 3 fields per delivery')
  end
  local p = {parents = {}, order = {}, out = {}, log = event_log(prefix)}
  expect(KEYS[1], 'zset')
  expect(KEYS[2], 'zset')
  expect(KEYS[6], 'zset')
  expect(KEYS[7], 'zset')
  expect(KEYS[8], 'zset')
  p.wake = waker(KEYS[3])
  p.stats = counters(KEYS[4], 'released', 'dead', 'cancelled')
  p.seq = sequencer(KEYS[5], now)
  for i = FIRST, #ARGV, 3 do
    local id, dep, outcome = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local kind = string.sub(outcome, 1, 1)
    if kind ~= 'd' and kind ~= 'x' and kind ~= 'c' then
      refuse('ERR jobqueue: deliver: an outcome starts with d, x or c')
    end
    local w = p.parents[id]
    if not w then
      w = {id = id, key = prefix .. 'run:' .. id, got = {}, new = {}}
      w.run = load_run(w.key, 'state', 'left', 'receives', 'args_tail', 'parents',
                       'cancel_running', 'on_death_only', 'hist', 'staged')
      w.open = w.run ~= nil and w.run.state == 'waiting'
      if w.open then
        w.deps_key, w.got_key = prefix .. 'deps:' .. id, prefix .. 'got:' .. id
        expect(w.deps_key, 'hash')
        expect(w.got_key, 'hash')
        if whole(w.run.left, 0) then
          w.left = tonumber(w.run.left)
        else -- garbage: what the keys say is left (a dependency not yet in got)
          local deps, got = read('HKEYS', w.deps_key), {}
          for _, d in ipairs(read('HKEYS', w.got_key)) do got[d] = true end
          w.left = 0
          for _, d in ipairs(deps) do if not got[d] then w.left = w.left + 1 end end
        end
      end
      p.parents[id] = w
      p.order[#p.order + 1] = w
    end
    local counted = 0
    if w.open and not w.die and not w.skip and not w.release then
      local spec = read('HGET', w.deps_key, dep)
      if spec and not w.got[dep] and not read('HGET', w.got_key, dep) then
        local policy = string.match(spec, '^%d+|(%a+)|') or 'fail'
        counted = 1
        if kind == 'd' then
          w.got[dep] = outcome
        elseif policy == 'remove' then
          w.got[dep] = 'r'
        else
          w.got[dep] = outcome
          local why = 'dependency ' .. dep .. (kind == 'c' and ' was cancelled: ' or
                      ' died: ') .. utf8_head(string.sub(outcome, 2), 300)
          if policy == 'continue' then
            w.release = true
          elseif policy == 'skip' then
            w.skip = why
          elseif policy ~= 'ignore' then -- fail (and anything foreign)
            w.die = why
          end
        end
        w.new[#w.new + 1] = dep
        w.new[#w.new + 1] = w.got[dep]
        w.left = math.max(w.left - 1, 0)
      end
    end
    p.out[#p.out + 1] = counted
  end
  -- What each run becomes: dead, released (its payload built now), or still waiting.
  for _, w in ipairs(p.order) do
    if w.open and not w.die and not w.skip and not w.release and w.left == 0 and
       w.run.on_death_only == '1' then
      w.skip = 'every dependency finished and none died'
    end
    if w.open and not w.die and not w.skip and (w.release or w.left == 0) then
      if w.run.staged then
        -- Its workflow's creation is not committed yet (see flow_commit.lua): released
        -- then, not now; a 'continue' that would release it early says so in 'ready'.
        w.ready, w.release = w.release == true, nil
      else
        w.release = true
        w.payload = flow_payload(w.run, w.deps_key, w.got_key, w.got)
        if w.payload and #w.payload > max_bytes then
          w.die = 'the results of its dependencies make a payload of ' .. #w.payload ..
                  ' bytes, past the bound of ' .. int(max_bytes)
          w.release = nil
        end
      end
    end
    if w.die or w.skip then
      w.hist = w.run.hist ~= nil and history_ok(prefix, w.id)
      w.out = outbox_entry(KEYS[7], w.run, w.id, now)
    end
    if w.die then w.order = outbox_entry(KEYS[7], {parents = '!'}, '!' .. w.id, now) end
  end
  return p
end)
if not ok then return plan end

local released, died, skipped, due_pairs = 0, 0, 0, {}
for _, w in ipairs(plan.order) do
  if #w.new > 0 then bulk('HSET', w.got_key, w.new, 2000) end
  if w.die then
    redis.call('HSET', w.key, 'left', w.left)
    bury(KEYS[6], prefix, w.id, now, w.die, ' ' .. w.die, dead_retention, w.hist, w.out,
         plan.log, '0')
    redis.call('ZREM', KEYS[2], w.id)
    to_outbox(w.order)
    died = died + 1
  elseif w.skip then
    redis.call('HSET', w.key, 'state', 'cancelled', 'finished', now, 'error', w.skip,
               'left', w.left)
    if w.hist then history(prefix, w.id, now .. ' cancelled (was waiting): ' .. w.skip) end
    finish_record(prefix, w.id, retention, w.hist, w.out)
    redis.call('ZREM', KEYS[2], w.id)
    redis.call('ZADD', KEYS[8], now, w.id)
    if retention > 0 then
      redis.call('PEXPIRE', w.deps_key, retention)
      redis.call('PEXPIRE', w.got_key, retention)
    end
    emit(plan.log, 'cancelled', w.id, utf8_head(w.skip, EVENT_TEXT))
    skipped = skipped + 1
  elseif w.release then
    redis.call('HSET', w.key, 'state', 'pending', 'due', now, 'left', w.left)
    if w.payload then redis.call('HSET', w.key, 'payload', w.payload) end
    redis.call('ZREM', KEYS[2], w.id)
    due_pairs[#due_pairs + 1] = due_score(now, next_slot(plan.seq))
    due_pairs[#due_pairs + 1] = w.id
    if dead_retention > 0 then
      redis.call('PEXPIRE', w.deps_key, dead_retention)
      redis.call('PEXPIRE', w.got_key, dead_retention)
    end
    emit(plan.log, 'ready', w.id, '')
    released = released + 1
  elseif #w.new > 0 then
    redis.call('HSET', w.key, 'left', w.left)
    if w.ready then redis.call('HSET', w.key, 'ready', 1) end
  end
end
if died > 0 then trim_index(KEYS[6], now, dead_retention) end
if skipped > 0 then trim_index(KEYS[8], now, retention) end
if released > 0 then
  bulk('ZADD', KEYS[1], due_pairs, 2000)
  save_sequence(plan.seq)
  wake(plan.wake, released)
end
bump(plan.stats, 'released', released)
bump(plan.stats, 'dead', died)
bump(plan.stats, 'cancelled', skipped)
trim_events(plan.log)
plan.out[#plan.out + 1] = died + skipped
return plan.out
