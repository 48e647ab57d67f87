-- flow_create.lua: create a workflow's runs of one partition, each with SET NX semantics on
-- its run id: the runs that wait on others ('waiting', with their dependencies), the others
-- pending.
--
-- uses: core, wake, records, sequence, events
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  waiting   zset    jq:{q#p}:waiting  run_id -> creation time: the waiting runs
-- KEYS[3]  wake      list    jq:{q#p}:wake     wakes idle workers
-- KEYS[4]  stats     hash    jq:{q#p}:stats    counters
-- KEYS[5]  seq       hash    jq:{q#p}:seq      {ms, n}: runs created in the current ms (their
--                                              order, see lib/sequence.lua)
-- KEYS[6]  flows     zset    jq:{q#p}:flows    flow_id -> creation time of its first run here
-- KEYS[7]  staged    zset    jq:{q#p}:staged   run_id -> creation time: the runs written
--                                              staged (the audit's index of them)
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  flow_at            when the flow was created (ms), for its flows index entry: ''
--                             for now (a run added to a flow later gives the flow's time)
-- ARGV[4]  staged             '' for runs made ready (or waiting) at once; else this creation's
--                             mark, the JSON text ["<home queue>","<home run>","<nonce>"] (the
--                             workflow's home run, where it is committed, and this attempt,
--                             see flow_commit.lua): every run created here is written 'waiting'
--                             and 'staged' with it, released only at the commit
-- ARGV[5]  mark               '' or '<ttl_ms> <nonce> <flow_id>': a creation made whole here
--                             (one call) records its commit, jq:{q#p}:flowmark:<flow_id> =
--                             nonce for ttl_ms, when it creates any run
-- ARGV[6..] nodes             13 fields per run, then 3 per dependency: run_id, task,
--                             payload (JSON), max_attempts, lease_ms, timeout_ms, parents
--                             (JSON list of [queue, run_id] of the runs waiting on this one,
--                             or ''), flow (the workflow's id), receives ('' | 'one' | 'all':
--                             the dependencies' results come first in its arguments),
--                             args_tail (the JSON text that follows those results in the
--                             payload, see deliver.lua), cancel_running ('1': a dependency's
--                             death cancels the running siblings too), on_death_only
--                             ('1': it runs only when a dependency died, see
--                             deliver.lua), n (its dependencies); then per dependency: run_id, policy
--                             ('fail' | 'ignore' | 'continue' | 'remove': what its death
--                             does, see deliver.lua), queue
-- Returns  {now, r1, r2, ...}: per run 1 = created, 0 = already exists (nothing written).
--          Refused whole (an error reply, nothing created) when a field is malformed, a key
--          is not on this node or a key holds another type; when a run that waits on others
--          (or any run, staged) exists already outside its workflow ('exists outside'); and,
--          staged, when a run of the workflow exists staged by another attempt ('another
--          attempt').
--
-- A run with dependencies is 'waiting': in the waiting zset, not in due (no worker claims it,
-- no cap counts it), its record's 'left' field the number of dependencies not yet heard of,
-- and jq:{q#p}:deps:<run_id> (hash: dependency -> '<index>|<policy>|<queue>') lists them
-- (the deps and got keys an earlier run of the same id left, which outlive its record, are
-- deleted first: the new run has heard of nothing).
-- Each run created with a flow id is listed in jq:{q#p}:flow:<flow_id> (a set), and the flow
-- in the flows index (at its first run here): `jobqueue flows` reads them, flow_tidy.lua
-- forgets them once every record expired.
-- deliver.lua moves it to due once 'left' is 0. A run without is pending, as create_run
-- makes it, unless staged: a workflow over several partitions is written staged everywhere
-- (no run of it can run), then committed by one write in its home's partition, then released
-- (flow_commit.lua); aborted instead (flow_abort.lua), it leaves nothing behind.
-- Events (see event_log in lib/events.lua): 'waiting' ('<task>') per run created waiting,
-- 'created' ('<due ms>|<task>') per run created pending.

local now = clock(ARGV[1])
local prefix = ARGV[2]
local flow_at = ARGV[3] == '' and now or tonumber(ARGV[3])
local staged = ARGV[4] ~= '' and ARGV[4] or nil
local mark_ttl, mark_nonce, mark_flow = string.match(ARGV[5], '^(%d+) (%w+) (.+)$')
local FIXED, FIRST = 13, 6
local POLICIES = {fail = true, ignore = true, continue = true, remove = true, skip = true}
local RECEIVES = {[''] = true, one = true, all = true}

local ok, plan = reading(function()
  local p = {nodes = {}}
  expect(KEYS[1], 'zset')
  expect(KEYS[2], 'zset')
  expect(KEYS[6], 'zset')
  if staged then expect(KEYS[7], 'zset') end
  p.flows, p.members = {}, {} -- the flow ids in order; flow id -> its new runs here
  p.wake = waker(KEYS[3])
  p.stats = counters(KEYS[4], 'created')
  p.seq = sequencer(KEYS[5], now)
  p.log = event_log(prefix)
  if ARGV[3] ~= '' and not whole(ARGV[3], 0) then
    refuse('ERR jobqueue: flow_create: flow_at is a time in ms or empty')
  end
  if staged and not string.match(staged, '^%["[^"]*","[^"]*","%w+"%]$') then
    refuse('ERR jobqueue: flow_create: staged is empty or ["<queue>","<run_id>","<nonce>"]')
  end
  if ARGV[5] ~= '' and not mark_ttl then
    refuse("ERR jobqueue: flow_create: mark is empty or '<ttl_ms> <nonce> <flow_id>'")
  end
  if mark_ttl then expect(prefix .. 'flowmark:' .. mark_flow, 'string') end
  local i, seen = FIRST, {}
  while i <= #ARGV do
    local n = ARGV[i + 12]
    if not (n and count(n, 0) and tonumber(n) <= 100000) or i + FIXED - 1 + 3 * n > #ARGV then
      refuse('ERR jobqueue: flow_create: a malformed node at ARGV[' .. i .. ']')
    end
    for _, a in ipairs({3, 4, 5}) do
      if not count(ARGV[i + a], 0) then
        refuse('ERR jobqueue: flow_create: max_attempts, lease_ms and timeout_ms are counts')
      end
    end
    if not RECEIVES[ARGV[i + 8]] then
      refuse('ERR jobqueue: flow_create: receives is one, all or empty')
    end
    local node = {at = i, id = ARGV[i], deps = tonumber(n), left = 0}
    local named = {}
    for d = 0, node.deps - 1 do
      if not POLICIES[ARGV[i + FIXED + 3 * d + 1]] then
        refuse('ERR jobqueue: flow_create: a dependency policy is fail, ignore, continue, ' ..
               'remove or skip')
      end
      -- The same dependency named twice counts once.
      local dep = ARGV[i + FIXED + 3 * d]
      if not named[dep] then named[dep], node.left = true, node.left + 1 end
    end
    node.exists = seen[node.id] or read('EXISTS', prefix .. 'run:' .. node.id) == 1
    seen[node.id] = true
    local flow = ARGV[i + 7]
    if node.exists and (node.deps > 0 or staged) and flow ~= '' then
      -- A waiting step must be a new run (an existing one would never wait); staged, none
      -- of the workflow's runs may be another attempt's (two creations of one workflow at once)
      local other = load_run(prefix .. 'run:' .. node.id, 'flow', 'staged') or {}
      if other.flow ~= flow and node.deps > 0 then
        refuse('ERR jobqueue: flow_create: run ' .. node.id .. ' exists outside the ' ..
               'workflow; a step that waits on others must be a new run; nothing was written')
      end
      if staged and other.flow == flow and other.staged and other.staged ~= staged then
        refuse('ERR jobqueue: flow_create: run ' .. node.id .. ' is staged by another ' ..
               'attempt to create the workflow; nothing was written')
      end
    end
    if not node.exists and flow ~= '' then
      if not p.members[flow] then
        expect(prefix .. 'flow:' .. flow, 'set')
        p.members[flow] = {}
        p.flows[#p.flows + 1] = flow
      end
      local members = p.members[flow]
      members[#members + 1] = node.id
    end
    if not node.exists and node.deps > 0 then
      expect(prefix .. 'deps:' .. node.id, 'hash')
      expect(prefix .. 'got:' .. node.id, 'hash')
    end
    p.nodes[#p.nodes + 1] = node
    i = i + FIXED + 3 * node.deps
  end
  return p
end)
if not ok then return plan end

local out = {now}
local due_pairs, created, made = {}, 0, 0
for _, node in ipairs(plan.nodes) do
  if node.exists then
    out[#out + 1] = 0
  else
    local a = node.at
    local key = prefix .. 'run:' .. node.id
    write_pending(key, now, now, ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4],
                  ARGV[a + 5], '', '')
    if ARGV[a + 7] ~= '' then redis.call('HSET', key, 'flow', ARGV[a + 7]) end
    if ARGV[a + 6] ~= '' then redis.call('HSET', key, 'parents', ARGV[a + 6]) end
    if staged then
      redis.call('HSET', key, 'staged', staged)
      redis.call('ZADD', KEYS[7], now, node.id)
    end
    if node.deps > 0 or staged then
      local deps = {}
      for d = 0, node.deps - 1 do
        local at = a + FIXED + 3 * d
        deps[#deps + 1] = ARGV[at]
        deps[#deps + 1] = d .. '|' .. ARGV[at + 1] .. '|' .. ARGV[at + 2]
      end
      -- Keys left by an earlier run of the same id (they outlive its record): a new waiting
      -- run starts with nothing heard of.
      redis.call('DEL', prefix .. 'deps:' .. node.id, prefix .. 'got:' .. node.id)
      bulk('HSET', prefix .. 'deps:' .. node.id, deps, 2000)
      -- deps_n: the indexes used (a dependency named twice takes two): extend.lua goes on
      -- (a staged run that waits on nothing but its commit has neither: no dependencies)
      redis.call('HSET', key, 'state', 'waiting')
      if node.deps > 0 then redis.call('HSET', key, 'left', node.left, 'deps_n', node.deps) end
      redis.call('HDEL', key, 'due')
      if ARGV[a + 8] ~= '' then
        redis.call('HSET', key, 'receives', ARGV[a + 8], 'args_tail', ARGV[a + 9])
      end
      if ARGV[a + 10] == '1' then redis.call('HSET', key, 'cancel_running', 1) end
      if ARGV[a + 11] == '1' then redis.call('HSET', key, 'on_death_only', 1) end
      redis.call('ZADD', KEYS[2], now, node.id)
      emit(plan.log, 'waiting', node.id, ARGV[a + 1])
    else
      created = created + 1
      due_pairs[#due_pairs + 1] = due_score(now, next_slot(plan.seq))
      due_pairs[#due_pairs + 1] = node.id
      emit(plan.log, 'created', node.id, int(now) .. '|' .. ARGV[a + 1])
    end
    out[#out + 1] = 1
    made = made + 1
  end
end
if created > 0 then
  bulk('ZADD', KEYS[1], due_pairs, 2000)
  save_sequence(plan.seq)
  wake(plan.wake, created)
end
for _, flow in ipairs(plan.flows) do
  redis.call('ZADD', KEYS[6], 'NX', flow_at, flow)
  bulk('SADD', prefix .. 'flow:' .. flow, plan.members[flow], 2000)
end
if mark_ttl and made > 0 then
  redis.call('SET', prefix .. 'flowmark:' .. mark_flow, mark_nonce, 'PX', mark_ttl)
end
bump(plan.stats, 'created', made)
trim_events(plan.log)
return out
