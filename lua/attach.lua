-- attach.lua: make existing runs of one partition dependencies of a new waiting run (a
-- workflow that depends on runs created before it).
--
-- uses: core, workflows
--
-- KEYS[1]  outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  parent             the waiting run as its dependencies name it: the JSON text
--                             ["<queue>","<run_id>"]
-- ARGV[4..] runs              the run ids to attach it to
-- Returns  one integer per run, in order: 1 when the waiting run will hear of it (attached
--          now or before), 0 when there is no such run here (or its record is not one).
--          Refused whole (an error reply, nothing changed) when the parent is not such a JSON
--          text, a key is not on this node or the outbox holds another type.
--
-- The parent goes into the run's 'parents' list (once). A run that already finished goes
-- (back) to the outbox and its record stops expiring until relayed (finish_record in
-- lib/workflows.lua): the waiting run hears of it as of any other.

local now = clock(ARGV[1])
local prefix, entry = ARGV[2], ARGV[3]
local FINISHED = {done = true, dead = true, cancelled = true}

local ok, plan = reading(function()
  if not string.match(entry, '^%["[^"\\]*","[^"\\]*"%]$') then
    refuse('ERR jobqueue: attach: the parent is ["queue","run_id"], not ' ..
           utf8_head(entry, 80))
  end
  expect(KEYS[1], 'zset')
  local p = {runs = {}}
  for i = 4, #ARGV do
    local id = ARGV[i]
    local run = load_run(prefix .. 'run:' .. id, 'state', 'parents', 'hist')
    local r = {id = id, ok = run ~= nil and run.state ~= nil}
    if r.ok then
      local parents = run.parents or ''
      if parents == '' then
        r.parents = '[' .. entry .. ']'
      elseif string.find(parents, entry, 1, true) then
        r.parents = parents
      elseif string.match(parents, '^%[.*%]$') then
        r.parents = string.sub(parents, 1, -2) .. ',' .. entry .. ']'
      else
        r.ok = false -- a list jobqueue did not write: not a run of ours to wait on
      end
      if r.ok and FINISHED[run.state] then
        r.out = outbox_entry(KEYS[1], {parents = r.parents}, id, now)
        r.hist = run.hist ~= nil and history_ok(prefix, id)
      end
    end
    p.runs[#p.runs + 1] = r
  end
  return p
end)
if not ok then return plan end

local out = {}
for _, r in ipairs(plan.runs) do
  if r.ok then
    redis.call('HSET', prefix .. 'run:' .. r.id, 'parents', r.parents)
    if r.out then
      redis.call('PERSIST', prefix .. 'run:' .. r.id)
      if r.hist then redis.call('PERSIST', prefix .. 'hist:' .. r.id) end
      to_outbox(r.out)
    end
  end
  out[#out + 1] = r.ok and 1 or 0
end
return out
