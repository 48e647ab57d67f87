-- global_limit.lua: set or remove one exact limit of a queue: one that holds across all its
-- partitions and masters, through permits in the limit's own slot (permit_take.lua).
--
-- uses: core
--
-- KEYS[1]  limits    hash    jq:{q#exact}:limits   concurrency = C, rate = 'N W'
-- ARGV[1]  now                now ms, or '' for the server clock (read first; unused)
-- ARGV[2]  name               'concurrency' (the most runs running at once in the whole
--                             queue) or 'rate' (at most N claims in any W ms)
-- ARGV[3]  value              concurrency: a whole number from 0; rate: 'N W', N from 0 and
--                             W from 1; or '' to remove the limit
-- Returns  1 when this call changed the limit, 0 when it already was so. Refused whole (an
--          error reply, nothing changed) when the key holds another type or the name or value
--          is not one of the above.
--
-- Workers look at a queue's exact limits when they start and every few seconds after
-- (jobqueue.worker.claiming): a limit set or removed takes effect within that.

local now = clock(ARGV[1])
local name, value = ARGV[2], ARGV[3]

local ok, plan = reading(function()
  if name == 'concurrency' then
    if value ~= '' and not count(value, 0) then
      refuse('ERR jobqueue: an exact concurrency limit must be a whole number')
    end
  elseif name == 'rate' then
    local n, w = string.match(value, '^(%d+) (%d+)$')
    if value ~= '' and not (count(n, 0) and count(w, 1)) then
      refuse("ERR jobqueue: an exact rate must be 'N W' (N claims in W ms)")
    end
  else
    refuse('ERR jobqueue: an exact limit is concurrency or rate, not ' .. utf8_head(name, 40))
  end
  return {was = read('HGET', KEYS[1], name)}
end)
if not ok then return plan end

if value == '' then
  if plan.was == false then return 0 end
  redis.call('HDEL', KEYS[1], name)
  return 1
end
if plan.was == value then return 0 end
redis.call('HSET', KEYS[1], name, value)
return 1
