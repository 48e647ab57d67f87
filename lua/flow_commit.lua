-- flow_commit.lua: commit a workflow's creation in one partition: its runs here written
-- staged by this attempt (flow_create.lua) stop being staged, and those with nothing left to
-- wait on are released (pending, due now). Called first in the partition of the workflow's
-- home run, where the commit is decided and recorded (jq:{q#p}:flowmark:<flow_id> = the
-- attempt's nonce: from then on the workflow exists), then in its other partitions.
--
-- uses: core, wake, records, sequence, events, workflows, bury
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  waiting   zset    jq:{q#p}:waiting  run_id -> creation time: the waiting runs
-- KEYS[3]  wake      list    jq:{q#p}:wake     wakes idle workers for a released run
-- KEYS[4]  stats     hash    jq:{q#p}:stats    counters
-- KEYS[5]  seq       hash    jq:{q#p}:seq      {ms, n}: runs made due in the current ms
-- KEYS[6]  dead      zset    jq:{q#p}:dead     run_id -> time it died
-- KEYS[7]  outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear, and
--                                              '!<run_id>' orders
-- KEYS[8]  staged    zset    jq:{q#p}:staged   the runs written staged, not settled yet
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  flow_id            the workflow
-- ARGV[4]  staged             this attempt's mark, as its runs' 'staged' field holds it: the
--                             JSON text ["<home queue>","<home run>","<nonce>"]
-- ARGV[5]  home_run           the home run's id when this is its partition, else ''
-- ARGV[6]  dead_retention_ms  how long a dead record lives; a released run's dependency
--                             keys live as long (as in deliver.lua)
-- ARGV[7]  max_bytes          the most a released run's payload may hold with its
--                             dependencies' results (past it the run dies, saying so)
-- ARGV[8]  mark_ttl_ms        how long the commit's record lives (longer than any of the
--                             workflow's records)
-- Returns  {1, released}: committed here (now, or before by this attempt), with the runs
--          released that had dependencies (the 'released' counter; those that waited on
--          nothing but the commit count as created); {0, 'aborted'} in the home's partition
--          when the home run is not staged by this attempt and no commit is recorded (it was
--          aborted, flow_abort.lua: nothing was changed); {0, 'other'} there when another
--          attempt's commit is recorded (the workflow exists: this attempt's runs are to be
--          aborted). Refused whole (an error reply, nothing changed) when a field is
--          malformed, a key is not on this node or a key holds another type.
--
-- The runs of the workflow here are those of jq:{q#p}:flow:<flow_id> whose record says
-- 'staged' with this mark. One is released when it waits on nothing more ('left' 0, or no
-- 'left': it waited on nothing but the commit), or when a 'continue' released it early
-- ('ready', see deliver.lua): as deliver.lua releases, its payload built from its
-- dependencies' results when it receives them; past max_bytes it dies instead (and an order
-- '!<run_id>' goes to the outbox, as in deliver.lua). Those that died or were skipped meanwhile
-- only stop being staged.
-- Events (see event_log in lib/events.lua): 'ready' per run released, 'dead' per run that died.

local now = clock(ARGV[1])
local prefix, flow_id, staged, home = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local nonce = string.match(staged, '^%["[^"]*","[^"]*","(%w+)"%]$')
local mark_key = prefix .. 'flowmark:' .. flow_id

local ok, plan = reading(function()
  if not nonce then
    refuse('ERR jobqueue: flow_commit: staged is ["<queue>","<run_id>","<nonce>"]')
  end
  for a = 6, 8 do
    if not whole(ARGV[a], 0) then
      refuse('ERR jobqueue: flow_commit: dead_retention_ms, max_bytes and mark_ttl_ms are ' ..
             'whole numbers')
    end
  end
  local p = {runs = {}, log = event_log(prefix)}
  if home ~= '' then
    expect(mark_key, 'string')
    local mark = read('GET', mark_key)
    if mark and mark ~= nonce then
      p.refused = 'other'
      return p
    end
    local h = load_run(prefix .. 'run:' .. home, 'staged')
    if not mark and not (h and h.staged == staged) then
      p.refused = 'aborted'
      return p
    end
    p.record = not mark
  end
  expect(KEYS[1], 'zset')
  expect(KEYS[2], 'zset')
  expect(KEYS[6], 'zset')
  expect(KEYS[7], 'zset')
  expect(KEYS[8], 'zset')
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
if plan.refused then return {0, plan.refused} end

if plan.record then redis.call('SET', mark_key, nonce, 'PX', ARGV[8]) end
local dead_retention = tonumber(ARGV[6])
local released, died, due_pairs = 0, 0, {}
for _, w in ipairs(plan.runs) do
  redis.call('HDEL', w.key, 'staged', 'ready')
  redis.call('ZREM', KEYS[8], w.id)
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
