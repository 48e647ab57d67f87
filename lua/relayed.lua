-- relayed.lua: outbox entries the relay has delivered: remove each (if it is still the
-- version the relay read) and let the finished record expire at last.
--
-- uses: core, records
--
-- KEYS[1]  outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear, and
--                                              '!<run_id>' orders to cancel a dead or
--                                              cancelled waiting run's dependencies
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  retention_ms       how long done and cancelled records live
-- ARGV[4]  dead_retention_ms  how long dead records live (and a waiting run's dependency
--                             keys, after its order was carried out)
-- ARGV[5..] entries           3 fields each: member, the version (score) the relay read,
--                             and the length in bytes of the record's 'parents' it
--                             delivered to ('' for an order, or not to check)
-- Returns  the number of entries removed. An entry whose version changed since it was read
--          (a parent attached meanwhile, see attach.lua) stays for the next relay, and so
--          does one whose record's 'parents' changed (an entry written again within the same
--          millisecond has the version read: a parent attached meanwhile has not heard).
--          Refused
--          whole (an error reply, nothing changed) when a number is malformed, a key is not
--          on this node or the outbox holds another type.

local now = clock(ARGV[1])
local prefix = ARGV[2]
local retention, dead_retention = tonumber(ARGV[3]), tonumber(ARGV[4])

local ok, plan = reading(function()
  if not whole(ARGV[3], 0) or not whole(ARGV[4], 0) or (#ARGV - 4) % 3 ~= 0 then
    refuse('ERR jobqueue: relayed: retentions are whole ms, entries come in threes')
  end
  expect(KEYS[1], 'zset')
  local p = {}
  for i = 5, #ARGV, 3 do
    local member, told = ARGV[i], ARGV[i + 2]
    if told ~= '' and not whole(told, 0) then
      refuse('ERR jobqueue: relayed: a parents length is a whole number or empty')
    end
    local at = read('ZSCORE', KEYS[1], member)
    if at and tonumber(at) == tonumber(ARGV[i + 1]) then
      local e = {member = member}
      if string.sub(member, 1, 1) == '!' then
        e.order = string.sub(member, 2)
      else
        local run = load_run(prefix .. 'run:' .. member, 'state', 'hist', 'parents')
        if run and told ~= '' and #(run.parents or '') ~= tonumber(told) then
          e = nil -- parents attached since it was read: they have not heard
        elseif run and (run.state == 'done' or run.state == 'cancelled') then
          e.retention = retention
        elseif run and run.state == 'dead' then
          e.retention = dead_retention
        end
        if e then e.hist = e.retention and run.hist ~= nil and history_ok(prefix, member) end
      end
      p[#p + 1] = e
    end
  end
  return p
end)
if not ok then return plan end

for _, e in ipairs(plan) do
  redis.call('ZREM', KEYS[1], e.member)
  if e.order then
    if dead_retention > 0 then
      redis.call('PEXPIRE', prefix .. 'deps:' .. e.order, dead_retention)
      redis.call('PEXPIRE', prefix .. 'got:' .. e.order, dead_retention)
    end
  elseif e.retention then
    expire_record(prefix, e.member, e.retention, e.hist)
  end
end
return #plan
