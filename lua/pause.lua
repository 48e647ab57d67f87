-- pause.lua: pause or resume one partition of a queue (pause_queue calls it on every one).
--
-- uses: core, wake
--
-- KEYS[1]  paused    string  jq:{q#p}:paused   when the queue was paused (ms); absent while
--                                              it runs
-- KEYS[2]  wake      list    jq:{q#p}:wake     wake tokens for idle workers
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}: (unused: the keys are given)
-- ARGV[3]  action             'pause' or 'resume'
-- Returns  1 when this call changed the partition (paused a running one, or resumed a paused
--          one), 0 when it already was so. Refused whole (an error reply, nothing changed)
--          when a key is not on this node, the paused key holds another type, or the action
--          is neither.
--
-- While paused, claim takes nothing from the partition (enqueues, heartbeats and commits go
-- on). Resuming fills the wake list, so idle workers claim at once instead of at their next
-- poll.

local now = clock(ARGV[1])
local action = ARGV[3]
local paused_key, wake_key = KEYS[1], KEYS[2]

local ok, plan = reading(function()
  if action ~= 'pause' and action ~= 'resume' then
    refuse('ERR jobqueue: pause action must be pause or resume, not ' .. tostring(action))
  end
  return {paused = read('GET', paused_key) ~= false, waker = waker(wake_key)}
end)
if not ok then return plan end

if action == 'pause' then
  if plan.paused then return 0 end
  redis.call('SET', paused_key, now)
  return 1
end
if not plan.paused then return 0 end
redis.call('DEL', paused_key)
wake(plan.waker, WAKE_TOKENS)
return 1
