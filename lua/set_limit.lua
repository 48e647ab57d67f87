-- set_limit.lua: set or remove one flow limit of one partition of a queue (set_queue_limit
-- calls it on every partition).
--
-- uses: core, wake, priority, slots
--
-- KEYS[1]  limits    hash    jq:{q#p}:limits   the partition's flow limits
-- KEYS[2]  wake      list    jq:{q#p}:wake     wake tokens for idle workers
-- KEYS[3]  due       zset    jq:{q#p}:due      run_id -> due time (ms): parked runs go back
--                                              here at their due time when a cap is raised
-- KEYS[4]  parked    zset    jq:{q#p}:parked   run_id -> original due time: the runs
--                                              parked by a per-key or per-task cap
-- ARGV[1]  now                now ms, or '' for the server clock (read first, as every
--                             script does; nothing here depends on it)
-- ARGV[2]  prefix             key prefix jq:{q#p}: (the parked runs' records and groups)
-- ARGV[3]  name               the limit: 'concurrency' (the most runs running at once),
--                             'rate' (at most N claims in any W ms), 'key_concurrency' (the
--                             most runs of one limit_key running at once), 'key_rate' (at
--                             most N claims of one limit_key in any W ms) or 'task:<name>'
--                             (the most runs of task <name> running at once)
-- ARGV[4]  value              concurrency: a whole number from 0; rate and key_rate: 'N W',
--                             N from 0 and W from 1; key_concurrency and task:<name>: a whole
--                             number from 0 to 10000; or '' to remove the limit
-- Returns  1 when this call changed the limit, 0 when it already was so. Refused whole (an
--          error reply, nothing changed) when a key is not on this node, the limits key holds
--          another type, or the name or value is not one of the above.
--
-- A concurrency limit raised, or any limit removed or a rate changed, fills the wake list:
-- idle workers claim at once. A per-key or per-task cap raised or removed also puts the runs
-- it parked (claim.lua) back at their original due time, for claim to look at again, with
-- their priority hint in jq:{q#p}:prio (reached by the prefix; another type there refuses the
-- call whole). It looks at the 1,000 oldest entries of one index per call: for a task cap,
-- that task's jq:{q#p}:parked:task:<name>; for key_concurrency, the partition-wide parked
-- index (runs parked by a task cap among them take up that look too). The rest wait for a
-- freed slot or their fallback recheck. The field task_caps counts the task:<name> fields,
-- so that claim reads no task cap in a queue without one.

local _ = clock(ARGV[1])
local name, value = ARGV[3], ARGV[4]
local limits_key, wake_key = KEYS[1], KEYS[2]
local NAMES = {concurrency = true, rate = true, key_concurrency = true, key_rate = true}
local is_task = type(name) == 'string' and string.sub(name, 1, 5) == 'task:' and #name > 5
local capped = name == 'key_concurrency' or is_task
local prefix = ARGV[2]
local UNPARK_MAX = 1000

local ok, plan = reading(function()
  if not NAMES[name] and not is_task then
    refuse('ERR jobqueue: no limit named ' .. tostring(name))
  end
  if value ~= '' and name == 'concurrency' and not whole(value, 0) then
    refuse('ERR jobqueue: a limit is a whole number from 0, not ' .. tostring(value))
  end
  if value ~= '' and capped and not (whole(value, 0) and tonumber(value) <= SLOT_CAP_MAX) then
    refuse('ERR jobqueue: a cap is a whole number from 0 to ' .. SLOT_CAP_MAX .. ', not ' ..
           tostring(value))
  end
  local new = nil
  if value ~= '' and (name == 'rate' or name == 'key_rate') then
    local n, w = string.match(value, '^(%d+) (%d+)$')
    if not (whole(n, 0) and whole(w, 1)) then
      refuse("ERR jobqueue: a rate is 'N W' (N claims in W ms), not " .. tostring(value))
    end
    -- Stored in the plain form claim.lua and the Python side read (count()): '+ 0' turns a
    -- '-0' into 0.
    new = int(tonumber(n) + 0) .. ' ' .. int(tonumber(w))
  elseif value ~= '' then
    new = int(tonumber(value) + 0)
  end
  local p = {old = read('HGET', limits_key, name), waker = waker(wake_key), new = new,
             unpark = {}, groups = {}}
  local old = count(p.old, 0) and tonumber(p.old) or nil
  if capped and old ~= nil and (new == nil or tonumber(new) > old) then
    -- Raised or removed: the runs it parked go back to their due time.
    expect(KEYS[3], 'zset')
    -- A task cap's runs wait in their own group's index; a key cap's in many.
    expect(KEYS[4], 'zset')
    local index = is_task and prefix .. 'parked:' .. name or KEYS[4]
    local entries = read('ZRANGE', index, 0, UNPARK_MAX - 1)
    for _, id in ipairs(entries) do
      local r = load_run(prefix .. 'run:' .. id, 'state', 'parked', 'due', 'priority')
      local g = r and r.state == 'pending' and r.parked
      local mine = g and (g == name or (name == 'key_concurrency' and
                                        string.sub(g, 1, 4) == 'key:'))
      if mine and read('ZSCORE', KEYS[3], id) then
        local gkey = prefix .. 'parked:' .. g
        if not p.groups[gkey] then
          expect(gkey, 'zset')
          p.groups[gkey] = {}
        end
        table.insert(p.groups[gkey], id)
        local level = priority_of(r.priority)
        if level > 0 then expect(prefix .. 'prio', 'zset') end
        p.unpark[#p.unpark + 1] = {id = id, due = whole_or(r.due, 0, 0), level = level}
      end
    end
  end
  if is_task then
    -- task_caps after this call: the task:<name> fields counted.
    local n = 0
    for _, field in ipairs(read('HKEYS', limits_key)) do
      if string.sub(field, 1, 5) == 'task:' and field ~= name then n = n + 1 end
    end
    if new ~= nil then n = n + 1 end
    p.task_caps = n
  end
  return p
end)
if not ok then return plan end

local new = plan.new
if plan.old == (new or false) then return 0 end
-- A limit field that is not a whole number counted as no limit (claim.lua): only raising or
-- removing a real limit makes room.
local old = count(plan.old, 0) and tonumber(plan.old) or nil
if new == nil then
  redis.call('HDEL', limits_key, name)
else
  redis.call('HSET', limits_key, name, new)
end
for _, u in ipairs(plan.unpark) do unpark(prefix, KEYS[3], u) end
for gkey, ids in pairs(plan.groups) do bulk('ZREM', gkey, ids, 1000) end
if #plan.unpark > 0 then
  local ids = {}
  for _, u in ipairs(plan.unpark) do ids[#ids + 1] = u.id end
  bulk('ZREM', KEYS[4], ids, 1000)
end
if plan.task_caps then
  if plan.task_caps > 0 then
    redis.call('HSET', limits_key, 'task_caps', plan.task_caps)
  else
    redis.call('HDEL', limits_key, 'task_caps')
  end
end
if name == 'rate' or name == 'key_rate' then
  if plan.old then wake(plan.waker, WAKE_TOKENS) end
elseif old ~= nil and (new == nil or tonumber(new) > old) then
  wake(plan.waker, WAKE_TOKENS)
end
return 1
