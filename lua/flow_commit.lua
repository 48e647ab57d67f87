-- flow_commit.lua: commit a workflow's creation in one partition: its runs here written
-- staged (flow_create.lua) stop being staged, and those with nothing left to wait on are
-- released (pending, due now). Called first in the partition of the workflow's home run,
-- where the commit is decided (the home run's record stops being staged: from then on the
-- workflow exists), then in its other partitions.
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  waiting   zset    jq:{q#p}:waiting  run_id -> creation time: the waiting runs
-- KEYS[3]  wake      list    jq:{q#p}:wake     wakes idle workers for a released run
-- KEYS[4]  stats     hash    jq:{q#p}:stats    counters
-- KEYS[5]  seq       hash    jq:{q#p}:seq      {ms, n}: runs made due in the current ms
-- KEYS[6]  dead      zset    jq:{q#p}:dead     run_id -> time it died
-- KEYS[7]  outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear, and
--                                              '!<run_id>' orders
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  flow_id            the workflow
-- ARGV[4]  staged             its home, as its runs' 'staged' field holds it: the JSON text
--                             ["<queue>","<run_id>"]
-- ARGV[5]  home_run           the home run's id when this is its partition, else ''
-- ARGV[6]  dead_retention_ms  how long a dead record lives; a released run's dependency
--                             keys live as long (as in deliver.lua)
-- ARGV[7]  max_bytes          the most a released run's payload may hold with its
--                             dependencies' results (past it the run dies, saying so)
-- Returns  {1, released}: committed here (now, or before: nothing of it was staged any
--          more), with the runs released that had dependencies (the 'released' counter;
--          those that waited on nothing but the commit count as created); {0, 'aborted'} in the home's partition when the
--          home run is neither staged with this home nor committed (flow_abort.lua removed
--          it: nothing was changed). Refused whole (an error reply, nothing changed) when a
--          field is malformed, a key is not on this node or a key holds another type.
--
-- The runs of the workflow here are those of jq:{q#p}:flow:<flow_id> whose record says
-- 'staged' with this home. One is released when it waits on nothing more ('left' 0, or no
-- 'left': it waited on nothing but the commit), or when
-- a 'continue' released it early ('ready', see deliver.lua): as deliver.lua releases, its
-- payload built from its dependencies' results when it receives them; past max_bytes it
-- dies instead (and an order '!<run_id>' goes to the outbox, as in deliver.lua).
-- Events (see event_log in _prelude.lua): 'ready' per run released, 'dead' per run that died.

local now = clock(ARGV[1])
local prefix, flow_id, staged, home = ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local ok, plan = reading(function()
  if not whole(ARGV[6], 0) or not whole(ARGV[7], 0) then
    refuse('ERR jobqueue: flow_commit: dead_retention_ms and max_bytes are whole numbers')
  end
  local p = {runs = {}, log = event_log(prefix)}
  if home ~= '' then
    local h = load_run(prefix .. 'run:' .. home, 'staged', 'flow')
    local committed = h and h.flow == flow_id and not h.staged
    if not committed and not (h and h.staged == staged) then
      p.aborted = true
      return p
    end
  end
  expect(KEYS[1], 'zset')
  expect(KEYS[2], 'zset')
  expect(KEYS[6], 'zset')
  expect(KEYS[7], 'zset')
  p.wake = waker(KEYS[3])
  p.stats = counters(KEYS[4], 'released', 'dead')
  p.seq = sequencer(KEYS[5], now)
  local members_key = prefix .. 'flow:' .. flow_id
  expect(members_key, 'set')
  for _, id in ipairs(read('SMEMBERS', members_key)) do
    local w = {id = id, key = prefix .. 'run:' .. id}
    w.run = load_run(w.key, 'state', 'staged', 'left', 'ready', 'receives', 'args_tail',
                     'parents', 'hist', 'deps_n')
    if w.run and w.run.staged == staged then
      w.deps_key, w.got_key = prefix .. 'deps:' .. id, prefix .. 'got:' .. id
      local left = w.run.left
      if w.run.state == 'waiting' and (not left or left == '0' or w.run.ready == '1') then
        expect(w.deps_key, 'hash')
        expect(w.got_key, 'hash')
        w.release = true
        w.payload = flow_payload(w.run, w.deps_key, w.got_key, nil)
        if w.payload and #w.payload > tonumber(ARGV[7]) then
          w.die = 'the results of its dependencies make a payload of ' .. #w.payload ..
                  ' bytes, past the bound of ' .. int(tonumber(ARGV[7]))
          w.release = nil
          w.hist = w.run.hist ~= nil and history_ok(prefix, id)
          w.out = outbox_entry(KEYS[7], w.run, id, now)
          w.order = outbox_entry(KEYS[7], {parents = '!'}, '!' .. id, now)
        end
      end
      p.runs[#p.runs + 1] = w
    end
  end
  return p
end)
if not ok then return plan end
if plan.aborted then return {0, 'aborted'} end

local dead_retention = tonumber(ARGV[6])
local released, died, due_pairs = 0, 0, {}
for _, w in ipairs(plan.runs) do
  redis.call('HDEL', w.key, 'staged', 'ready')
  if w.die then
    bury(KEYS[6], prefix, w.id, now, w.die, ' ' .. w.die, dead_retention, w.hist, w.out,
         plan.log, '0')
    redis.call('ZREM', KEYS[2], w.id)
    to_outbox(w.order)
    died = died + 1
  elseif w.release then
    redis.call('HSET', w.key, 'state', 'pending', 'due', now)
    if w.payload then redis.call('HSET', w.key, 'payload', w.payload) end
    redis.call('ZREM', KEYS[2], w.id)
    due_pairs[#due_pairs + 1] = due_score(now, next_slot(plan.seq))
    due_pairs[#due_pairs + 1] = w.id
    if dead_retention > 0 then
      redis.call('PEXPIRE', w.deps_key, dead_retention)
      redis.call('PEXPIRE', w.got_key, dead_retention)
    end
    emit(plan.log, 'ready', w.id, '')
    -- (a run that waited on nothing but the commit is counted as created, not released)
    if whole_or(w.run.deps_n, 0, 0) > 0 then released = released + 1 end
  end
end
if died > 0 then trim_index(KEYS[6], now, dead_retention) end
if #due_pairs > 0 then
  bulk('ZADD', KEYS[1], due_pairs, 2000)
  save_sequence(plan.seq)
  wake(plan.wake, #due_pairs / 2)
end
bump(plan.stats, 'released', released)
bump(plan.stats, 'dead', died)
trim_events(plan.log)
return {1, released}
