-- flow_tidy.lua: forget the flows of one partition whose run records have all expired (the
-- flows index and each flow's set of run ids, see flow_create.lua), a few entries per call,
-- going round the index.
--
-- uses: core
--
-- KEYS[1]  flows     zset    jq:{q#p}:flows         flow_id -> creation time of its first run
-- KEYS[2]  flows_tidy hash   jq:{q#p}:flows_tidy    '' -> the rank in flows to go on from;
--                                                    flow_id -> a run of it found alive
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  n                  how many index entries to look at (1 to 1000)
-- Returns  {looked at, forgotten}. Refused whole (an error reply, nothing changed) when n is
--          not such a count, a key is not on this node or KEYS hold another type.
--
-- A flow is forgotten only when no record of its runs here exists: a record expires only
-- after its run finished (its retention, or once relayed), so a flow with a waiting, pending
-- or running run here is never forgotten. The run found alive last time (the witness)
-- answers for a live flow; else its run ids are looked at until one is alive (it becomes
-- the witness), all of them before the flow is forgotten: a big flow with one run left (a
-- dead child kept 7 days among siblings expired after a day) is scanned once, not at every
-- call. A flow's set holding another type is left
-- alone (jobqueue check and `jobqueue flows` report it).

local now = clock(ARGV[1])
local prefix = ARGV[2]

local ok, plan = reading(function()
  if not count(ARGV[3], 1) or tonumber(ARGV[3]) > 1000 then
    refuse('ERR jobqueue: flow_tidy: n is a count from 1 to 1000')
  end
  expect(KEYS[1], 'zset')
  expect(KEYS[2], 'hash')
  local n = tonumber(ARGV[3])
  local p = {gone = {}, looked = 0, witnesses = {}}
  local rank = whole_or(read('HGET', KEYS[2], ''), 0, 0)
  local flows = read('ZRANGE', KEYS[1], rank, rank + n - 1)
  if #flows == 0 and rank > 0 then
    rank = 0
    flows = read('ZRANGE', KEYS[1], 0, n - 1)
  end
  for _, flow in ipairs(flows) do
    local key = prefix .. 'flow:' .. flow
    local t = read('TYPE', key)
    t = type(t) == 'table' and t.ok or t
    if t == 'set' or t == 'none' then
      local alive = false
      local witness = read('HGET', KEYS[2], flow)
      if witness and read('EXISTS', prefix .. 'run:' .. witness) == 1 then alive = true end
      if not alive and t == 'set' then
        for _, id in ipairs(read('SMEMBERS', key)) do
          if read('EXISTS', prefix .. 'run:' .. id) == 1 then
            alive = true
            p.witnesses[#p.witnesses + 1] = flow
            p.witnesses[#p.witnesses + 1] = id
            break
          end
        end
      end
      if not alive then p.gone[#p.gone + 1] = flow end
    end
  end
  p.looked = #flows
  p.next = rank + #flows - #p.gone
  return p
end)
if not ok then return plan end

for _, flow in ipairs(plan.gone) do
  redis.call('ZREM', KEYS[1], flow)
  redis.call('HDEL', KEYS[2], flow)
  redis.call('DEL', prefix .. 'flow:' .. flow)
end
redis.call('HSET', KEYS[2], '', int(plan.next), unpack(plan.witnesses))
return {plan.looked, #plan.gone}
