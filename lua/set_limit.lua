-- set_limit.lua: set or remove one flow limit of one partition of a queue (set_queue_limit
-- calls it on every partition).
--
-- KEYS[1]  limits    hash    jq:{q#p}:limits   the partition's flow limits
-- KEYS[2]  wake      list    jq:{q#p}:wake     wake tokens for idle workers
-- ARGV[1]  now                now ms, or '' for the server clock (read first, as every
--                             script does; nothing here depends on it)
-- ARGV[2]  prefix             key prefix jq:{q#p}: (unused: the keys are given)
-- ARGV[3]  name               the limit: 'concurrency' (the most runs running at once)
-- ARGV[4]  value              a whole number from 0, or '' to remove the limit
-- Returns  1 when this call changed the limit, 0 when it already was so. Refused whole (an
--          error reply, nothing changed) when a key is not on this node, the limits key holds
--          another type, or the name or value is not one of the above.
--
-- A limit raised or removed fills the wake list: idle workers claim at once.

local _ = clock(ARGV[1])
local name, value = ARGV[3], ARGV[4]
local limits_key, wake_key = KEYS[1], KEYS[2]
local NAMES = {concurrency = true}

local ok, plan = reading(function()
  if not NAMES[name] then refuse('ERR jobqueue: no limit named ' .. tostring(name)) end
  if value ~= '' and not whole(value, 0) then
    refuse('ERR jobqueue: a limit is a whole number from 0, not ' .. tostring(value))
  end
  return {old = read('HGET', limits_key, name), waker = waker(wake_key)}
end)
if not ok then return plan end

local new = value ~= '' and int(tonumber(value)) or nil
if plan.old == (new or false) then return 0 end
-- A limit field that is not a whole number counted as no limit (claim.lua): only raising or
-- removing a real limit makes room.
local old = whole(plan.old, 0) and tonumber(plan.old) or nil
if new == nil then
  redis.call('HDEL', limits_key, name)
else
  redis.call('HSET', limits_key, name, new)
end
if old ~= nil and (new == nil or tonumber(new) > old) then wake(plan.waker, WAKE_TOKENS) end
return 1
