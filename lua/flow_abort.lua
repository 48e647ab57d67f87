-- flow_abort.lua: undo an attempt to create a workflow in one partition: its runs here still
-- staged by that attempt (flow_create.lua; never released, so none of them ever ran) are
-- deleted. Called first in the partition of the workflow's home run, where the abort is
-- decided (the attempt's home run goes: its commit, flow_commit.lua, can no longer happen),
-- then in its other partitions.
--
-- uses: core, events
--
-- KEYS[1]  waiting   zset    jq:{q#p}:waiting  run_id -> creation time: the waiting runs
-- KEYS[2]  flows     zset    jq:{q#p}:flows    flow_id -> creation time of its first run here
-- KEYS[3]  dead      zset    jq:{q#p}:dead     run_id -> time it died
-- KEYS[4]  done      zset    jq:{q#p}:done     run_id -> finish time (done and cancelled)
-- KEYS[5]  outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear, and
--                                              '!<run_id>' orders
-- KEYS[6]  staged    zset    jq:{q#p}:staged   the runs written staged, not settled yet
-- ARGV[1]  now                now ms, or '' for the server clock (read first, as every
--                             script does; nothing here depends on it)
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  flow_id            the workflow
-- ARGV[4]  staged             the attempt's mark, as its runs' 'staged' field holds it: the JSON
--                             text ["<home queue>","<home run>","<nonce>"]
-- ARGV[5]  home_run           the home run's id when this is its partition, else ''
-- Returns  {1, removed}: the attempt's staged runs deleted here; {0, 'committed'} in the
--          home's partition when this attempt's commit is recorded (jq:{q#p}:flowmark:
--          <flow_id>; nothing was changed: the workflow exists, and its other partitions are
--          to be committed instead). Refused whole (an error reply, nothing changed) when the
--          mark is malformed, a key is not on this node or a key holds another type.
--
-- A staged run may have died or been cancelled before the abort (a dependency created
-- before the workflow died, see deliver.lua): it goes all the same, with its index and
-- outbox entries. A run of the flow that is not staged by this attempt (shared with another
-- workflow, created before, or another attempt's) stays. Once no run of the flow is left here, the flow leaves
-- the flows index.
-- Events (see event_log in lib/events.lua): 'purged' per run deleted.

local _ = clock(ARGV[1])
local prefix, flow_id, staged, home = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local nonce = string.match(staged, '^%["[^"]*","[^"]*","(%w+)"%]$')

local ok, plan = reading(function()
  if not nonce then
    refuse('ERR jobqueue: flow_abort: staged is ["<queue>","<run_id>","<nonce>"]')
  end
  local p = {ids = {}, log = event_log(prefix)}
  if home ~= '' then
    local mark_key = prefix .. 'flowmark:' .. flow_id
    expect(mark_key, 'string')
    if read('GET', mark_key) == nonce then
      p.committed = true
      return p
    end
  end
  for i = 1, 6 do expect(KEYS[i], 'zset') end
  p.members_key = prefix .. 'flow:' .. flow_id
  expect(p.members_key, 'set')
  for _, id in ipairs(read('SMEMBERS', p.members_key)) do
    local run = load_run(prefix .. 'run:' .. id, 'staged')
    if run and run.staged == staged then
      if not history_ok(prefix, id) then
        refuse('ERR jobqueue: ' .. prefix .. 'hist:' .. id .. ' holds foreign data; ' ..
               'nothing was changed (see jobqueue check)')
      end
      p.ids[#p.ids + 1] = id
    end
  end
  p.left = read('SCARD', p.members_key) - #p.ids
  return p
end)
if not ok then return plan end
if plan.committed then return {0, 'committed'} end

for _, id in ipairs(plan.ids) do
  redis.call('DEL', prefix .. 'run:' .. id, prefix .. 'hist:' .. id, prefix .. 'deps:' .. id,
             prefix .. 'got:' .. id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZREM', KEYS[5], id, '!' .. id)
  redis.call('ZREM', KEYS[6], id)
  redis.call('SREM', plan.members_key, id)
  emit(plan.log, 'purged', id, '')
end
if plan.left == 0 then
  redis.call('DEL', plan.members_key)
  redis.call('ZREM', KEYS[2], flow_id)
end
trim_events(plan.log)
return {1, #plan.ids}
